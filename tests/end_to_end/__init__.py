"""End-to-end tests: the CLI as a user runs it, from set-up to report."""
