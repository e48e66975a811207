"""Training, and the scoring and generation it runs too: why one folder, docs/extending.md."""
