"""DAGER (Petrov et al., NeurIPS 2024).

Exact text from a transformer's gradient by span checks of its first layers.
"""
