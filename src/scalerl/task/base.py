"""What every task provides: prompts with verifiable answers, splits, and a verifier."""

from __future__ import annotations

import random
import re
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

THINK_END = "</think>"


@dataclass(frozen=True)
class Prompt:
    uid: int  # stable id within its split (train uids and val uids are disjoint)
    text: str  # what the model is given
    answer: str  # the reference answer
    difficulty: int = 0  # task-specific (addition: number of digits)
    domain: str = ""  # task=multi: which domain (task) the prompt comes from


class Task(Protocol):
    name: str

    def train_prompts(self) -> list[Prompt]: ...

    def val_prompts(self) -> list[Prompt]: ...

    def score(self, prompt: Prompt, completion: str) -> float:
        """Reward of ``completion`` (the generated text after the prompt); may raise."""
        ...

    def warmstart_examples(self, n: int, rng: random.Random) -> list[tuple[str, str]]:
        """(prompt text, target completion) pairs for the supervised warm-start."""
        ...


def final_answer(completion: str) -> str:
    """The text after the last ``</think>`` (the whole completion if there is none), stripped."""
    idx = completion.rfind(THINK_END)
    return (completion[idx + len(THINK_END) :] if idx >= 0 else completion).strip()


class VerifierTimeout(BaseException):
    """A verifier ran past its time limit. A ``BaseException``, so that a library's ``except
    Exception`` (math-verify and sympy wrap their work in them) cannot swallow it and let the rest
    of the check run without a limit."""


class ProgramFailed(Exception):
    """Raised by a verifier that runs the completion as a program (``task=code``) when the program
    failed in a way worth counting (an infinite loop, a fork bomb, a network attempt ...): it scores
    0 and is counted under ``kind`` (the loop logs ``data/verifier_<kind>``)."""

    def __init__(self, kind: str, detail: str = ""):
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


# a plain number as data files write it, which LaTeX would misread: digits grouped by spaces
# (``1 000 000`` is 1 0 0 0 0 0 0 multiplied, i.e. 0) and scientific notation (``1e3`` is 3e)
_GROUPED = re.compile(r"[-+]?\d{1,3}(?:[ \u2009\u202f]\d{3})+(?:\.\d+)?")
_SCIENTIFIC = re.compile(r"([-+]?\d+(?:\.\d+)?)[eE]([-+]?\d+)")


def gold_latex(gold: str) -> str:
    """The reference answer as LaTeX: plain numbers written with grouped digits or an exponent
    rewritten (``1 000 000`` -> ``1000000``, ``1.5e-3`` -> ``1.5 \\times 10^{-3}``), the rest as is."""
    g = gold.strip()
    if _GROUPED.fullmatch(g):
        return re.sub(r"[ \u2009\u202f]", "", g)
    m = _SCIENTIFIC.fullmatch(g)
    return f"{m[1]} \\times 10^{{{m[2]}}}" if m else g


