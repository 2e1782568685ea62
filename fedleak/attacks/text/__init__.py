"""Attacks on text federations: what a server reads out of a transformer's update.

The attacker's view is :class:`~fedleak.attacks.text.text_observation.TextObservation`; an
attack answers a :class:`~fedleak.attacks.text.text_observation.TextReconstruction`. Importing
``fedleak.attacks`` registers the built-in text attacks.
"""
