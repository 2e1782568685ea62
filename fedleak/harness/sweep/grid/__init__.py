"""A sweep spec (TOML) and the grid of typed points it expands to, each axis checked against its
registry.
"""