# relations that make an answer an equation, inequality or chain: judged as a whole, since
# math-verify reads only one side (the right of ``=``, the left of a unicode ``≈``), so that
# ``43 = 42`` passed for 42. ``\\stackrel{?}{=}``-like links hold braces, so they come first.
# Unicode relations: every arrow (U+2190-21FF, U+27F0-27FF, U+2900-297F), and the relation signs of
# the mathematical operators (membership, proportion, divides, similarity, equality, order, subset,
# turnstiles, precedence), the supplemental ones (U+2A66-2AFA) and the full-width < = > (U+FF1C-FF1E)
_UNICODE_RELATIONS = (
    "\u2190-\u21ff\u27f0-\u27ff\u2900-\u297f\u2208-\u220d\u221d\u2223-\u2226\u2236-\u2292"
    "\u22a2-\u22b7\u22d0-\u22ed\u2a66-\u2afa\uff1c-\uff1e<=>"
)
_RELATION = re.compile(
    r"\\(?:stackrel|overset)\{[^{}]*\}\{[^{}]*\}"
    r"|\\(?:approx|approxeq|sim|simeq|eqsim|backsim|cong|equiv|doteq|coloneqq|coloneq|eqqcolon|eqcolon"
    r"|triangleq|to|rightarrow|Rightarrow|longrightarrow|Longrightarrow|implies|mapsto|longmapsto|gets"
    r"|leftarrow|Leftarrow|longleftarrow|Longleftarrow|leftrightarrow|impliedby|propto|asymp|le|ge|leq"
    r"|geq|leqq|geqq|leqslant|geqslant|lesssim|gtrsim|lt|gt|ll|gg|prec|succ|preceq|succeq|subset"
    r"|supset|subseteq|supseteq|in|ni|notin|models|vdash|ne|neq|not|nless|ngtr|nleq|ngeq|iff"
    r"|Leftrightarrow|lor|vee|land|wedge|lnot|neg|mid|nmid|parallel)(?![A-Za-z])"
    r"|\\[A-Za-z]*(?:arrows?|harpoons?)(?![A-Za-z])"  # every arrow command (\\hookrightarrow ...)
    rf"|<=|>=|!=|==|:=|[{_UNICODE_RELATIONS}]"
)
# the links of a chain that claim its sides equal (``\\approx`` is read as ``=``); any other
# (``<``, ``\\ne``, ``\\lor``, ``\\mapsto`` ...) makes the answer a range or a hedge, not a number
_EQUAL_LINKS = re.compile(
    r"\\(?:stackrel|overset)\{.*|\\(?:approx|approxeq|sim|simeq|eqsim|cong|equiv|doteq|coloneqq|coloneq"
    r"|triangleq|to|rightarrow|Rightarrow|longrightarrow|Longrightarrow|implies)|==?|:="
    r"|[\u2248\u223c\u2243\u2245\u2254\u2261\u225c\uff1d\u2192\u21d2\u27f6\u27f9]"
)
_GREEK = (
    "alpha|beta|gamma|delta|epsilon|varepsilon|zeta|eta|theta|vartheta|iota|kappa|lambda|mu|nu|xi|"
    "rho|sigma|tau|upsilon|phi|varphi|chi|psi|omega|Gamma|Delta|Theta|Lambda|Xi|Sigma|Phi|Psi|Omega"
)
_NAME1 = (
    r"(?:m\s*\\angle\s*|\\angle\s*)?"  # m∠ABC
    rf"(?:[A-Za-z]+|\\(?:{_GREEK})(?![A-Za-z])|\\(?:text|mathrm|mathit|operatorname)\{{[A-Za-z ]+\}}"
    r"|\\overline\{[A-Za-z]+\})"
    r"(?:\s*_\s*(?:\{[^{}]*\}|\w))?(?:\s*\^\s*(?:\{[^{}]*\}|\w))?'*"  # a_{10}, x^{(2)}, f'
    r"(?:\s*(?:\\left)?\([^()]*\))?"  # f(2), P(A)
)
# a name that states what the answer is (``x``, ``a_{10}``, ``\\theta``, ``f(2)``, ``AB``,
# ``\\text{Area}``, ``(x, y)``): it claims no value, so it may stand before the value
_NAME = re.compile(rf"\s*(?:{_NAME1}|\(\s*{_NAME1}(?:\s*,\s*{_NAME1})*\s*\))\s*")
_MAX_SIDES = 6  # a longer chain is no final answer (and each side costs a math-verify parse)


# a relation symbol, or a bracket that opens or closes a group (what the relation scans walk)
_RELATION_OR_BRACKET = re.compile(rf"{_RELATION.pattern}|[{{}}()\[\]]")


def _relations(latex: str):
    """Each relation symbol of ``latex`` (its match) with its depth in braces, brackets and
    parentheses (0: outside every group)."""
    depth = 0
    for m in _RELATION_OR_BRACKET.finditer(latex):
        tok = m.group()
        if tok in "{[(":
            depth += 1
        elif tok in "}])":
            depth -= 1
        else:
            yield m, depth


def relation_chain(latex: str) -> tuple[list[str], list[str]]:
    """(sides, links) of ``latex`` split on the relation symbols outside braces, brackets and
    parentheses: ``x = 40 + 2 = 42`` -> ``(["x ", " 40 + 2 ", " 42"], ["=", "="])``."""
    sides, links, start = [], [], 0
    for m, depth in _relations(latex):
        if depth == 0:
            sides.append(latex[start : m.start()])
            links.append(m.group())
            start = m.end()
    return [*sides, latex[start:]], links


