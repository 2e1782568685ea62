"""Exact inputs of a linear layer followed by ReLU, from the low rank and the sparsity of its
gradient (Dimitrov et al. 2024; Kariyappa et al. 2023, extended).
"""
