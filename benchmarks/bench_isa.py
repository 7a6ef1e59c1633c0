"""What an AVX2 machine's code paths cost on this machine: the same runs under this CPU's own
instruction sets and capped to AVX2, alternately.

The project's AVX2 machines have no bf16 instructions, so there the embedded model's emulated bf16
layers run as fp32 GEMMs over rounded values (:func:`scalerl.model.precision.low_precision_kernels`),
its compiled loops as 256-bit vector code and torch's kernels at their AVX2 level. Each library's
own cap selects those paths on a newer CPU: ``ATEN_CPU_CAPABILITY=avx2`` (torch),
``ONEDNN_MAX_CPU_ISA=AVX2`` (oneDNN, whose cap the project reads too), ``MKL_ENABLE_INSTRUCTIONS=AVX2``
(MKL's fp32 GEMMs) and ``NUMBA_CPU_NAME=haswell`` (the compiled loops). This starts ``--runs`` runs of
``train.py`` at once (by default the ceiling study's baseline, ``sweeps/loo_ceiling.yaml``'s base, 2
at a time as its local sweep runs them), under each in turn for ``--rounds`` rounds, and reports each
group's wall time, the machine's CPU seconds over it (``/proc/stat``) and each run's held-out pass
rate at its end.

It measures the paths, not an AVX2 machine: the cores, clocks and caches are this machine's, so an
AVX2 machine with slower cores takes longer than the capped runs here.

    python benchmarks/bench_isa.py                                   # 1 round, 720 steps
    python benchmarks/bench_isa.py --rounds 2 -- trainer.total_steps=360 eval.every=18
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

import common

common.use_checkout()

from scalerl.model.precision import AVX2_PATHS  # noqa: E402
from scalerl.sweep import load_spec  # noqa: E402

ROOT = common.ROOT
PATHS = {"this CPU": {}, "AVX2": AVX2_PATHS}
STUDY = load_spec(ROOT / "sweeps" / "loo_ceiling.yaml").base


def cpu_seconds() -> float:
    """The machine's busy CPU seconds since boot (user, nice, system, irq, softirq); NaN off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        ticks = sum(int(fields[i]) for i in (1, 2, 3, 6, 7))
        return ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return math.nan


def start(folder: Path, seed: int, env: dict, overrides: list[str]) -> subprocess.Popen:
    """A run of the study's base with ``overrides`` under ``env``, this checkout's ``src/`` first."""
    pythonpath = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    full = {**os.environ, **env, "PYTHONPATH": pythonpath}
    return common.start_train(folder, seed, [*STUDY, *overrides, "progress=log"], env=full)


def end_pass_rate(log: Path) -> float:
    """The run's last held-out pass rate, from its closing line ("held-out pass rate: a -> b")."""
    m = re.findall(r"held-out pass rate: [0-9.]+ -> ([0-9.]+)", log.read_text())
    return float(m[-1]) if m else math.nan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2, help="runs started at once (seeds 0..N-1)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--first-round", type=int, default=0, help="1: the AVX2 paths first")
    ap.add_argument("--out", type=Path, default=None, help="write the JSON here too")
    ap.add_argument("overrides", nargs="*", help="train.py overrides after the study's base")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        # every path's compiled loops and the base model cached before any timed run
        for name, env in PATHS.items():
            warm = Path(tmp) / f"warm-{name.replace(' ', '-')}"
            warm.mkdir()
            common.wait_train(
                [start(warm, 0, env, [*a.overrides, "trainer.total_steps=2", "eval.every=1000"])]
            )
        for r in range(a.first_round, a.first_round + a.rounds):
            for name in common.in_turn(list(PATHS), r):
                folder = Path(tmp) / f"{r}-{name.replace(' ', '-')}"
                folder.mkdir()
                load0, cpu0, t0 = common.loadavg(), cpu_seconds(), time.time()
                common.wait_train([start(folder, s, PATHS[name], a.overrides) for s in range(a.runs)])
                wall, cpu = time.time() - t0, cpu_seconds() - cpu0
                rows.append(
                    {
                        "round": r,
                        "paths": name,
                        "runs": a.runs,
                        "wall_s": round(wall, 1),
                        "machine_cpu_s": round(cpu, 1),
                        "load_before": load0,
                        "end_pass_rates": [end_pass_rate(folder / f"run-{s}.log") for s in range(a.runs)],
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    result = {
        **common.environment(),
        "avx2_env": AVX2_PATHS,
        "settings": [*STUDY, *a.overrides],
        "rows": rows,
        "load_after": common.loadavg(),
    }
    text = json.dumps(result, indent=1)
    print(text)
    if a.out is not None:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
