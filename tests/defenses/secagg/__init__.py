"""Tests of secure aggregation."""
