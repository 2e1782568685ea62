"""Tests of the Cocktail Party Attack."""
