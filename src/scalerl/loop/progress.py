"""Progress output: a tqdm bar on an interactive terminal, plain log lines otherwise."""

from __future__ import annotations

import sys


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
                f"tokens/s={stats.get('perf/tokens_per_s', 0):.0f}",
                flush=True,
            )

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
