"""Tests of the ReLU solving the exact attacks share."""
