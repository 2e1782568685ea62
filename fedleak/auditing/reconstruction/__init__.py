"""Reconstruction bounds: DP success, the Fisher-information ceiling, the prior's κ.

Reconstruction bounds: the most any attack can succeed against a DP mechanism, the Fisher-
information ceiling, and the prior's baseline κ.
"""
