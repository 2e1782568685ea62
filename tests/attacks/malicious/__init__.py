"""Tests of the malicious-server attacks."""
