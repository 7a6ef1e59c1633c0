"""``filter``: zero-variance filtering and no-positive-resampling (paper Sec. 3.2), leaving
truncated samples out of the loss (the paper excludes them from the effective batch), and DAPO's
dynamic sampling (more prompts drawn until the step's groups that carry signal fill the batch)."""

from __future__ import annotations

from dataclasses import dataclass

from scalerl.algo.filters import PassRateTracker
from scalerl.config.checks import at_least, in_unit, one_of, problems
from scalerl.config.options import Option, register_option


@dataclass
class FilterOption(Option):
    name: str = ""
    zero_variance: bool = True  # drop groups whose rewards are all equal from the loss
    no_positive_resampling: bool = True  # retire prompts whose pass rate reaches the threshold
    pass_rate_threshold: float = 0.9
    exclude_truncated: bool = False  # leave samples cut off at the token budget out of the loss
    # which pass rate retires a prompt: its group's in the epoch just seen, or over all its epochs
    pass_rate_window: str = "last_epoch"
    # DAPO's dynamic sampling: the zero-variance groups a step drops are replaced by groups of more
    # prompts, until the batch's groups that carry signal number batch_size / G, or the step has
    # generated max_gen_batches batches' worth of groups (then it trains on those it has). It acts
    # only with zero_variance: without that filter nothing is dropped, so nothing is replaced.
    dynamic_sampling: bool = False
    max_gen_batches: int = 4

    def check(self):
        return problems(
            in_unit("pass_rate_threshold", self.pass_rate_threshold, low_open=True),
            one_of("pass_rate_window", self.pass_rate_window, PassRateTracker.WINDOWS),
            at_least("max_gen_batches", self.max_gen_batches, 1),
        )


@register_option("filter", "scalerl")
@dataclass
class ScaleRLFilter(FilterOption):
    """Both filters, and dynamic sampling; each switchable on its own."""

    name: str = "scalerl"
    # on in this project's default, unlike the paper's recipe (which drops zero-variance groups
    # without replacing them): late in a run most groups are solved G of G, the filter leaves a few
    # groups a step, and the embedded default's curves fell below their maximum there; with the
    # batch kept full they stayed steady to twice the budget (benchmarks/results/README.md)
    dynamic_sampling: bool = True


@register_option("filter", "none")
@dataclass
class NoFilter(FilterOption):
    """Neither filter."""

    name: str = "none"
    zero_variance: bool = False
    no_positive_resampling: bool = False
