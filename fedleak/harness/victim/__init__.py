"""The victim process (``fedleak victim serve``): the federated user, its gRPC service, its
scoring of reconstructions, its model release and its secure-aggregation users.

It may import ``wire``, ``shared``, ``attacks`` and ``defenses``; never the attacker.
"""
