"""Tests of fedleak.harness, a folder per room."""
