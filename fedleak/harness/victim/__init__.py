"""The victim process (``fedleak victim serve``): the federated user, its gRPC service, its
scoring of reconstructions, its model release and its secure-aggregation users.

It may import ``wire``, ``federated``, ``metrics``, ``zoo``, ``attacks`` and ``defenses``; never
the attacker.
"""
