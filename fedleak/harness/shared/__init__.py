"""Process-free code both sides use: the model zoo, data sets and binary tasks, the FL protocol
(the user's local update, written once), training, metrics and pictures.

Nothing here speaks gRPC or belongs to one process; it may import ``attacks`` and ``defenses``.
"""
