"""Tests of the attacker process."""
