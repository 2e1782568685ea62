"""Malicious-server attacks: the server crafts what the user runs.

The parameters it sends (trap weights, fishing, label flipping) or the architecture the user
runs (imprint).
"""
