"""What task=code's verifier costs per program: ``CodeTask.score`` wall time, one program after another,
for a templated problem (a right and a wrong one-line function) and for HumanEval (the reference
solutions of the first ``--humaneval`` problems), under each sandbox boundary that works here.

    python benchmarks/bench_code_verifier.py [--runs 40] [--humaneval 20]

Runs against whatever ``scalerl`` is importable, so the same script measures an older checkout
(``PYTHONPATH=/path/to/old/src``): a ``CodeTask`` without the ``sandbox`` argument is measured with
its own default only. Prints a Markdown table (median and 90th percentile seconds per program).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import common


def _timed(score, prompt, completion, runs: int) -> tuple[float, float, float]:
    times, reward = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        reward = score(prompt, completion)
        times.append(time.perf_counter() - t0)
    times.sort()
    return statistics.median(times), times[max(0, int(0.9 * len(times)) - 1)], reward


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=40, help="runs per templated program")
    ap.add_argument("--humaneval", type=int, default=20, help="HumanEval problems (0: none)")
    args = ap.parse_args()

    import scalerl
    from scalerl.task import CodeTask

    try:
        from scalerl.task.sandbox import available

        where = list(available())
    except ImportError:
        where = [None]
    print(
        f"scalerl from {os.path.dirname(scalerl.__file__)}; {common.machine()}, commit {common.commit()}, "
        f"load {common.load()}, {common.utc_now()}\n"
    )
    print("| boundary | program | median s | p90 s | reward |")
    print("|---|---|---|---|---|")
    for b in where:
        task = CodeTask(num_val=8) if b is None else CodeTask(num_val=8, sandbox=b)
        p = task.val_prompts()[0]
        ys = [int(part.split("=")[1]) for part in p.text.rstrip(";").split(";")]
        right = f"def f(x): return x*{ys[1] - ys[0]}+{ys[0]}"
        for name, prog in (("templated, right", right), ("templated, wrong", "def f(x): return x")):
            med, p90, r = _timed(task.score, p, prog, args.runs)
            print(f"| {b or 'default'} | {name} | {med:.3f} | {p90:.3f} | {r} |")
        if args.humaneval:
            he = (
                CodeTask(source="humaneval", num_val=8)
                if b is None
                else CodeTask(source="humaneval", num_val=8, sandbox=b)
            )
            from scalerl.task.code import _humaneval_problems

            rows = _humaneval_problems()[: args.humaneval]
            times, passed = [], 0
            for r in rows:
                prompt = he._humaneval_prompt(0, r)
                med, _, reward = _timed(
                    he.score, prompt, "```python\n" + r["prompt"] + r["canonical_solution"] + "```", 3
                )
                times.append(med)
                passed += reward == 1.0
            times.sort()
            print(
                f"| {b or 'default'} | HumanEval reference x{len(rows)} | {statistics.median(times):.3f} | "
                f"{times[max(0, int(0.9 * len(times)) - 1)]:.3f} | {passed}/{len(rows)} pass |"
            )


if __name__ == "__main__":
    main()
