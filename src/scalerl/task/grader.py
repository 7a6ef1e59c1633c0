"""Verdicts made outside the program's process, from the plain-data results the sandbox brings back.

Two kinds of tests:

* :func:`judge_values`: expected values computed here from the reference (the templated code task):
  each result must be the same plain data, type and value (:func:`scalerl.task.plain.same`).
* :class:`CheckReplay`: a problem's own test function (HumanEval's ``def check(candidate): assert
  candidate(x) == y ...``), run **here** against the candidate's results. First, once per problem,
  the check runs with the reference solution to record the arguments of every call it makes
  (:attr:`CheckReplay.calls`, what the sandbox calls the program with). Then, for each program,
  the check runs again with a ``candidate`` that answers each call with the program's result for
  it: builtin values, so ``==``, ``abs(...) < 1e-6`` or ``poly(xs, x)`` mean what the test's author
  meant, and no object of the program is ever compared. The check's helpers (``poly``,
  ``encode_cyclic``) are the problem's own, never the program's; ``random`` is a private copy seeded
  the same way each time (HumanEval/38 draws its inputs with the global ``random``). If the check
  asks for a call the reference run did not make (its later inputs depend on earlier results, and
  this program's differ from the reference's) the program fails: it gave a different answer.

A result that is not plain data is kind ``result_type``; a function that raised where the test did
not expect it is kind ``crash``; a wrong value is a plain failure (no kind).
"""

from __future__ import annotations

import builtins
import functools
import importlib.util

from scalerl.task import plain

_SEED = 20251126


class CandidateRaised(Exception):
    """The program's function raised an exception that is not a builtin one (its name is the message)."""


class _Diverged(Exception):
    """The check asked for a call the reference run did not make."""


def judge_values(results: list, expected: list) -> tuple[bool, str | None]:
    """(passed, kind) of results against expected plain values, call by call, the first failure decides."""
    if len(results) != len(expected):
        return False, "no_report"
    for (status, value), want in zip(results, expected):
        if status == "bad":
            return False, "result_type"
        if status == "raise":
            return False, "crash"
        if not plain.same(value, want):
            return False, None
    return True, None


def _raised(name: str) -> Exception:
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        return cls(f"raised by the program ({name})")
    return CandidateRaised(name)


@functools.lru_cache(maxsize=1)
def _random_code():
    spec = importlib.util.find_spec("random")
    return spec, spec.loader.get_code("random")


def _private_random():
    """A fresh ``random`` module of its own (the process's is never touched), seeded."""
    spec, code = _random_code()
    module = importlib.util.module_from_spec(spec)
    exec(code, module.__dict__)
    module.seed(_SEED)
    return module


def _namespace(own_random: bool) -> dict:
    if not own_random:
        return {"__name__": "check"}
    rnd = _private_random()
    real_import = builtins.__import__

    def imp(name, globals=None, locals=None, fromlist=(), level=0):
        if name == "random" and level == 0:
            return rnd
        return real_import(name, globals, locals, fromlist, level)

    return {"__name__": "check", "__builtins__": {**builtins.__dict__, "__import__": imp}}


class CheckReplay:
    """A problem's test function, replayed here against a program's results (see the module)."""

    def __init__(self, header: str, solution: str, test: str, entry_point: str, check: str = "check"):
        self.entry_point, self._check = entry_point, check
        self._code = compile(header.rstrip() + "\n" + solution, f"<{entry_point} reference>", "exec")
        self._test = compile(test, f"<{entry_point} tests>", "exec")
        self._own_random = "random" in test
        self.calls = self._record()

    def _run(self, candidate) -> None:
        ns = _namespace(self._own_random)
        exec(self._code, ns)
        exec(self._test, ns)
        ns[self._check](candidate)

    def _record(self) -> list:
        """Every call the check makes of the reference solution: [entry_point, encoded args]."""
        calls: list = []
        reference = None

        def recorder(*args, **kwargs):
            if kwargs:
                raise ValueError(f"{self.entry_point}: the tests call it with keywords {sorted(kwargs)}")
            calls.append([self.entry_point, plain.encode(args)])  # before the call: it may change them
            return reference(*args)

        ns = _namespace(self._own_random)
        exec(self._code, ns)
        exec(self._test, ns)
        reference = ns[self.entry_point]
        ns[self._check](recorder)  # the reference passes its own tests (an AssertionError otherwise)
        return calls

    def judge(self, results: list) -> tuple[bool, str | None]:
        """(passed, kind): the check, run against ``results`` (one per :attr:`calls`, in order)."""
        if len(results) != len(self.calls):
            return False, "no_report"
        if any(status == "bad" for status, _ in results):
            return False, "result_type"
        answers = iter(zip(self.calls, results))

        def candidate(*args, **kwargs):
            try:
                (_, want), (status, value) = next(answers)
            except StopIteration:
                raise _Diverged from None
            if kwargs or plain.encode(args) != want:
                raise _Diverged
            if status == "ok":
                return value
            raise _raised(value)

        try:
            self._run(candidate)
        except (AssertionError, _Diverged):
            return False, None
        except Exception:  # the tests did not expect what the function raised or returned
            return False, "crash"
        return True, None
