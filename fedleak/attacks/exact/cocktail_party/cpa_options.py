"""The Cocktail Party Attack's options and their checks.

The options of :mod:`~fedleak.attacks.exact.cocktail_party.cpa`: which layer, how to unmix,
how to resolve sign and scale, the ReLU refinement and the feature inversion.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fedleak.attacks.safety_limit import DEFAULT_SAFETY_SECONDS, check_seconds

DOMAINS = ("gradients", "pixels")
CONTRASTS = ("logcosh", "exp", "cube")
SCALES = ("bias", "minmax")
RELU_CHOICES = ("auto", "off")


@dataclass
class CocktailPartyConfig:
    """Which layer, how to unmix, how to resolve sign and scale, and the feature inversion."""

    layer: str = field(default="auto", metadata={
        "help": "auto (the first fully-connected layer over the image, else the last linear "
                "layer after the feature extractor), first, last, or a module name"})
    domain: str = field(default="gradients", metadata={
        "help": "what FastICA unmixes: gradients (finite differences of image mixtures) or "
                "pixels (the paper's)"})
    contrast: str = field(default="exp", metadata={
        "help": "FastICA's negentropy contrast: logcosh, exp or cube"})
    ica_iterations: int = field(default=2000, metadata={"help": "FastICA's max_iter"})
    tolerance: float = field(default=1e-6, metadata={"help": "FastICA's tol"})
    iterations: int = field(default=0, metadata={
        "help": "Adam steps refining the unmixing with the paper's loss after FastICA "
                "(negentropy + decorrelation + TV)"})
    lr: float = field(default=1e-3, metadata={"help": "step size of that refinement"})
    decorrelation: float = field(default=1.0, metadata={
        "help": "weight of the paper's decorrelation (mutual independence) penalty"})
    temperature: float = field(default=5.0, metadata={
        "help": "T in the decorrelation penalty exp(T |cos|) - 1"})
    tv: float = field(default=0.0, metadata={
        "help": "weight of the TV prior on source images in the refinement"})
    scale: str = field(default="bias", metadata={
        "help": "bias (exact sign and scale from the bias gradient) or minmax (the paper's "
                "[0, 1] rescaling, sign by the data set's mean pixel)"})
    relu: str = field(default="auto", metadata={
        "help": "auto: certify and deflate inputs through the ReLU's exact zeros when one "
                "follows the layer (exact recovery); off: the paper's unmixing alone"})
    rounds: int = field(default=16, metadata={
        "help": "the budget: rounds of certify-and-deflate (each one FastICA unmixing and one "
                "direction search from each estimate)"})
    patience: int = field(default=2, metadata={
        "help": "rounds in a row that certify nothing (each a restart with a new seed and the "
                "other contrast) before the rounds stop"})
    samples: int = field(default=1_000_000, metadata={
        "help": "sets SPEAR's sampling may try for the last inputs of a small batch"})
    time_limit: float = field(default=DEFAULT_SAFETY_SECONDS, metadata={
        "help": "safety cap in seconds: a run it stops is marked truncated (not a "
                "measurement); the budget is rounds and samples"})
    fi_iterations: int = field(default=1000, metadata={
        "help": "feature inversion steps (convolutional models)"})
    fi_lr: float = field(default=0.1, metadata={"help": "feature inversion step size"})
    fi_tv: float = field(default=0.01, metadata={"help": "feature inversion TV weight"})
    fi_gm: float = field(default=0.0, metadata={
        "help": "feature inversion gradient-matching weight (cosine, whole batch)"})

    def __post_init__(self) -> None:
        """Check the choices and numbers; raise ``ValueError`` naming the bad option."""
        for name, value, choices in (("domain", self.domain, DOMAINS),
                                     ("contrast", self.contrast, CONTRASTS),
                                     ("scale", self.scale, SCALES),
                                     ("relu", self.relu, RELU_CHOICES)):
            if value not in choices:
                raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
        if min(self.ica_iterations, self.rounds, self.samples) < 1 or min(
                self.iterations, self.fi_iterations, self.patience) < 0:
            raise ValueError("ica-iterations, rounds and samples must be at least 1; "
                             "iterations, fi-iterations and patience at least 0")
        check_seconds(self.time_limit)
        for key, number in (("tolerance", self.tolerance), ("lr", self.lr),
                            ("fi-lr", self.fi_lr), ("temperature", self.temperature)):
            if not (number > 0 and math.isfinite(number)):
                raise ValueError(f"{key} must be a positive number, got {number}")
        for key, number in (("decorrelation", self.decorrelation), ("tv", self.tv),
                            ("fi-tv", self.fi_tv), ("fi-gm", self.fi_gm)):
            if not (number >= 0 and math.isfinite(number)):
                raise ValueError(f"{key} must be a non-negative number, got {number}")
