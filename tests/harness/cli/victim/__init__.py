"""Tests of `fedleak victim serve`: its options by concern and the settings they describe."""
