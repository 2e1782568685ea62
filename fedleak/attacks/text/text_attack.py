"""The base of every text attack.

An :class:`~fedleak.attacks.base.Attack` whose target is a
:class:`~fedleak.attacks.text_observation.TextObservation` (threat model ``text-update``) and whose
answer is a :class:`~fedleak.attacks.text_observation.TextReconstruction`.
"""

from __future__ import annotations

from typing import ClassVar

from fedleak.attacks.base import Attack
from fedleak.attacks.text_observation import TextObservation


class TextAttack(Attack[TextObservation]):
    """A reconstruction attack on one observed update of a text federation.

    Subclasses set ``Config`` and implement ``recover(observation, device=, seed=,
    progress=)`` returning a ``TextReconstruction``; :meth:`Attack.reconstruct` checks the
    target is a ``TextObservation`` on the attack's device and seeds torch first.
    ``architectures`` lists the architectures (``decoder``, ``encoder``) the attack handles.
    """

    threat_model: ClassVar[str] = "text-update"
    architectures: ClassVar[tuple[str, ...]] = ("decoder", "encoder")
