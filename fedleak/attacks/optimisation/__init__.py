"""Optimisation attacks (Geiping et al. 2020, eq. (1)).

An objective, priors, an optimiser and the replay of the user's update, each a registered part; the
named attacks are presets of one composed engine.
"""
