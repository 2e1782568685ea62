"""Tests of the model zoo and the data sets."""
