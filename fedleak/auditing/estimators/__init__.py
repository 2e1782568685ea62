"""ε lower-bound estimators of the audit game.

Clopper–Pearson, Gaussian DP, one run, one shot, the subsampled Gaussian, and the tests of the
declared mechanism.
"""
