"""Training, and the scoring and generation it runs too: why one folder, README.md's Layout."""
