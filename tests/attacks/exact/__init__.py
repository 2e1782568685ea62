"""Tests of the exact attacks: analytic, SPEAR, the Cocktail Party Attack and the ReLU solving."""
