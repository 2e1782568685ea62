"""Attacks on text federations: what a server reads out of a transformer's update.

The attacker's view is :class:`~fedleak.attacks.text_observation.TextObservation`; an
attack answers a :class:`~fedleak.attacks.text_observation.TextReconstruction`. The
algorithms are plain torch code over Hugging Face GPT-2/BERT models: the token set
(:mod:`token_set`), DAGER (exact sentences from the span of attention gradients,
:mod:`dager`), LAMP and TAG (gradient matching on continuous token embeddings, :mod:`lamp`);
nothing here knows the wire or the harness. The attack registry's first lookup registers the
built-in text attacks (:mod:`fedleak.attacks.builtin_attacks`).
"""
