"""The math verifier: whether a completion's final answer is the gold answer (:func:`check_answer`),
by math-verify, with the rules that keep a policy from being rewarded for what is not that answer
alone (a relation read on one side, a formula math-verify cannot read, a hedge, a value too costly
to compute, a small number rounded away)."""

from __future__ import annotations

import re
from decimal import Decimal

from scalerl.task.base import final_answer

# a plain number as data files write it, which LaTeX would misread: digits grouped by spaces
# (``1 000 000`` is 1 0 0 0 0 0 0 multiplied, i.e. 0) and scientific notation (``1e3`` is 3e)
_GROUPED = re.compile(r"[-+]?\d{1,3}(?:[ \u2009\u202f]\d{3})+(?:\.\d+)?")
# a number in scientific notation in a plain-text answer (no box, no formula), not part of a word
# or a longer number
_SCIENTIFIC_IN_TEXT = re.compile(r"(?<![\w\\.])(\d+(?:\.\d+)?)[eE]([-+]?\d+)(?!\w|\.\d)")
_MATH_OPEN = re.compile(r"\$|\\\(|\\\[|\\begin\{")
# where such a number is the final value of a formula (group 1; its mantissa and exponent follow):
# all a box holds, or the last side of what it holds (``h = 6.626e-34``, ``P(X) \approx 1e-6``),
# a unit after it allowed (``1e-6 \text{ m}``, ``^2``); in a formula without a box, the same at its end
_SCIENTIFIC_LITERAL = r"(([-+]?\d+(?:\.\d+)?)[eE]([-+]?\d+))"
_UNIT = r"(?:\\(?:text|mathrm)\s*\{[^{}]*\}\s*(?:\^\s*(?:\{[^{}]*\}|\d)\s*)?)?"
_BOXED_SCIENTIFIC = re.compile(rf"(?:.*(?:=|\\approx))?\s*{_SCIENTIFIC_LITERAL}\s*{_UNIT}", re.DOTALL)
_FINAL_SCIENTIFIC = re.compile(
    rf"(?:^|\$|\\\(|\\\[|=|\\approx)\s*{_SCIENTIFIC_LITERAL}\s*{_UNIT}(?:\$\$?|\\\)|\\\])\s*(?:[.!]\s*)?$"
)


