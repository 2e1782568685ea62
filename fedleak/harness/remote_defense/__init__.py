"""Defenses out of process: the victim's ``remote`` link (the gRPC client of
``fedleak.v1.DefenseService``), the service that serves any update defense, and their
chunked wire format.

It may import ``wire``, ``federated``, ``metrics``, ``zoo`` and ``defenses``.
"""
