"""Real data: a JSON-lines file of ``{"prompt": ..., "answer": ...}``, answers checked by math-verify."""

from __future__ import annotations

import json
import random
from pathlib import Path

from scalerl.task.base import Prompt, final_answer


class DataFileError(ValueError):
    """A malformed data file; the message is one line naming the file, the line and the problem."""


class JsonlTask:
    name = "jsonl"

    def __init__(self, path: str, *, seed: int = 1234, val_fraction: float = 0.05, num_val: int = 1000):
        p = Path(path)
        if not p.is_file():
            raise DataFileError(f"task.path={path!r}: no such file (expected a JSON-lines file)")
        prompts = []
        with p.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataFileError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
                if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or "answer" not in row:
                    raise DataFileError(
                        f"{path}:{lineno}: expected an object with a string 'prompt' and an 'answer', "
                        f"got {line.strip()[:60]!r}"
                    )
                prompts.append(Prompt(uid=len(prompts), text=row["prompt"], answer=str(row["answer"])))
        if len(prompts) < 2:
            raise DataFileError(f"{path}: needs at least 2 examples, found {len(prompts)}")
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
        from math_verify import parse, verify

        gold = parse(prompt.answer)
        pred = parse(final_answer(completion))
        return 1.0 if verify(gold, pred) else 0.0

    def warmstart_examples(self, n: int, rng: random.Random) -> list[tuple[str, str]]:
        return []
