"""Tests of the victim process."""
