"""Training-set reconstruction from a released model.

The KKT attack of Haim et al. (NeurIPS 2022).
"""
