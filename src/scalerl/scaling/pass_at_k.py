"""pass@k: the chance that at least one of k samples of a prompt is correct, and the names of the
metrics a run can fit.

The evaluation draws n samples a prompt; :func:`pass_at_k` is the unbiased estimator of Chen et al.
(2021, "Evaluating Large Language Models Trained on Code", the HumanEval paper) from the c correct
ones, ``1 - C(n - c, k) / C(n, k)``, averaged over the prompts (:func:`mean_pass_at_k`). The
evaluation logs it as ``val/pass_at_<k>`` beside ``val/pass_rate`` (pass@1), and ``scaling.metric``
names which of them a run's and a sweep's fits use (:func:`metric_k`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

DEFAULT_METRIC = "pass_rate"
"""The fitted metric unless ``scaling.metric`` says otherwise: ``val/pass_rate`` (pass@1)."""
METRIC_ALLOWED = "pass_rate or pass_at_<k> with k an integer >= 1"
_PASS_AT = re.compile(r"pass_at_([1-9][0-9]*)")


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k of one prompt with ``c`` correct samples among ``n``:
    ``1 - C(n - c, k) / C(n, k)``, as the product ``1 - prod_{i = n-c+1}^{n} (1 - k / i)`` (Chen et
    al.'s numerically stable form: no binomial coefficient is formed). ``k`` in ``1..n``. pass@1
    is ``c / n`` exactly (the product telescopes), so ``val/pass_at_1`` is ``val/pass_rate`` bit
    for bit."""
    n, c, k = int(n), int(c), int(k)
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got c={c}, n={n}")
    if k == 1:
        return c / n
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def mean_pass_at_k(correct: Iterable[int], n: int, k: int) -> float:
    """pass@k over prompts: the mean of :func:`pass_at_k` of each prompt's correct count
    (``correct``), ``n`` samples each; NaN for no prompts."""
    values = [pass_at_k(n, c, k) for c in correct]
    return sum(values) / len(values) if values else float("nan")


def metric_k(metric: object) -> int | None:
    """The k of a fitted-metric name: 1 for ``pass_rate``, k for ``pass_at_<k>``; None for any
    other value (:data:`METRIC_ALLOWED`)."""
    if metric == DEFAULT_METRIC:
        return 1
    m = _PASS_AT.fullmatch(metric) if isinstance(metric, str) else None
    return int(m.group(1)) if m else None


def evaluation_samples(prompts: float, samples_per_prompt: float, metric: object) -> float:
    """The samples behind one evaluation of the fitted ``metric`` (the fall rule's standard error):
    prompts x samples for the pass rate; the prompts alone for a pass@k (k > 1), whose K samples a
    prompt make one estimate in [0, 1], whose variance is at most that of one trial."""
    return float(prompts * (samples_per_prompt if metric_k(metric) == 1 else 1))


def metric_name(k: int) -> str:
    """The metric logged for pass@``k``: ``pass_at_<k>`` (as ``val/pass_at_<k>``)."""
    return f"pass_at_{int(k)}"
