"""Training, and the scoring and generation it also runs: why they share a folder, README.md, Layout."""
