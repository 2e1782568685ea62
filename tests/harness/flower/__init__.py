"""Tests of the Flower bridge."""
