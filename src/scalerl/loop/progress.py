"""Progress output: a tqdm bar on an interactive terminal, plain log lines otherwise."""

from __future__ import annotations

import sys
import time


class Progress:
    """A tqdm bar on an interactive terminal, plain log lines otherwise."""

    def __init__(self, mode: str, every: int, total: int, initial: int, enabled: bool = True):
        """``mode``: the run's ``progress`` setting (auto, bar or log); log lines every ``every``
        steps (the evaluation cadence); ``total`` steps, ``initial`` already done."""
        self.enabled = enabled
        self.bar = None
        if enabled and (mode == "bar" or (mode == "auto" and sys.stderr.isatty())):
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="scalerl", unit="step", dynamic_ncols=True)
        self.every = max(1, int(every))
        self.total, self.initial, self.t0 = int(total), int(initial), time.monotonic()

    def update(self, step: int, stats: dict, pass_rate: float) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix(
                reward=f"{stats.get('train/reward', float('nan')):.3f}",
                pass_rate=f"{pass_rate:.3f}",
                tok_s=f"{stats.get('perf/tokens_per_s', 0):.0f}",
            )
        elif step % self.every == 0:
            print(
                f"[scalerl] step {step} reward={stats.get('train/reward', float('nan')):.3f} "
                f"tokens/s={stats.get('perf/tokens_per_s', 0):.0f}{self._pace(step)}",
                flush=True,
            )

    def _pace(self, step: int) -> str:
        """`` (T so far, about T left)`` at this process's pace since its first step (a resumed run's
        earlier steps not counted), as the bar shows it on a terminal; empty before a step is done."""
        from scalerl.estimate import seconds_text

        took, done = time.monotonic() - self.t0, step - self.initial
        if done <= 0:
            return ""
        left = (self.total - step) * took / done
        return f" ({seconds_text(took)} so far, about {seconds_text(left)} left)" if step < self.total else ""

    def write(self, msg: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(f"[scalerl] {msg}")
        else:
            print(f"[scalerl] {msg}", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
