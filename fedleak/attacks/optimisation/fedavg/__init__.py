"""Inverting FedAvg updates: local epochs unrolled, a shuffled visiting order modelled.

Inverting FedAvg updates: the user's local epochs unrolled (Geiping et al. 2020, Sec. 6), the
visiting order modelled when it was shuffled (Dimitrov et al. 2022).
"""
