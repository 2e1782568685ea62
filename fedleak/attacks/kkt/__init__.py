"""Training-set reconstruction from a released model: the KKT attack of Haim et al. (NeurIPS
2022)."""
