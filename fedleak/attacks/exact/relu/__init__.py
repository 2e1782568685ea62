"""Exact inputs of a linear layer followed by ReLU, from its gradient's low rank and sparsity.

Dimitrov et al. 2024 (SPEAR); Kariyappa et al. 2023, extended.
"""
