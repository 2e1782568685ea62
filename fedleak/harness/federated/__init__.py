"""Federated learning's semantics, process-free: the protocol a user follows, its local
update (plain, per-example private, defended), the server's observation of it and the
replay that reproduces it exactly, training, and the model release.

It may import ``attacks``, ``defenses``, ``auditing`` and the zoo.
"""
