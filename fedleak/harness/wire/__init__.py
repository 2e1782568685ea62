"""The wire: tensors as raw little-endian bytes, request errors and the status codes they map
to, channel and server options, the protocol's proto form, and stub generation.

Both processes use it; it may import ``federated``, ``metrics``, ``zoo`` and the generated
``fedleak.v1`` stubs.
"""
