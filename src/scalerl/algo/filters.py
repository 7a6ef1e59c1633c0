"""Data filters of the ScaleRL recipe: zero-variance filtering and no-positive-resampling.

Khatri et al. 2025, Sec. 3.2 ("zero-variance filtering", "adaptive prompt filtering"):

- zero-variance filtering: a prompt whose G rewards are all equal has zero advantage everywhere and
  carries no signal; it is dropped from the loss (not resampled).
- no-positive-resampling: a prompt whose historical pass rate reaches 0.9 is removed from all later
  epochs for good.

Which pass rate counts (:class:`PassRateTracker`, ``window``): by default the prompt's pass rate in
the epoch just seen (its group of G samples; each epoch draws a prompt once), so a prompt is retired
in the first epoch its group solves it at >= 0.9 (with G = 8: 8 of 8). The paper keeps "a history of
pass rates" and removes a prompt once its pass rate reaches 0.9; the purpose is to stop spending
generation on prompts the *current* policy has mastered, which a per-epoch rate measures. A
cumulative rate over every epoch (``window="all_epochs"``) averages in the early policy's failures:
a prompt solved 4/8 in the first epoch then 8/8 every epoch is retired only after 4 more epochs, by
when it has cost 4 groups that carry no signal (all correct, dropped by the zero-variance filter).
Its advantage is that one lucky group (a prompt solved 70% of the time gets 8/8 with probability
0.06) retires nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from scalerl.algo._groups import group_index


def zero_variance_mask(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """``bool [N]``: False where the sample's group has identical rewards (Khatri et al. 2025, Sec. 3.2).

    Equality is exact (group max == group min), so no tolerance can hide a real difference.
    """
    if rewards.dim() != 1 or rewards.shape != group_ids.shape:
        raise ValueError(
            f"rewards and group_ids must both be 1-D of the same length, got "
            f"{tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=torch.bool, device=rewards.device)
    inverse, num_groups = group_index(group_ids)
    r = rewards.detach()
    empty = torch.zeros(num_groups, dtype=r.dtype, device=r.device)
    gmax = empty.scatter_reduce(0, inverse, r, reduce="amax", include_self=False)
    gmin = empty.scatter_reduce(0, inverse, r, reduce="amin", include_self=False)
    return (gmax != gmin)[inverse]


def _as_list(values: Any) -> list:
    if isinstance(values, torch.Tensor):
        return values.detach().cpu().reshape(-1).tolist()
    return list(values)


class PassRateTracker:
    """No-positive-resampling bookkeeping (Khatri et al. 2025, Sec. 3.2).

    Keeps, per prompt uid, the number of samples seen and their summed success. A prompt is
    *retired* the moment its pass rate reaches ``threshold`` (paper: 0.9), and is never un-retired,
    whatever later samples show. ``window``: which pass rate counts. ``"last_epoch"``: the mean
    success of the samples of one :meth:`update` call (the loop passes one call per group, and a
    prompt has one group per epoch); ``"all_epochs"``: over every sample seen so far (see the module
    docstring for why the first is the default).

    Successes are bools or numbers in ``[0, 1]`` (a fractional value counts as that fraction of a
    success); pass a correctness flag, not a raw reward that may be negative.
    """

    WINDOWS = ("last_epoch", "all_epochs")

    def __init__(self, threshold: float = 0.9, window: str = "last_epoch"):
        if not isinstance(threshold, (int, float)) or isinstance(threshold, bool) or not 0 < threshold <= 1:
            raise ValueError(f"threshold must be a number in (0, 1], got {threshold!r}")
        if window not in self.WINDOWS:
            raise ValueError(f"window must be one of {', '.join(self.WINDOWS)}, got {window!r}")
        self.threshold = float(threshold)
        self.window = window
        self._seen: dict[int, int] = {}
        self._success: dict[int, float] = {}
        self._retired: set[int] = set()

    def update(
        self, prompt_uids: Iterable[int] | torch.Tensor, successes: Iterable[Any] | torch.Tensor
    ) -> None:
        """Add one sample per (uid, success) pair; retire the prompts whose pass rate (over this call's
        samples, or over all, as ``window`` says) reaches the threshold."""
        uids = [int(u) for u in _as_list(prompt_uids)]
        succ = [float(s) for s in _as_list(successes)]
        if len(uids) != len(succ):
            raise ValueError(f"got {len(uids)} prompt uids but {len(succ)} successes")
        bad = [s for s in succ if not 0.0 <= s <= 1.0]
        if bad:
            raise ValueError(f"successes must be bools or numbers in [0, 1], got {bad[0]!r}")
        now: dict[int, list[float]] = {}  # uid -> [samples, successes] of this call
        for uid, s in zip(uids, succ):
            self._seen[uid] = self._seen.get(uid, 0) + 1
            self._success[uid] = self._success.get(uid, 0.0) + s
            n_s = now.setdefault(uid, [0.0, 0.0])
            n_s[0] += 1
            n_s[1] += s
        for uid, (n, s) in now.items():
            rate = s / n if self.window == "last_epoch" else self.pass_rate(uid)
            if rate >= self.threshold:
                self._retired.add(uid)

    def pass_rate(self, uid: int) -> float | None:
        """Pass rate of ``uid`` over every sample seen (whatever the window); None if never seen."""
        n = self._seen.get(int(uid), 0)
        return self._success[int(uid)] / n if n else None

    def retired(self, uid: int) -> bool:
        """True once ``uid`` has been retired (it should not be sampled again)."""
        return int(uid) in self._retired

    def retired_uids(self) -> set[int]:
        return set(self._retired)

    def __len__(self) -> int:
        return len(self._retired)

    def __contains__(self, uid: object) -> bool:
        try:
            return int(uid) in self._retired  # type: ignore[call-overload]
        except (TypeError, ValueError):
            return False

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state (lists and numbers only; survives ``json.dumps``/``loads``)."""
        return {
            "threshold": self.threshold,
            "window": self.window,
            "history": [[uid, self._seen[uid], self._success[uid]] for uid in sorted(self._seen)],
            "retired": sorted(self._retired),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict` (replaces the current state)."""
        self.threshold = float(state["threshold"])
        self.window = str(state.get("window", "all_epochs"))  # checkpoints from before the choice
        self._seen = {int(u): int(n) for u, n, _ in state["history"]}
        self._success = {int(u): float(s) for u, _, s in state["history"]}
        self._retired = {int(u) for u in state["retired"]}