def _scientific(m: re.Match, latex: bool = True) -> str:
    """A number in scientific notation (its mantissa and exponent: ``m``'s last two groups) as LaTeX
    (``1.5 \\times 10^{-3}``, as :func:`gold_latex` writes a gold, which :func:`too_costly` weighs),
    or with ``latex=False`` (plain text, which math-verify reads as a number) as a plain decimal
    where its exponent is at most 100."""
    mantissa, exponent = m.groups()[-2:]
    if latex or len(exponent.lstrip("+-").lstrip("0")) > 3 or abs(int(exponent)) > 100:
        return f"{mantissa} \\times 10^{{{exponent}}}"
    text = format(Decimal(f"{mantissa}e{exponent}"), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _scientific_answer(answer: str) -> str:
    """The answer with a final value in scientific notation (``1e-06``, as a JSON number's gold is
    written) rewritten as a number: in its last box (:data:`_BOXED_SCIENTIFIC`), at the end of its
    final formula (:data:`_FINAL_SCIENTIFIC`), or each one of a plain-text answer. As LaTeX
    ``1e-06`` is 1 times Euler's e minus 6, and inside a formula it may well be (``e^2 - 2e+1``):
    a literal that is not the final value is left as it is."""
    spans = _box_spans(answer)
    if spans:
        _, start, end = spans[-1]
        m = _BOXED_SCIENTIFIC.fullmatch(answer, start, end)
    elif _MATH_OPEN.search(answer):
        m = _FINAL_SCIENTIFIC.search(answer)
    else:
        return _SCIENTIFIC_IN_TEXT.sub(lambda m: _scientific(m, latex=False), answer)
    return answer if m is None else f"{answer[: m.start(1)]}{_scientific(m)}{answer[m.end(1) :]}"


def gold_latex(gold: str) -> str:
    """The reference answer as LaTeX: plain numbers written with grouped digits or an exponent
    rewritten (``1 000 000`` -> ``1000000``, ``1.5e-3`` -> ``1.5 \\times 10^{-3}``, also as the
    last side of a formula: ``x = 1e-3``, as an answer's box is read), the rest as is."""
    g = gold.strip()
    if _GROUPED.fullmatch(g):
        return re.sub(r"[ \u2009\u202f]", "", g)
    m = _BOXED_SCIENTIFIC.fullmatch(g)
    return f"{g[: m.start(1)]}{_scientific(m)}{g[m.end(1) :]}" if m else g


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
    r"|triangleq|to|rightarrow|Rightarrow|longrightarrow|Longrightarrow|implies|in)|==?|:="
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
    from sympy import Basic, Symbol
    from sympy.core.relational import Relational
    from sympy.logic.boolalg import Boolean

    # a name (``B``, ``\\text{42}``) is a sympy Symbol, which sympy counts as a Boolean: not a statement
    statement = isinstance(value, Boolean) and not isinstance(value, Symbol)
    return isinstance(value, Basic) and (statement or value.has(Relational))


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


_APPROX_LINK = re.compile(r"\\(?:approx|approxeq|doteq)|\u2248")
_DECIMAL = re.compile(r"[-+]?\d+\.(\d+)")


def _rounds_gold(gold, link: str, side: str) -> bool:
    """Whether ``link side`` (``\\approx 1.732``) is the gold rounded to the decimals it shows (within
    half a unit of its last digit): the exact side before it is then the answer."""
    m = _DECIMAL.fullmatch(side.strip().rstrip(",.;"))
    g = _real(gold) if m and _APPROX_LINK.fullmatch(link) and getattr(gold, "is_number", False) else None
    return g is not None and abs(float(m.group()) - g) <= 0.5 * 10 ** -len(m.group(1)) * (1 + 1e-9)


def _top_level_parts(latex: str) -> list[str]:
    """``latex`` split on its commas outside braces, brackets and parentheses."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(latex):
        depth += c in "{[("
        depth -= c in "}])"
        if c == "," and depth == 0:
            parts.append(latex[start:i])
            start = i + 1
    return [*parts, latex[start:]]


def _assignments(latex: str, *, by_name: bool = True) -> str | None:
    """The values of a list of assignments as one answer: ``x = 3, y = 5`` -> ``(3, 5)`` (names that
    differ: a tuple, in the names' order where ``by_name`` (``y = 5, x = 3`` is ``(3, 5)`` too), else
    as written), ``x = 1, x = 3`` ->
    ``\\{1, 3\\}`` (one name: its values); None where ``latex`` is not two or more ``name = value``
    parts (the chain rule reads it as it is)."""
    parts = _top_level_parts(latex)
    if len(parts) < 2 or len(parts) > _MAX_SIDES:
        return None
    named = []
    for part in parts:
        sides, links = relation_chain(part)
        if len(links) != 1 or not _EQUAL_LINKS.fullmatch(links[0]) or not _NAME.fullmatch(sides[0]):
            return None
        named.append((re.sub(r"\s+", "", sides[0]), sides[1].strip()))
    if len({n for n, _ in named}) == 1:
        return "\\{" + ", ".join(v for _, v in named) + "\\}"
    # in the names' order (x, y, z) where the gold names them too, else as written: ``r = 2, \\theta =
    # \\frac{\\pi}{3}`` is the point (2, pi/3) of a gold that names no coordinates
    return "(" + ", ".join(v for _, v in (sorted(named) if by_name else named)) + ")"


def _chain_holds(gold_parsed, answer: str) -> bool:
    """Whether the answer's relation chain (if any) states the gold value and nothing else: every
    link an equality, the last side the gold, and every other side a name or equal to it."""
    from math_verify import LatexExtractionConfig

    sides, links = relation_chain(answer)
    if not links:
        return True
    if len(sides) > _MAX_SIDES or not all(_EQUAL_LINKS.fullmatch(link) for link in links):
        return False
    if _rounds_gold(gold_parsed[0], links[-1], sides[-1]):  # ``\sqrt{3} \approx 1.732``
        sides, links = sides[:-1], links[:-1]  # judged by the exact value it rounds

    def side(latex: str) -> list:
        # LaTeX only: with the default number fallback ``43 \\lor 42`` would be read as 42
        return mv_parse(f"${latex}$", extraction_config=[LatexExtractionConfig()])

    last = side(sides[-1].strip().rstrip(",.;"))  # ``x = 42,``
    if not (last and _equal_sides(gold_parsed, last)):
        return False
    # an empty side (``= 42``) claims nothing, as a name does
    return all(not s.strip() or _NAME.fullmatch(s) or _equal_sides(last, side(s)) for s in sides[:-1])


def _equal_sides(one: list, other: list) -> bool:
    """Two parsed sides of a chain equal, a small number by its own digits too (math-verify rounds
    to 6 decimals: ``6.626 \\times 10^{-34} = 1.602 \\times 10^{-19}`` held, and passed for both)."""
    return (
        bool(other)
        and mv_verify(one, other)
        and _same_scale(one[0], other[0])
        and _same_scale(other[0], one[0])
    )


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


def _exponent_digits(exp: str) -> int:
    """The digits of the integers in an exponent together (``99999 \\cdot 99999``: 10; decimals'
    fractional digits not counted): a product of them is as long as their digits."""
    return sum(len(d) for d in re.findall(r"(?<![.\d])\d+", exp))


def too_costly(text: str) -> bool:
    """Whether ``text`` holds a power whose exponent is itself a power or factorial or has integers
    of over ``_MAX_DIGITS`` digits together (``2^{99999 \\cdot 99999}``), such a factorial, or a
    binomial with such an integer."""
    for m in _POWER.finditer(text):
        exp = _exponent(text, m.end())
        after = text[m.end() :].lstrip()[len(exp) :].lstrip()  # ``10**10**7``: a tower too
        if _POWER.search(exp) or _POWER.match(after) or "!" in exp or _exponent_digits(exp) > _MAX_DIGITS:
            return True
    for m in _FACTORIAL.finditer(text):
        arg = m.group(1) if m.group(1)[0].isdigit() else _group_before(text, m.start(1))
        if _LONG_INT.search(arg) or _POWER.search(arg) or "!" in arg:
            return True
    return bool(_BINOMIAL.search(text) and _LONG_INT.search(text))


# math-verify compares numbers rounded to 6 decimals, which keeps few or none of a small number's
# digits: ``0.0`` passed for 6.626e-34, also as ``\{0.0\}``, ``x = y = 0.0`` or ``0.0 y``. Below
# ``_SMALL`` in size, some number of the answer must agree with the gold to ``_SMALL_RTOL`` of its
# size (its first three significant digits).
_SMALL, _SMALL_RTOL = 0.1, 1e-3
# an integer gold of more digits than a float holds exactly is matched by a float within its 53-bit
# rounding: ``2.43290200817664 \times 10^{18}`` passed for hundreds of integers around 20!
_EXACT_DIGITS = 15


def _numbers(value):
    """The numbers of a parsed answer: itself where it is one, else those of its parts (a set's
    elements, a relation's sides, an interval's ends, a product's factors)."""
    from sympy import Basic, Expr

    if isinstance(value, Expr) and value.is_number:
        yield value
    elif isinstance(value, Basic):
        for arg in value.args:
            yield from _numbers(arg)


def _real(value) -> float | None:
    """A sympy number as a float (evaluated: math-verify leaves ``1%`` as ``1 * (1/100)`` unevaluated),
    None where it is not a real number."""
    try:
        c = complex(value.doit().evalf() if hasattr(value, "doit") else value)
    except (TypeError, ValueError, OverflowError):
        return None
    return None if c.imag else c.real


def _same_scale(gold, pred) -> bool:
    """False where the gold is a real number smaller than ``_SMALL`` and no number of the answer is
    within ``_SMALL_RTOL`` of its size (of a gold 0: no number of the answer 0); True otherwise."""
    from sympy import Expr

    g = _real(gold) if isinstance(gold, Expr) and gold.is_number else None
    if g is None or abs(g) >= _SMALL:
        return True
    if g == 0:  # ``0.0``: a zero of the answer, not a number that rounds to one (``10^{-7}``)
        return any(_real(n) == 0 for n in _numbers(pred))
    return any((p := _real(n)) is not None and abs(p - g) <= _SMALL_RTOL * abs(g) for n in _numbers(pred))


def _rounded_integer(gold, pred) -> bool:
    """Whether the gold is an integer of more than ``_EXACT_DIGITS`` digits and the answer holds a
    float, which cannot tell it from its neighbours."""
    from sympy import Float, Integer

    return isinstance(gold, Integer) and abs(int(gold)) >= 10**_EXACT_DIGITS and bool(pred.atoms(Float))


def _kind(value) -> str:
    """``range`` (an interval, a union or complement of them, an inequality, a name set in one),
    ``pair`` (a tuple, or an open interval with finite ends: math-verify reads ``(1, 3)`` so), else
    ``other`` (a number, a set, an expression)."""
    from sympy import And, Complement, Eq, Interval, Or, Tuple, Union
    from sympy.core.relational import Relational

    if isinstance(value, Tuple):
        return "pair"  # ``(1, 2, 3)``: a point, as a pair is
    if isinstance(value, Eq) and isinstance(value.rhs, (Interval, Union, Complement)):
        value = value.rhs  # ``x \\in (1, 3)``
    if isinstance(value, Interval):
        finite = value.start.is_finite and value.end.is_finite
        return "pair" if value.left_open and value.right_open and finite else "range"
    if isinstance(value, (Union, Complement)) or (
        isinstance(value, Relational) and not isinstance(value, Eq)
    ):
        return "range"
    if isinstance(value, (And, Or)) and value.args and all(_kind(a) == "range" for a in value.args):
        return "range"
    return "other"


# which kinds of answer a gold of each kind admits: a range its range or the pair of its ends; a pair
# (a tuple or an open interval) those or named points (``x = 3, y = 5``); anything else neither
_ADMITS = {"range": {"range", "pair"}, "pair": {"range", "pair", "point"}, "other": {"other"}}


# a hedge math-verify drops as units: a trailing ``\\text{...}`` (``42 \\text{ (or 43)}``) that holds
# a number of its own or a word of choice or of size (units such as ``m/s^2`` or ``cups of flour and
# sugar`` are none); and a subscript on a number other than a base (``42^{+1}_{-1}``, ``42_{43}``;
# ``1011_2`` and ``42_{10}`` are bases)
_TEXT_GROUP = r"\\(?:text|mbox|textbf|textrm|textit|textnormal|mathrm|mathbf|mathit)\s*\{([^{}]*)\}"
_TRAILING_TEXT = re.compile(rf"{_TEXT_GROUP}(?:\s*\^\s*(?:\{{[^{{}}]*\}}|\S))?$")
_HEDGE_WORDS = re.compile(
    r"(?<![\w^])\d+(?:\.\d+)?(?!\w)|[\u00b2\u00b3\u00b9\u2070-\u209f\u00bc-\u00be\u2150-\u215f?]"
    r"|\b(?:or|maybe|either|perhaps|possibly|wrong|incorrect|false|unsure|uncertain|guess|negative"
    r"|squared|cubed|percent|per cent|pct|half|halves|(?:hundred|thousand|million|billion|trillion|dozen"
    r"|tenth|hundredth|thousandth|quarter|third)s?|zero|one|two|three|four|five|six|seven|eight|nine"
    r"|ten|eleven|twelve|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety)\b",
    re.IGNORECASE,
)
_NUMBER_SUBSCRIPT = re.compile(
    r"\d\s*(?:\^\s*(?:\{[^{}]*\}|\S)\s*)?_(?!\s*(?:\{\s*)?(?:[2-9]|[12]\d|3[0-6])\b\s*\}?\s*$)"
)
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")


def _final_formula(answer: str) -> tuple[str, str] | None:
    """The formula the answer ends with (trailing punctuation aside), as ``(formula, content)``: a
    ``\\boxed{}`` (or ``\\fbox{}``), a ``$...$``, ``$$...$$``, ``\\(...\\)`` or ``\\[...\\]``; None
    where it ends in plain text."""
    text = answer.rstrip().rstrip(".,;:!").rstrip()
    if text.endswith("\\$"):
        return None  # a dollar sign (``42\\$``), not the end of a formula
    for close, opening in (("$$", "$$"), ("$", "$"), ("\\)", "\\("), ("\\]", "\\[")):
        if text.endswith(close):
            at = text.rfind(opening, 0, len(text) - len(close))
            while opening == "$" and at > 0 and text[at - 1] == "\\":  # ``\\$`` opens nothing
                at = text.rfind(opening, 0, at - 1)
            if at >= 0:
                return text[at:], text[at + len(opening) : len(text) - len(close)].strip()
            return None
    if not text.endswith("}"):
        return None
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        depth += text[i] == "}"
        depth -= text[i] == "{"
        if depth == 0:
            box = [m for m in _BOX.finditer(text[: i + 1]) if m.end() == i + 1]
            return (text[box[0].start() :], text[i + 1 : -1].strip()) if box else None
    return None


def _box_spans(text: str) -> list[tuple[int, int, int]]:
    """The outermost ``\\boxed{}`` (or ``\\fbox{}``) of ``text`` as (start, content start, end)."""
    spans, at = [], 0
    for m in _BOX.finditer(text):
        if m.start() < at:
            continue  # inside a box already taken
        depth, end = 1, len(text)
        for i in range(m.end(), len(text)):
            depth += text[i] == "{"
            depth -= text[i] == "}"
            if depth == 0:
                end = i
                break
        spans.append((m.start(), m.end(), end))
        at = end + 1
    return spans


def _unboxed(text: str) -> str:
    """``text`` with every box replaced by what it holds (``\\boxed{\\boxed{42} + 1}`` -> ``42 + 1``),
    in one pass: each ``\\boxed{`` and the brace that closes it dropped."""
    out, stack, i = [], [], 0
    while i < len(text):
        m = _BOX.match(text, i)
        if m:
            stack.append(True)
            i = m.end()
            continue
        c = text[i]
        if c == "{":
            stack.append(False)
        if not (c == "}" and stack and stack.pop()):
            out.append(c)
        i += 1
    return "".join(out)


_CLOSING = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}
_BEGIN = re.compile(r"\\begin\s*\{([A-Za-z*]+)\}")


def _closing(opener: str) -> str:
    m = _BEGIN.fullmatch(opener)
    return f"\\end{{{m.group(1)}}}" if m else _CLOSING[opener]


def _math_open_at(text: str, pos: int) -> tuple[int, int, str] | None:
    """The math environment open at ``text[pos]`` (``$``, ``$$``, ``\\(``, ``\\[``, ``\\begin{...}``)
    as (its start, its content's start, its opener), or None."""
    i, open_ = 0, None
    while i < pos:
        if text.startswith("\\$", i):  # a dollar sign, not a delimiter
            i += 2
        elif open_ is None:
            m = _BEGIN.match(text, i)
            opener = m.group(0) if m else next((o for o in _CLOSING if text.startswith(o, i)), None)
            if opener is None:
                i += 1
            else:
                open_ = (i, i + len(opener), opener)
                i += len(opener)
        elif text.startswith(_closing(open_[2]), i):
            i += len(_closing(open_[2]))
            open_ = None
        else:
            i += 1
    return open_


def _unbox_inner(answer: str) -> str:
    """The answer with the formula around its last ``\\boxed{}`` written unboxed where it holds other
    terms beside the box (``$43 \\neq \\boxed{42}$ indeed`` -> ``$43 \\neq 42$``, ``\\boxed{\\boxed{42}
    + 1}`` -> ``$42 + 1$``): math-verify reads only the box, which the formula around it may deny.
    As it is otherwise (``$\\boxed{42}$``, a box in text)."""
    spans = _box_spans(answer)
    if not spans:
        return answer
    start, inner, end = spans[-1]
    if _BOX.search(answer, inner, end):  # a box in the box: the outer one is the formula
        env_start, content_start, content_end, env_end = start, inner, end, end + 1
    elif (open_ := _math_open_at(answer, start)) is not None:
        env_start, content_start, opener = open_
        content_end = answer.find(_closing(opener), end + 1)
        while opener == "$" and content_end > 0 and answer[content_end - 1] == "\\":
            content_end = answer.find("$", content_end + 1)
        content_end = len(answer) if content_end < 0 else content_end
        env_end = min(len(answer), content_end + len(_closing(opener)))
    else:
        return answer
    content = answer[content_start:content_end]
    around = content.replace(answer[start : end + 1], "", 1) if env_start != start else ""
    if env_start != start and not around.strip(" \t\n.,;:&"):
        return answer  # ``$\\boxed{42}$``: the box is the whole formula
    aligned = content.replace("&", "")  # ``x &= \\boxed{42}`` in an align environment
    return f"{answer[:env_start]}${_unboxed(aligned)}${answer[env_end:]}"


def _final_formula_hedges(answer: str, gold_tex: str, gold) -> bool:
    """Whether the formula the answer ends with (:func:`_final_formula`) is one math-verify cannot
    read as LaTeX (it then took a number from inside it: ``\\boxed{43 \\equal 42}`` and ``$43 ) 42$``
    passed for 42), or hides a hedge where it reads only a part (a trailing ``\\text{ (or 43)}``, a
    subscript on a number the gold does not have). A plain-text ending is not judged here."""
    from math_verify import LatexExtractionConfig

    spans = _box_spans(answer)
    if spans:  # math-verify reads the last box first, whatever follows it
        start, inner, end = spans[-1]
        found = (answer[start : end + 1], answer[inner:end].strip())
    else:
        found = _final_formula(answer)
    if found is None or not re.search(r"\w", _COMMAND.sub("", found[1])):
        return False  # plain text, or a formula of no value (``$\\Box$``, ``$\\qed$``)
    formula, content = found
    trailing = _TRAILING_TEXT.search(content)
    if trailing and trailing.start() > 0 and _HEDGE_WORDS.search(trailing.group(1)):
        return True
    if _NUMBER_SUBSCRIPT.search(content) and "_" not in gold_tex:
        return True
    if isinstance(gold, str) or relation_chain(content)[1]:
        # a gold math-verify cannot read either is compared as text (no number taken); a chain's
        # sides are read one by one (:func:`_chain_holds`)
        return False
    # a percent sign aside (math-verify reads ``50\\%`` only with its number fallback)
    read = mv_parse(re.sub(r"\\?%", "", formula), extraction_config=[LatexExtractionConfig()])
    return not any(not isinstance(v, str) for v in read)


# a gold that is an order of choices (``BAC``, ``C, A, B``, ``(B), (A)``): sympy reads letters as a
# product or a set, whose order it sorts away
_CHOICES = re.compile(r"\s*\(?[A-Z]\)?(?:\s*,?\s*\(?[A-Z]\)?)+\s*")
_COMMAND = re.compile(r"\\[A-Za-z]+")


def _percent_differs(gold_tex: str, gold, pred) -> bool:
    """Whether math-verify matches the answer also to the gold over 100, the gold not written as a
    percentage: it reads ``50%`` (also ``50 percent``, ``$50$%``, ``50 pct``) both as 50 and as 0.5,
    so one answer passed for both. The answer is then a percentage and passes for 0.5 only."""
    g = _real(gold) if getattr(gold, "is_number", False) else None
    # (below 1e-3, math-verify's 6 decimals cannot tell the gold from its hundredth anyway; an
    # infinite gold is its own hundredth)
    if "%" in gold_tex or g is None or abs(g) < 1e-3 or gold.is_infinite:
        return False
    return mv_verify([gold / 100], [pred])


def _choices_differ(gold_tex: str, text: str) -> bool:
    """Whether the gold is an order of choices (:data:`_CHOICES`) and the answer's text does not list
    the same letters in the same order: ``ABC`` passed for ``BAC``."""
    if not _CHOICES.fullmatch(_COMMAND.sub("", gold_tex).replace("{", "").replace("}", "")):
        return False
    letters = "".join(re.findall(r"[A-Za-z]", _COMMAND.sub("", text))).upper()
    return letters != "".join(re.findall(r"[A-Z]", _COMMAND.sub("", gold_tex)))


# after the last box: the math environment it closes, then no other box, no formula holding a number
# and no number offered as another choice (``\\boxed{42}, or perhaps $43$``, ``\\boxed{42} \\text{ or }
# 43``); a remark (``\\boxed{42} (rounded to 2 decimal places)``) or a mark (``$\\qed$``) may follow
_CLOSERS = re.compile(r"^\s*(?:\$\$?|\\\]|\\\))")
_ANOTHER_VALUE = re.compile(
    r"\\boxed|\\fbox|\$[^$]*\d|\\[(\[][^)\]]*\d"
    # the formula goes on past the box: ``\\boxed{42} + 1``, ``\\boxed{42}^2``, ``\\boxed{42} \\lor 43``
    r"|^\s*(?:[-+*/^_=<>|!]|\\(?:times|cdot|div|pm|mp|ne|neq|lor|vee|land|wedge|le|ge|leq|geq|lt|gt"
    r"|approx|equiv|sim|to|implies|mod|pmod)(?![A-Za-z]))"
    r"|\b(?:or|otherwise|else|instead|correction|alternatively|actually|perhaps|maybe|possibly|either)\b"
    r"[^.\n]{0,80}?(?:(?<!\^)\d|\\infty|\b(?:zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve"
    r"|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|hundred)\b)",
    re.IGNORECASE,
)


def _after_the_box(answer: str) -> str:
    """What the answer writes after its last ``\\boxed{}`` (``""`` where it has none, or that box is
    not closed): the boxes as :func:`_box_spans` finds them (after :func:`_unbox_inner`, the last one
    holds no other)."""
    spans = _box_spans(answer)
    return answer[spans[-1][2] + 1 :] if spans else ""


def _looser_than_claimed(gold_tex: str, gold, pred, answer: str, text: str, kind: str | None = None) -> bool:
    """Whether math-verify's match of ``pred`` (the answer's value) to ``gold`` is looser than what the
    answer states: a small number matched by rounding (:func:`_same_scale`), a long integer by a float
    (:func:`_rounded_integer`), a range by points or points by a range (``\\{1, 3\\}`` and
    ``(1, 3)``: an interval to math-verify; :func:`_kind`, ``kind``: the answer's where the caller
    knows it), a percentage by its number (:func:`_percent_differs`),
    choices in another order (:func:`_choices_differ`), a box followed by another value (``\\boxed{42}
    \\text{ or } 43``), or a final formula it could not read or read only in part
    (:func:`_final_formula_hedges`)."""
    return (
        not _same_scale(gold, pred)
        or _rounded_integer(gold, pred)
        or (kind or _kind(pred)) not in _ADMITS[_kind(gold)]
        or _percent_differs(gold_tex, gold, pred)
        or _choices_differ(gold_tex, text)
        or bool(_ANOTHER_VALUE.search(_CLOSERS.sub("", _after_the_box(answer), count=1)))
        or _final_formula_hedges(answer, gold_tex, gold)
    )


def _constant_gap(relation) -> bool:
    """Whether a relation's sides differ by a constant (``1 = 2``, ``0 = 0``, ``x = x + 1``,
    ``(a+b)^2 = a^2 + 2ab + b^2``, ``0 < 1``): it holds always or never, names no value."""
    from sympy import Expr, expand
    from sympy.core.relational import Relational

    if not (
        isinstance(relation, Relational) and isinstance(relation.lhs, Expr) and isinstance(relation.rhs, Expr)
    ):
        return False  # ``x \\in (1, 3)``: a set on a side
    gap = relation.lhs - relation.rhs
    if gap.count_ops() > 200:  # too large to expand cheaply: judged by math-verify alone
        return False
    return not expand(gap).free_symbols


def _unsolvable(gold, pred) -> bool:
    """Whether a relation gold and the answer cannot be compared by solving (math-verify solves
    both and compares their solutions; every identity and every contradiction has none, so
    ``\\boxed{1 = 2}`` passed for ``2 + 2 = 4`` and ``(a+b)^2 = a^2 + 2ab + b^2``): a gold whose sides
    differ by a constant is matched only by the same statement (its sides expanded, in either
    order), and an answer whose sides do matches nothing else."""
    from sympy import Eq, expand
    from sympy.core.relational import Relational

    if _constant_gap(gold):
        if not isinstance(pred, Relational) or type(pred.canonical) is not type(gold.canonical):
            return True
        g, p = gold.canonical, pred.canonical
        sides_g, sides_p = (expand(g.lhs), expand(g.rhs)), (expand(p.lhs), expand(p.rhs))
        return not (sides_g == sides_p or (isinstance(g, Eq) and sides_g == sides_p[::-1]))
    return _constant_gap(pred)


def _assigned(gold_tex: str) -> str | None:
    """The value of a gold answer that assigns one to a name (``x = 2`` -> ``2``), else None."""
    sides, links = relation_chain(gold_tex)
    if len(links) != 1 or not _EQUAL_LINKS.fullmatch(links[0]) or relation_inside(gold_tex):
        return None
    return sides[1].strip() if _NAME.fullmatch(sides[0]) and sides[1].strip() else None


_BARE_BOX = re.compile(r"\\(boxed|fbox)(?:\s+|(?=\d))([^\s{}$\\]+)")


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
    relation is compared as math-verify compares it (by solving both), except that a statement
    whose sides differ by a constant (an identity or a contradiction: ``1 = 2``, ``0 = 0``) matches
    only itself (:func:`_unsolvable`); a gold that assigns a value to a name
    (``x = 2``) is judged by that value as above (``x = 3 = 2`` scores 0). A last side that is the
    gold rounded to the decimals it shows (``\\sqrt{3} \\approx 1.732``) leaves the chain judged by
    the side before it.

    An answer whose value would take too long to compute (:func:`too_costly`: ``10^{10^{7}}``,
    ``123456!``) scores 0 without being parsed. A formula that holds the last box beside other terms
    is judged whole, unboxed (:func:`_unbox_inner`: ``$43 \\neq \\boxed{42}$`` scores 0), and a list of
    assignments as the point or set it names (:func:`_assignments`: ``x = 3, y = 5`` is ``(3, 5)``).
    Where math-verify's match is looser than the answer's claim it scores 0
    (:func:`_looser_than_claimed`): a gold number smaller than 0.1 needs its first three significant
    digits somewhere in the answer (``0.0``, ``\\{0.0\\}`` or ``x = y = 0.0`` passed for 6.626e-34), a
    gold 0.0 a zero (``10^{-7}`` passed); an
    integer gold of more than 15 digits is not matched by a float; a range, a pair and anything else
    match only their own kind (:func:`_kind`: ``\\{1, 3\\}`` does not pass for ``1 < x < 3``); a
    percentage passes for its hundredth only (``50%`` passed for 50 and 0.5); choices only in their
    order (``ABC`` passed for ``BAC``); a box followed by another value (``\\boxed{42} + 1``,
    ``\\boxed{42}, or perhaps $43$``) scores 0; and a final formula math-verify cannot read (it took a
    number inside it: ``\\boxed{43 \\equal 42}``), or one whose trailing ``\\text{}`` it drops as units
    while it holds a hedge (``42 \\text{ (or 43)}``), or with a subscript on a number that is not a
    base (``42^{+1}_{-1}``), scores 0. A plain-text answer is read by its last number (``43 or 42``
    scores 1 for 42, as ``42`` would)."""
    answer = _unbox_inner(_BARE_BOX.sub(r"\\\1{\2}", final_answer(completion)))  # ``\\boxed 42``
    answer = _scientific_answer(answer)  # ``\\boxed{1e-06}``
    if too_costly(answer):
        return 0.0
    gold_tex = gold_latex(gold)
    gold_parsed = mv_parse(f"${gold_tex}$")
    pred = mv_parse(answer)
    if not (gold_parsed and pred and mv_verify(gold_parsed, pred)):
        return 0.0
    value = _assigned(gold_tex)  # a gold ``x = 2`` is judged by its value, as a number's is
    named = value is None and (value := _assignments(gold_tex)) is not None  # ``x = 6, y = 5``: (6, 5)
    if value is not None and (parsed := mv_parse(f"${value}$")):
        gold_tex, gold_parsed = value, parsed
    # pred[-1]: the answer's text as math-verify extracted it (the boxed content, normalized)
    text = pred[-1] if isinstance(pred[-1], str) else ""
    kind = None
    if (
        built := _assignments(text, by_name=named)
    ) is not None:  # ``x = 3, y = 5``: judged as the tuple (3, 5)
        pred, text, kind = mv_parse(f"${built}$"), built, "point" if built.startswith("(") else None
        if not (pred and mv_verify(gold_parsed, pred)):
            return 0.0
    if _looser_than_claimed(gold_tex, gold_parsed[0], pred[0], answer, text, kind):
        return 0.0
    if relation_chain(gold_tex)[1] or relation_inside(gold_tex) or _holds_relation(gold_parsed[0]):
        # a relation as the gold answer: compared as math-verify compares it (by solving), unless
        # either side is one that no solving tells apart (:func:`_unsolvable`)
        return 0.0 if _unsolvable(gold_parsed[0], pred[0]) else 1.0
    if relation_inside(text):
        return 0.0
    if _holds_relation(pred[0]) and not relation_chain(text)[1]:
        return 0.0  # parsed as a relation its text does not show (``$43 = 42$ so $?$``)
    return 1.0 if _chain_holds(gold_parsed, text) else 0.0
