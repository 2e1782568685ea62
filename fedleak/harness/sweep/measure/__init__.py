"""Measuring one sweep point: its leakage, its utility and its audit, wherever it runs."""
