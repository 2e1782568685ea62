"""Tests of the optimisation attacks: the composed engine, its parts, restarts and presets."""
