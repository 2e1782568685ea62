"""The Cocktail Party Attack (Kariyappa et al., ICML 2023).

Blind source separation of a linear layer's aggregated gradient, and feature inversion beyond
it.
"""
