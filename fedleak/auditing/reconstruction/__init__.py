"""Reconstruction bounds: the most any attack can succeed against a DP mechanism, the Fisher-
information ceiling, and the prior's baseline κ.
"""
