"""``correction``: off-policy correction between the generator's and the trainer's policies, apart
from the loss (:mod:`scalerl.algo.correction`): ``none`` (the ScaleRL recipe: the loss's ratio is
taken against the generator), ``decoupled`` (against the trainer's proximal policy, with the whole
behaviour weight), ``tis`` (the weight truncated at ``threshold``) and ``mis`` (masked outside
``[lower, threshold]``), each at ``level`` token or sequence."""

from __future__ import annotations

import math
from dataclasses import dataclass

from scalerl.algo.correction import LEVELS, Correction
from scalerl.config.checks import one_of, positive, problems
from scalerl.config.options import Option, register_option


@dataclass
class CorrectionOption(Option):
    name: str = ""
    level: str = "token"  # token | sequence (a sequence's weight: exp of its tokens' mean log-ratio)

    def check(self):
        return problems(one_of("level", self.level, LEVELS))

    def correction(self) -> Correction:
        """The algorithm's view of this option."""
        return Correction(
            name=self.name,
            level=self.level,
            threshold=float(getattr(self, "threshold", math.inf)),
            lower=float(getattr(self, "lower", 0.0)),
        )


@register_option("correction", "none")
@dataclass
class NoCorrection(CorrectionOption):
    """No correction (ScaleRL): the loss's ratio is trainer / generator, one clip for mismatch and
    staleness alike."""

    name: str = "none"


@register_option("correction", "decoupled")
@dataclass
class Decoupled(CorrectionOption):
    """Decoupled objective (Hilton et al. 2021): the loss's ratio against the trainer's proximal
    policy, times the whole behaviour weight proximal / generator."""

    name: str = "decoupled"


@register_option("correction", "tis")
@dataclass
class Truncated(CorrectionOption):
    """Truncated importance sampling (Yao et al. 2025; verl's rollout_is): decoupled, with the
    behaviour weight truncated at ``threshold``."""

    name: str = "tis"
    threshold: float = 2.0  # the behaviour weight is min(w, threshold)

    def check(self):
        return problems(one_of("level", self.level, LEVELS), positive("threshold", self.threshold))


@register_option("correction", "mis")
@dataclass
class Masked(CorrectionOption):
    """Masked importance sampling (Liu et al. 2025; verl's rollout rejection sampling): decoupled,
    with tokens (or sequences) whose behaviour weight lies outside ``[lower, threshold]`` weighted 0."""

    name: str = "mis"
    # tokens (sequences) whose behaviour weight lies outside [lower, threshold] are weighted 0
    threshold: float = 2.0
    lower: float = 0.0

    def check(self):
        out = problems(one_of("level", self.level, LEVELS), positive("threshold", self.threshold))
        if not out and not 0 <= self.lower < self.threshold:
            out = [("lower", self.lower, f"a number in [0, threshold) = [0, {self.threshold:g})")]
        return out