def relation_inside(latex: str) -> bool:
    """Whether ``latex`` holds a relation symbol inside braces, brackets or parentheses
    (``(43 = 42)``, ``43 {=} 42``, ``(x \\equiv 42 \\pmod{100})``), where :func:`relation_chain`
    does not look: math-verify still reads one side of it."""
    return any(depth > 0 for _, depth in _relations(latex))


def _holds_relation(value) -> bool:
    """Whether a parsed answer (a sympy object) is or holds a relation or a logical statement."""
    from sympy import Basic
    from sympy.core.relational import Relational
    from sympy.logic.boolalg import Boolean

    return isinstance(value, Basic) and (isinstance(value, Boolean) or value.has(Relational))


def mv_parse(text: str, **kw) -> list:
    """math-verify's ``parse`` without its own SIGALRM timer: its ``signal.alarm(0)`` on return
    cancelled the loop's ``verifier_timeout_s`` timer (:func:`_time_limit`), so every later step of
    the same verification ran without a limit. The loop's limit is the one limit."""
    from math_verify import parse

    return parse(text, parsing_timeout=None, **kw)


def mv_verify(gold, target) -> bool:
    """math-verify's ``verify`` without its own SIGALRM timer (see :func:`mv_parse`)."""
    from math_verify import verify

    return verify(gold, target, timeout_seconds=None)


def _chain_holds(gold_parsed, answer: str) -> bool:
    """Whether the answer's relation chain (if any) states the gold value and nothing else: every
    link an equality, the last side the gold, and every other side a name or equal to it."""
    from math_verify import LatexExtractionConfig

    sides, links = relation_chain(answer)
    if not links:
        return True
    if len(sides) > _MAX_SIDES or not all(_EQUAL_LINKS.fullmatch(link) for link in links):
        return False

    def side(latex: str) -> list:
        # LaTeX only: with the default number fallback ``43 \\lor 42`` would be read as 42
        return mv_parse(f"${latex}$", extraction_config=[LatexExtractionConfig()])

    last = side(sides[-1].strip().rstrip(",.;"))  # ``x = 42,``
    if not (last and mv_verify(gold_parsed, last)):
        return False
    # an empty side (``= 42``) claims nothing, as a name does
    return all(not s.strip() or _NAME.fullmatch(s) or mv_verify(last, side(s)) for s in sides[:-1])


# an answer whose value is too costly to compute: sympy evaluates a power, factorial or binomial of
# integers at once, in C, where no time limit can stop it (``10^{10^{7}}`` held a verification
# for seconds, a taller tower for hours). No final answer needs these, so they score 0 unparsed.
_MAX_DIGITS = 5  # of an integer in an exponent, a factorial or a binomial
_POWER = re.compile(r"\^|\*\*")
_FACTORIAL = re.compile(r"(\d+|[)}\]])\s*!")
_BINOMIAL = re.compile(r"\\(?:[dt]?binom|choose)(?![A-Za-z])")
_LONG_INT = re.compile(rf"\d{{{_MAX_DIGITS + 1},}}")


def _group_before(text: str, end: int) -> str:
    """The bracketed group that closes at ``text[end]`` (``)``, ``}`` or ``]``), or ``""``."""
    depth = 0
    for i in range(end, -1, -1):
        depth += text[i] in ")}]"
        depth -= text[i] in "({["
        if depth == 0:
            return text[i : end + 1]
    return ""


def _exponent(text: str, at: int) -> str:
    """The exponent that starts at ``text[at]`` (after ``^`` or ``**``): a braced or bracketed
    group, else the run of digits, or the one character, there."""
    rest = text[at:].lstrip()
    if rest[:1] in ("{", "(", "["):
        depth = 0
        for i, c in enumerate(rest):
            depth += c in "{(["
            depth -= c in "})]"
            if depth == 0:
                return rest[: i + 1]
        return rest
    digits = re.match(r"[-+]?\d+", rest)
    return digits.group() if digits else rest[:1]


