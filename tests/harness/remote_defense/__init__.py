"""Tests of the out-of-process defense link."""
