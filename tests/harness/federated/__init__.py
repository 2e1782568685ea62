"""Tests of the FL protocol and the user's local update."""