def too_costly(text: str) -> bool:
    """Whether ``text`` holds a power whose exponent is itself a power or factorial or has an
    integer over ``_MAX_DIGITS`` digits, such a factorial, or a binomial with such an integer."""
    for m in _POWER.finditer(text):
        exp = _exponent(text, m.end())
        after = text[m.end() :].lstrip()[len(exp) :].lstrip()  # ``10**10**7``: a tower too
        if _POWER.search(exp) or _POWER.match(after) or "!" in exp or _LONG_INT.search(exp):
            return True
    for m in _FACTORIAL.finditer(text):
        arg = m.group(1) if m.group(1)[0].isdigit() else _group_before(text, m.start(1))
        if _LONG_INT.search(arg) or _POWER.search(arg) or "!" in arg:
            return True
    return bool(_BINOMIAL.search(text) and _LONG_INT.search(text))


# math-verify compares numbers rounded to 6 decimals, which keeps few or none of a small number's
# digits: ``0.0`` passed for 6.626e-34. Below ``_SMALL`` in size, the answer must also agree with
# the gold to ``_SMALL_RTOL`` of its size (its first three significant digits).
_SMALL, _SMALL_RTOL = 0.1, 1e-3


def _same_scale(gold, pred) -> bool:
    """False where both are real numbers (an assignment's value: ``x = 0.0``), the gold nonzero and
    smaller than ``_SMALL``, and the answer farther from it than ``_SMALL_RTOL`` of its size."""
    from sympy import And, Expr
    from sympy.core.relational import Relational

    if isinstance(pred, And) and pred.args:
        pred = pred.args[-1]
    if isinstance(pred, Relational):
        pred = pred.rhs
    if not (isinstance(gold, Expr) and isinstance(pred, Expr) and gold.is_number and pred.is_number):
        return True
    try:
        g, p = complex(gold), complex(pred)
    except (TypeError, ValueError, OverflowError):
        return True
    if g.imag or p.imag or g.real == 0 or abs(g.real) >= _SMALL:
        return True
    return abs(p.real - g.real) <= _SMALL_RTOL * abs(g.real)


def _text_verifies(gold_parsed, text: str) -> bool:
    """Whether the answer's text as math-verify extracted it (the boxed content, the formula) reads
    as LaTeX by itself and verifies against the gold. math-verify falls back to a number it finds in
    a formula it cannot read: ``\\boxed{43 \\equal 42}`` and ``$43 ) 42$`` passed for 42."""
    from math_verify import LatexExtractionConfig

    if all(isinstance(v, str) for v in gold_parsed):
        return True  # a gold math-verify cannot read either: compared as text, no number taken
    read = mv_parse(f"${text}$", extraction_config=[LatexExtractionConfig()])
    values = [v for v in read if not isinstance(v, str)]
    return bool(values) and mv_verify(gold_parsed, values)


def _assigned(gold_tex: str) -> str | None:
    """The value of a gold answer that assigns one to a name (``x = 2`` -> ``2``), else None."""
    sides, links = relation_chain(gold_tex)
    if len(links) != 1 or not _EQUAL_LINKS.fullmatch(links[0]) or relation_inside(gold_tex):
        return None
    return sides[1].strip() if _NAME.fullmatch(sides[0]) and sides[1].strip() else None


