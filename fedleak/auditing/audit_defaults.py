"""The audit's defaults, in one place.

The victim fills a request's zeros with them
(:mod:`fedleak.harness.victim.audit.request`), the server's settings and the ``fedleak audit``
options start from them, and an estimator's :class:`~fedleak.auditing.estimator_registry.Game`
does too.

- ``DEFAULT_CONFIDENCE``: the confidence 1 − α of every primary ε lower bound;
- ``DEFAULT_FALSE_ALARM``: the verdict's family-wise false-alarm rate (Holm over every test);
- ``DEFAULT_SHORTFALL`` and ``DEFAULT_POWER``: without a trial count the victim chooses the
  trials at which the declaration tests catch noise ``DEFAULT_SHORTFALL``·σ with probability
  ``DEFAULT_POWER``, and every verdict states what it would have caught at that power;
- ``DEFAULT_THRESHOLD_RULE`` and ``DEFAULT_CALIBRATION``: the decision threshold fixed before
  the trials at half the canary's expected shift, else chosen on a held-out share.
"""

DEFAULT_CONFIDENCE = 0.95
DEFAULT_FALSE_ALARM = 1e-4
DEFAULT_SHORTFALL = 0.9
DEFAULT_POWER = 0.99
DEFAULT_THRESHOLD_RULE = "half-shift"
DEFAULT_CALIBRATION = 0.2
