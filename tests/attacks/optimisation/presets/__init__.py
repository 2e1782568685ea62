"""Tests of the named optimisation presets (Inverting Gradients, DLG, Qian & Hansen)."""
