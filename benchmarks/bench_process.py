"""What starting and ending a run's process costs, this checkout against another, alternating (issue
54: the wait before the first step and after the last one, paid by the first command, every job of
a study and every test that starts ``train.py``).

    python benchmarks/bench_process.py --against /tmp/old-checkout      # about 3 minutes

Each round runs, for each checkout in turn (the order alternating), ``python train.py
trainer.total_steps=2 [overrides]`` in a new folder with its own copy of one empty MLflow store
(made once: creating a store's tables costs seconds, the same for both), importing ``scalerl``
from that checkout's ``src/``. Its output is read as it comes, and four times are taken from the
start: the step-0 evaluation's line (imports, setup, the engine's start, the first evaluation),
the last line (the summary), the process's end (what a shell waits for) and the end of its output
pipe, which a caller that reads the output to its end (a test, a script) waits for: it stays open
while any process that inherited it lives (the engines' fork server). ``steps``: step 0's line to
the last; ``process ended`` and ``exit``: the last line to the process's end and to the pipe's.
Medians over ``--rounds``, each round's values beside them; wall seconds on a machine whose load
is printed with them.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import common

common.use_checkout()

PARTS = ("to step 0", "steps", "process ended", "exit", "total")


def one(checkout: Path, overrides: list[str], store: Path) -> dict[str, float]:
    """One ``train.py`` run of ``checkout`` in a new folder: the times of :data:`PARTS`."""
    folder = Path(tempfile.mkdtemp(prefix="bench-process-"))
    (folder / "mlflow.db").write_bytes(store.read_bytes())
    env = {"PYTHONPATH": str(checkout / "src")}
    cmd = [sys.executable, str(checkout / "train.py"), "trainer.total_steps=2", *overrides]
    t0 = time.perf_counter()
    p = subprocess.Popen(
        cmd, cwd=folder, env={**_env(), **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    ended: list[float] = []  # when train.py's own process ended (what a shell waits for)
    waiter = threading.Thread(target=lambda: (p.wait(), ended.append(time.perf_counter() - t0)))
    waiter.start()
    first = last = None
    lines = []
    for line in p.stdout:  # to the pipe's end
        lines.append(line)
        now = time.perf_counter() - t0
        if first is None and "step 0/" in line:
            first = now
        last = now
    piped = time.perf_counter() - t0
    waiter.join()
    if p.returncode != 0 or first is None:
        raise SystemExit(f"{checkout}: train.py failed ({p.returncode}):\n{''.join(lines[-20:])}")
    return {
        "to step 0": first,
        "steps": last - first,
        "process ended": ended[0] - last,
        "exit": piped - last,
        "total": piped,
    }


def _env() -> dict[str, str]:
    import os

    keep = ("PATH", "HOME", "LANG", "SCALERL_CACHE", "MLFLOW_DISABLE_TELEMETRY", "TMPDIR")
    return {k: os.environ[k] for k in keep if k in os.environ}


def empty_store(folder: Path) -> Path:
    """An empty MLflow sqlite store, its tables made, to copy for each run."""
    from mlflow.tracking import MlflowClient

    db = folder / "template.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
    return db


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--against", type=Path, required=True, help="the other checkout (its src/ and train.py)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("override", nargs="*", help="config overrides for both (default: the default run)")
    a = ap.parse_args()
    here, other = common.ROOT, a.against.resolve()
    names = {here: f"this ({common.commit()})", other: f"other ({common.commit(root=other)})"}
    store = empty_store(Path(tempfile.mkdtemp(prefix="bench-process-store-")))
    for c in (here, other):  # warm: the model cache, numba's cache, the files in the page cache
        one(c, a.override, store)
    res: dict[Path, list[dict[str, float]]] = {here: [], other: []}
    for r in range(a.rounds):
        for c in common.in_turn([here, other], r):
            res[c].append(one(c, a.override, store))

    print(f"# process start and end: {common.utc_now()}")
    print(f"machine: {common.machine()}; load at the end {common.load()}")
    print(f"command: python train.py trainer.total_steps=2 {' '.join(a.override)}".rstrip())
    print()
    print("| checkout | " + " | ".join(f"{p} (s)" for p in PARTS) + " |")
    print("|---|" + "---|" * len(PARTS))
    for c, rs in res.items():
        cells = []
        for p in PARTS:
            each = ", ".join(f"{x[p]:.1f}" for x in rs)
            cells.append(f"{statistics.median(x[p] for x in rs):.2f} ({each})")
        print(f"| {names[c]} | " + " | ".join(cells) + " |")
    print()
    for p in ("to step 0", "exit", "total"):
        d = statistics.median(x[p] for x in res[other]) - statistics.median(x[p] for x in res[here])
        print(f"{p}: {d:+.2f} s less in this checkout (medians)")


if __name__ == "__main__":
    main()
