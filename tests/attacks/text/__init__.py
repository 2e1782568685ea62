"""Tests of the text attacks."""