def check_answer(gold: str, completion: str) -> float:
    """1.0 iff math-verify finds the gold answer in the completion (its last ``\\boxed{}``, else
    its last number or formula), else 0.0. The gold answer is parsed as LaTeX math (so ``1/(n+1)``
    is a formula, not the number 1; :func:`gold_latex`).

    An answer that is a relation (``=``, ``\\approx``, ``<``, ``\\ne`` ..., or a chain of them;
    :func:`relation_chain`) is judged as a whole when the gold answer is not one: math-verify
    reads only one side, so ``\\boxed{43 = 42}`` passed for 42. It scores 1 only if every link
    is an equality (``\\approx`` counts as ``=``), its last side verifies against the gold, and
    every other side is either a name (``x``, ``a_{10}``, ``f(2)``, ``\\text{Area}``, ``(x, y)``)
    or verifies equal to the last side: ``x = 42``, ``x \\approx 42`` and the true
    ``40 + 2 = 42`` score 1; ``43 = 42``, ``x = 43 = 42``, ``41 \\approx 42``, ``x < 43`` and
    ``x^2 + 1 = 42`` score 0. A relation inside brackets (``(43 = 42)``, ``43 {=} 42``), or one
    the parsed answer holds but its text does not show, scores 0. A gold answer that is itself a
    relation is compared as math-verify compares it, but one that assigns a value to a name
    (``x = 2``) is judged by that value as above (``x = 3 = 2`` scores 0). An answer whose value would take too long to compute (:func:`too_costly`:
    ``10^{10^{7}}``, ``123456!``) scores 0 without being parsed. A gold number smaller than 0.1
    needs its first three significant digits (:func:`_same_scale`), which math-verify's rounding
    to 6 decimals alone does not ask: ``0.0`` passed for 6.626e-34.

    The extracted text, unless a chain (whose sides are read one by one), must itself read as LaTeX
    and verify (:func:`_text_verifies`): a number
    math-verify falls back to inside a formula it cannot read (``\\boxed{43 \\equal 42}``) scores 0.
    A plain-text answer is still read by its last number (``43 or 42`` scores 1 for 42)."""
    answer = final_answer(completion)
    if too_costly(answer):
        return 0.0
    gold_tex = gold_latex(gold)
    gold_parsed = mv_parse(f"${gold_tex}$")
    pred = mv_parse(answer)
    if not (gold_parsed and pred and mv_verify(gold_parsed, pred)):
        return 0.0
    value = _assigned(gold_tex)  # a gold ``x = 2`` is judged by its value, as a number's is
    if value is not None and (parsed := mv_parse(f"${value}$")):
        gold_tex, gold_parsed = value, parsed
    if not _same_scale(gold_parsed[0], pred[0]):
        return 0.0
    # pred[-1]: the answer's text as math-verify extracted it (the boxed content, normalized)
    text = pred[-1] if isinstance(pred[-1], str) else ""
    if text and not relation_chain(text)[1] and not _text_verifies(gold_parsed, text):
        return 0.0
    if relation_chain(gold_tex)[1] or relation_inside(gold_tex) or _holds_relation(gold_parsed[0]):
        return 1.0  # a relation as the gold answer: compared as math-verify compares it
    if relation_inside(text):
        return 0.0
    if _holds_relation(pred[0]) and not relation_chain(text)[1]:
        return 0.0  # parsed as a relation its text does not show (``$43 = 42$ so $?$``)
    return 1.0 if _chain_holds(gold_parsed, text) else 0.0


@contextmanager
def _time_limit(seconds: float):
    """Raise :class:`VerifierTimeout` in the block once it has run ``seconds``, and again every
    ``_REPEAT_S`` after that while it still runs (a bare ``except:`` that swallowed the first one
    does not end the limit). SIGALRM works only in the main thread; elsewhere the verifier runs
    without a limit."""
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return
    armed = [True]

    def handler(signum, frame):
        if armed[0]:  # a late signal, after the block, raises nothing
            raise VerifierTimeout(f"verifier took longer than {seconds}s")

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds, _REPEAT_S)
    try:
        yield
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


_REPEAT_S = 0.05


def safe_score(task: Task, prompt: Prompt, completion: str, timeout_s: float) -> tuple[float, str | None]:
    """Score with a time limit; a verifier that raises or times out scores 0 and says why."""
    reward, err, _ = score_counted(task, prompt, completion, timeout_s)
    return reward, err


def score_counted(
    task: Task, prompt: Prompt, completion: str, timeout_s: float
) -> tuple[float, str | None, str | None]:
    """(reward, verifier error, program failure kind): like :func:`safe_score`, and a program that
    failed (:class:`ProgramFailed`) scores 0 with its kind (not a verifier error)."""
    try:
        with _time_limit(timeout_s):
            return float(task.score(prompt, completion)), None, None
    except ProgramFailed as e:
        return 0.0, None, e.kind
    except VerifierTimeout:
        return 0.0, "timeout", None
    except Exception as e:  # a broken verifier must never kill the run
        return 0.0, f"error: {type(e).__name__}", None
