"""The attacker process (``fedleak attack``): the honest-but-curious server's client of a
victim, the attack runs of both threat models, and the secure-aggregation server role.

It may import ``wire``, ``federated``, ``metrics``, ``zoo``, ``attacks`` and ``defenses``; never
the victim.
"""
