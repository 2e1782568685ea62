"""Malicious-server attacks: the server crafts the parameters it sends (trap weights, fishing,
label flipping) or the architecture the user runs (imprint).
"""
