"""Attacks on text federations: what a server reads out of a transformer's update.

The attacker's view is :class:`~fedleak.attacks.text.text_observation.TextObservation`; an
attack answers a :class:`~fedleak.attacks.text.text_observation.TextReconstruction`. Importing
this package registers the built-in text attacks.
"""

from fedleak.attacks.text import token_set  # noqa: F401  (registers token-set)
