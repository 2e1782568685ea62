"""Tests of the CLI's own options."""
