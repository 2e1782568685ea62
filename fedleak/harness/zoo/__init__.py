"""The model and data zoo: architectures by name, labelled image sets, the binary tasks of
a model release, and torchvision imported whatever its compiled operators.

It may import ``attacks``, ``defenses`` and ``auditing``.
"""
