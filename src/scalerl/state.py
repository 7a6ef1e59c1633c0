"""A run's state: every counter of the loop, saved in and restored from checkpoints as a whole."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields


@dataclass
class RunState:
    step: int = 0  # optimiser steps taken (= the trainer's policy version)
    flops: float = 0.0  # 2N per generated + 6N per trained token, all ranks
    elapsed: float = 0.0  # wall seconds of this run, summed over resumes
    gen_busy: float = 0.0  # seconds the generator was generating
    train_busy: float = 0.0  # seconds the trainer was preparing batches and stepping
    gen_tokens: int = 0  # completion tokens generated, all ranks
    next_group_id: int = 0
    zero_variance_dropped: int = 0  # groups, all ranks
    stale_dropped: int = 0  # groups too old for the async mode's staleness rule
    verifier_errors: int = 0  # verifier calls that raised or timed out (scored 0)
    verifier_kinds: dict[str, int] = field(default_factory=dict)  # failed programs per kind (task=code)
    lag_tokens: dict[int, int] = field(default_factory=dict)  # policy lag -> tokens trained, all ranks
    evals: list[dict] = field(default_factory=list)  # {"step", "pass_rate", "flops", "device_hours"}
    step0_solved: dict[int, float] = field(default_factory=dict)  # val prompt uid -> pass rate at step 0
    train_correct: list[float] = field(default_factory=list)  # train/correct of each step (health/*)

    def new_group_ids(self, n: int) -> list[int]:
        ids = list(range(self.next_group_id, self.next_group_id + n))
        self.next_group_id += n
        return ids

    def count_verifier(self, counts: dict[str, int]) -> None:
        """Add what :func:`scalerl.task.score.score_groups` counted."""
        for kind, n in counts.items():
            if kind == "errors":
                self.verifier_errors += int(n)
            elif n:
                self.verifier_kinds[kind] = self.verifier_kinds.get(kind, 0) + int(n)

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for f in fields(self):
            if f.name in state:  # a checkpoint from before a counter existed starts it at its default
                setattr(self, f.name, state[f.name])
        self.step0_solved = {int(k): v for k, v in self.step0_solved.items()}
        self.lag_tokens = {int(k): int(v) for k, v in self.lag_tokens.items()}

    def lag_summary(self) -> dict[str, float]:
        """Mean, 90th percentile and maximum policy lag over every token trained so far."""
        total = sum(self.lag_tokens.values())
        if not total:
            return {"mean": 0.0, "p90": 0.0, "max": 0.0}
        seen, p90 = 0, 0
        for lag in sorted(self.lag_tokens):
            seen += self.lag_tokens[lag]
            if seen >= 0.9 * total:
                p90 = lag
                break
        mean = sum(lag * n for lag, n in self.lag_tokens.items()) / total
        return {"mean": mean, "p90": float(p90), "max": float(max(self.lag_tokens))}


class Clock:
    """Adds the wall time since its last tick to ``state.elapsed``."""

    def __init__(self, state: RunState):
        self.state = state
        self.last = time.perf_counter()

    def tick(self) -> float:
        now = time.perf_counter()
        self.state.elapsed += now - self.last
        self.last = now
        return self.state.elapsed
