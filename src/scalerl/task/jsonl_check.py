"""Every answer of a ``task=jsonl`` data file checked against itself, where a run's load checks a
sample (:func:`scalerl.task.jsonl._check_golds`):

    python -m scalerl.task.jsonl_check FILE [FILE ...] [--timeout-s S]

One line for each answer no completion could score on (it matches itself neither boxed nor as plain
text, or its check runs past the time limit), then a summary a file; exit status 1 where any such
answer was found, 2 where a file cannot be read as examples (the load's one-line error)."""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from pathlib import Path

from tqdm import tqdm

from scalerl.task.jsonl import SELF_CHECK_S, DataFileError, JsonlTask, gold_error, gold_problem

MAX_TIMEOUT_S = 3600.0  # an hour an answer; the timer's own limit is far above it


def check_file(path: str, *, timeout_s: float = SELF_CHECK_S, out=None) -> int:
    """Check every answer of ``path`` against itself (:func:`gold_problem`), printing one line for
    each that no completion could score on and a summary; the number of such answers. A file that
    cannot be read as examples raises :class:`DataFileError`, as a run's load does."""
    out = out or sys.stdout
    task = JsonlTask(path, check_golds=False)
    bad = 0
    t0 = time.monotonic()
    with tqdm(task.rows, desc=Path(path).name, unit="answer", disable=not sys.stderr.isatty()) as rows:
        for lineno, _, answer in rows:
            why = gold_problem(task, answer, timeout_s, "--timeout-s")
            if why is not None:
                bad += 1
                print(gold_error(path, lineno, answer, why), file=out)
    verdict = "every one matches itself" if not bad else f"{bad} that no completion could score on"
    print(
        f"task.path={path!r}: {len(task.rows)} answers checked in {time.monotonic() - t0:.1f} s: {verdict}",
        file=out,
    )
    return bad


def main(argv: list[str] | None = None) -> int:
    """``python -m scalerl.task.jsonl_check FILE [FILE ...]``: every answer of each file checked against
    itself, as a run checks a sample of them when it loads; exit status 1 where any answer cannot
    match itself, 2 where a file cannot be read as examples."""
    parser = argparse.ArgumentParser(
        prog="python -m scalerl.task.jsonl_check",
        description="Check every answer of task=jsonl data files against itself (boxed, and as plain "
        "text), as a run checks a sample of them when it loads: an answer that matches neither, or "
        "whose check runs past the time limit, is one no completion could score on.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help='JSON-lines files of {"prompt", "answer"}')
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=SELF_CHECK_S,
        help=f"each answer's time limit (default {SELF_CHECK_S:g})",
    )
    args = parser.parse_args(argv)
    # the time limit is ours (score_counted's): math-verify's note that it has none of its own is noise here
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    if not (math.isfinite(args.timeout_s) and 0 < args.timeout_s <= MAX_TIMEOUT_S):
        parser.error(f"--timeout-s={args.timeout_s:g}: must be a number in (0, {MAX_TIMEOUT_S:g}]")
    status = 0
    for path in args.files:
        try:
            status = max(status, 1 if check_file(path, timeout_s=args.timeout_s) else 0)
        except DataFileError as e:
            print(e, file=sys.stderr)
            status = 2
    return status


if __name__ == "__main__":
    sys.exit(main())
