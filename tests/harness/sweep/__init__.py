"""Tests of sweeps, their store and their reports."""
