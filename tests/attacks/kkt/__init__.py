"""Tests of the KKT training-set reconstruction."""
