"""Tests of fedleak.defenses."""
