"""Exact and closed-form attacks of an honest server.

The analytic inversion of a biased linear layer, SPEAR, the Cocktail Party Attack, and the ReLU
solving they share.
"""
