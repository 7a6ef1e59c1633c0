"""Plain data across the sandbox's boundary: exact types both ways, nothing else crosses, and the
boundary the sandbox uses is said once in a run's log."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import pytest

from scalerl.task import plain
from scalerl.task.sandbox import BOUNDARIES, available, boundary, describe

VALUES = [
    None,
    True,
    False,
    0,
    -7,
    10**5000,  # past the interpreter's limit on decimal digits
    2.5,
    -0.0,
    float("inf"),
    1e-310,
    3 + 4j,
    "",
    'caf\u00e9 \ud800 "quoted"\n',
    b"\x00\xff",
    [1, [2, (3,)], {"k": {4, 5}}],
    (),
    frozenset({1, "a"}),
    {(1, 2): [None], 3.5: b"x"},
]


@pytest.mark.parametrize("value", VALUES, ids=[type(v).__name__ + str(i) for i, v in enumerate(VALUES)])
def test_every_builtin_value_crosses_with_its_exact_type(value):
    text = plain.to_json(plain.encode(value), json.encoder.encode_basestring_ascii)
    back = plain.decode(json.loads(text))
    assert plain.same(back, value) and (type(value) is int or repr(back) == repr(value))  # (-0.0 == 0.0)


def test_nan_crosses_and_compares_as_python_does():
    back = plain.decode(plain.encode(float("nan")))
    assert math.isnan(back) and not plain.same(back, float("nan"))


class Sub(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


NOT_PLAIN = [Sub(3), [1, Sub(3)], object(), (x for x in ()), print, {"k": Sub(1)}, type]


# ids without addresses, so that every pytest-xdist worker collects the same names
@pytest.mark.parametrize("value", NOT_PLAIN, ids=[f"{type(v).__name__}{i}" for i, v in enumerate(NOT_PLAIN)])
def test_nothing_but_builtin_values_crosses(value):
    with pytest.raises(plain.NotPlain):
        plain.encode(value)


def test_types_and_values_must_both_match():
    assert plain.same([1, (2, "a")], [1, (2, "a")])
    assert not plain.same(1, True) and not plain.same(1, 1.0) and not plain.same([1], (1,))
    assert not plain.same({"a": 1}, {"a": True}) and not plain.same([1, 2], [1])


@pytest.mark.parametrize(
    "bad", [["i"], ["i", 5], ["q", "1"], ["S", [["l", []]]], ["d", [[["l", []], ["N"]]]], "x", [], ["b", 2]]
)
def test_a_malformed_value_is_refused(bad):
    with pytest.raises(ValueError):
        plain.decode(bad)


def test_the_boundary_is_said_once_in_a_run_s_log():
    script = (
        "import logging\nlogging.basicConfig(level=logging.INFO)\n"
        "from scalerl.task import CodeTask\nCodeTask(num_val=8)\nCodeTask(num_val=9)\n"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    lines = [x for x in r.stderr.splitlines() if "code sandbox: boundary" in x]
    assert len(lines) == 1 and describe(boundary()) in lines[0], r.stderr[-2000:]
    assert boundary() == available()[0] and available()[-1] == "none"
    assert set(available()) <= set(BOUNDARIES)


P61 = 2**61 - 1  # ints k * P61 all hash to 0


@pytest.mark.parametrize(
    "hostile",
    [
        ["f", "0x1p99999"],  # float.fromhex raised OverflowError out of the grader
        ["c", "0x1p0", "-0x1p99999"],
        ["S", [["i", format(k * P61, "x")] for k in range(1000)]],
        ["F", [["i", format(k * P61, "x")] for k in range(1000)]],
        ["d", [[["i", format(k * P61, "x")], ["N"]] for k in range(1000)]],
        ["l", [["i", format(k * P61, "x")] for k in range(1000)]],  # a grader's own set() of it
        ["t", [["i", format(-k * P61, "x")] for k in range(1, 1000)]],
    ],
    ids=["float", "complex", "set", "frozenset", "dict", "list", "tuple"],
)
def test_a_hostile_value_is_refused_not_raised(hostile):
    with pytest.raises(ValueError):
        plain.decode(hostile)


def test_a_hash_flood_is_refused_in_linear_time():
    """50,000 ints of one hash: a set of them takes about 50,000**2 / 2 comparisons to build (minutes
    in a verifier thread no timer can stop); refused after a sort instead."""
    flood = ["S", [["i", format(k * P61, "x")] for k in range(50_000)]]
    start = time.perf_counter()
    with pytest.raises(ValueError, match="hash-flooded"):
        plain.decode(flood)
    assert time.perf_counter() - start < 5.0


def test_many_equal_values_and_many_values_still_decode():
    """Repeats share a hash too: only distinct values of one hash count."""
    for value in (
        [0] * 10_000,
        [(1, 2)] * 5000,
        set(range(100_000)),
        {k: k for k in range(10_000)},
        [k * P61 for k in range(plain.MAX_SAME_HASH)],
        [1, 1.0, True] * 100,
    ):
        assert plain.same(plain.decode(plain.encode(value)), value)
