"""Real data: a JSON-lines file of ``{"prompt": ..., "answer": ...}``, answers checked by math-verify."""

from __future__ import annotations

import json
import math
import random
import shlex
from pathlib import Path

from scalerl.messages import UserError
from scalerl.task.base import Prompt, score_counted
from scalerl.task.math_answer import check_answer


class DataFileError(UserError):
    """A malformed data file; the message is one line naming the file, the line and the problem."""


MAX_LINE_BYTES = 1 << 20  # one example per line; a longer line is not a prompt
# golds checked against themselves when a file is loaded, spread evenly over it (each check costs
# milliseconds: a whole file of thousands would hold every run's start)
SELF_CHECKED = 64
# each one's time limit (the loop's on a scoring, task.verifier_timeout_s, is 2 s by default)
SELF_CHECK_S = 10.0


def _line_error(path: str, lineno: int, problem: str) -> DataFileError:
    return DataFileError(f"task.path={path!r}: line {lineno}: {problem}")


def read_examples(path: str) -> list[tuple[str, str]]:
    """(prompt, answer) per non-blank line of ``path``; :class:`DataFileError` (one line naming the
    file, the line and the problem) on anything else."""
    return [(prompt, answer) for _, prompt, answer in _read_rows(path)]


def _read_rows(path: str) -> list[tuple[int, str, str]]:
    """(line number, prompt, answer) per non-blank line of ``path``: :func:`read_examples`."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise DataFileError(f"task.path={path!r}: is a folder (expected a JSON-lines file)")
    if not p.is_file():
        raise DataFileError(f"task.path={path!r}: no such file (expected a JSON-lines file)")
    out: list[tuple[int, str, str]] = []
    with p.open("rb") as f:
        lineno = 0
        while True:
            raw = f.readline(MAX_LINE_BYTES + 1)
            if not raw:
                break
            lineno += 1
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                raise _line_error(path, lineno, f"longer than {MAX_LINE_BYTES} bytes (one example per line)")
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")  # a leading BOM is fine
            except UnicodeDecodeError as e:
                raise _line_error(
                    path, lineno, f"not UTF-8 text (byte {raw[e.start]:#04x} at column {e.start + 1})"
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise _line_error(path, lineno, f"not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict):
                raise _line_error(path, lineno, f"expected a JSON object, got {type(row).__name__}")
            missing = [k for k in ("prompt", "answer") if k not in row]
            if missing:
                raise _line_error(
                    path,
                    lineno,
                    f"no {' and no '.join(repr(k) for k in missing)} key (keys: {', '.join(row) or 'none'})",
                )
            if not isinstance(row["prompt"], str) or not row["prompt"].strip():
                raise _line_error(
                    path, lineno, f"'prompt' must be a non-empty string, got {row['prompt']!r:.60}"
                )
            ans = row["answer"]
            if isinstance(ans, bool) or not isinstance(ans, (str, int, float)) or not str(ans).strip():
                raise _line_error(
                    path, lineno, f"'answer' must be a non-empty string or a number, got {ans!r:.60}"
                )
            if isinstance(ans, float) and not math.isfinite(ans):  # NaN, Infinity, 1e400
                raise _line_error(path, lineno, f"'answer' must be a finite number, got {ans!r}")
            for key, text in (("prompt", row["prompt"]), ("answer", str(ans))):
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as e:  # a \ud800-\udfff escape without its pair
                    raise _line_error(
                        path,
                        lineno,
                        f"{key!r} is not text: a lone surrogate \\u{ord(text[e.start]):04x} at character "
                        f"{e.start + 1} (a \\ud800-\\udfff escape must come in a pair)",
                    ) from None
            out.append((lineno, row["prompt"], str(ans)))
    if not out:
        raise DataFileError(
            f"task.path={path!r}: {'empty file' if lineno == 0 else 'only blank lines'} (expected one JSON object per line)"
        )
    return out


def gold_problem(
    task: JsonlTask, answer: str, timeout_s: float, limit: str = "each scoring has task.verifier_timeout_s"
) -> str | None:
    """Why no completion could score on ``answer`` (it matches itself neither boxed nor as plain
    text, or its check takes longer than ``timeout_s``, as every scoring of it would), or None.
    Scored as ``task`` scores, under the loop's time limit and handling of a verifier's errors;
    ``limit``: what the time limit's message names."""
    prompt = Prompt(uid=0, text="", answer=answer)
    results = [
        score_counted(task, prompt, form, timeout_s)
        for form in (f"\\boxed{{{answer}}}", f"The answer is {answer}")
    ]
    if any(reward == 1.0 for reward, _, _ in results):
        return None
    if any(err == "timeout" for _, err, _ in results):
        return f"takes longer than {timeout_s:g} s to check against itself ({limit})"
    return "does not match itself, boxed or as plain text, so no completion could score on it"


def gold_error(path: str, lineno: int, answer: str, why: str, more: str = "") -> DataFileError:
    advice = f"write the final value alone: a number or LaTeX math{more}"
    return _line_error(path, lineno, f"'answer' {answer!r:.60} {why} ({advice})")


def _check_golds(task: JsonlTask, path: str, rows: list[tuple[int, str, str]]) -> None:
    """:class:`DataFileError` naming the first of up to :data:`SELF_CHECKED` answers, spread evenly
    over the file, that no completion could score on (:func:`gold_problem`, each under
    :data:`SELF_CHECK_S`). ``python -m scalerl.task.jsonl_check FILE`` checks every line."""
    step = max(1, len(rows) // SELF_CHECKED)
    for lineno, _, answer in rows[::step][:SELF_CHECKED]:
        why = gold_problem(task, answer, SELF_CHECK_S)
        if why is not None:
            raise gold_error(
                path,
                lineno,
                answer,
                why,
                f"; python -m scalerl.task.jsonl_check {shlex.quote(path)} checks every line",
            )


class JsonlTask:
    name = "jsonl"

    def __init__(
        self,
        path: str,
        *,
        seed: int = 1234,
        val_fraction: float = 0.05,
        num_val: int = 1000,
        check_golds: bool = True,
    ):
        # check_golds: the load's sample of answers checked against themselves (:func:`_check_golds`)
        rows = _read_rows(path)
        if len(rows) < 2:
            raise DataFileError(
                f"task.path={path!r}: needs at least 2 examples (one validates), found {len(rows)}"
            )
        if check_golds:
            _check_golds(self, path, rows)
        self.rows = rows
        prompts = [Prompt(uid=i, text=t, answer=a) for i, (_, t, a) in enumerate(rows)]
        order = list(range(len(prompts)))
        random.Random(seed).shuffle(order)
        n_val = max(1, min(num_val, int(round(len(prompts) * val_fraction)), len(prompts) - 1))
        val_idx = set(order[:n_val])
        self._val = [prompts[i] for i in sorted(val_idx)]
        self._train = [prompts[i] for i in range(len(prompts)) if i not in val_idx]

    def train_prompts(self) -> list[Prompt]:
        return list(self._train)

    def val_prompts(self) -> list[Prompt]:
        return list(self._val)

    def score(self, prompt: Prompt, completion: str) -> float:
        """As GSM and CHAMP: the answer parsed as LaTeX math (parsed as plain text, ``2^{10}`` is the
        number 2 and ``1/(n+1)`` the number 1, so a wrong ``\\boxed{2}`` or ``\\boxed{1}`` passed)."""
        return check_answer(prompt.answer, completion)

    def warmstart_examples(self, n: int, rng: random.Random) -> list[tuple[str, str]]:
        return []
