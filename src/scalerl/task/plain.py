"""Plain data: builtin values (None, bool, int, float, complex, str, bytes, list, tuple, dict, set,
frozenset) as JSON with their exact type, so a value crosses a process boundary and nothing else does.

The sandbox's child runs this module's source (it is sent to it as text: the child imports nothing
of the project) to decode a call's arguments and encode the candidate's results; the grader decodes
them here into fresh builtin values. Only the exact builtin types are encoded (``type(v) is int``,
not ``isinstance``): a subclass of ``int`` or any object with its own ``__eq__`` is not plain data
(:class:`NotPlain`), so it can never reach a comparison. Ints and floats are written in hexadecimal:
exact, and free of the interpreter's limit on decimal digits. This module imports nothing.
"""


class NotPlain(Exception):
    """A value that is not plain data (its type's name is the message)."""


def _tags():
    # a function, so that the child's copy keeps its own references whatever a program patches later
    return {
        type(None): "N",
        bool: "b",
        int: "i",
        float: "f",
        complex: "c",
        str: "s",
        bytes: "y",
        list: "l",
        tuple: "t",
        dict: "d",
        set: "S",
        frozenset: "F",
    }


_TAGS = _tags()


def encode(v, _depth=0):
    """``v`` as JSON-able nested lists ``[tag, ...]``; :class:`NotPlain` for anything else."""
    if _depth > 100:
        raise NotPlain("nested deeper than 100")
    tag = _TAGS.get(type(v))
    if tag is None:
        raise NotPlain(type(v).__name__)
    if tag == "N":
        return ["N"]
    if tag == "b":
        return ["b", 1 if v else 0]
    if tag == "i":
        return ["i", int.__format__(v, "x")]
    if tag == "f":
        return ["f", float.hex(v)]
    if tag == "c":
        return ["c", float.hex(v.real), float.hex(v.imag)]
    if tag == "s":
        return ["s", str.__str__(v)]
    if tag == "y":
        return ["y", bytes.hex(v)]
    if tag == "d":
        return ["d", [[encode(k, _depth + 1), encode(x, _depth + 1)] for k, x in dict.items(v)]]
    return [tag, [encode(x, _depth + 1) for x in v]]


def to_json(v, quote) -> str:
    """JSON text of nested lists of str and int (what :func:`encode` makes), with ``quote`` the JSON
    string quoting (``json.encoder.encode_basestring_ascii``); written here, not with ``json.dumps``,
    so that the child's report depends on nothing a program can patch but this module's copy."""
    if type(v) is list:
        return "[" + ",".join([to_json(x, quote) for x in v]) + "]"
    if type(v) is str:
        return quote(v)
    if type(v) is int:
        return int.__repr__(v)
    raise NotPlain(type(v).__name__)


# at most this many distinct values of one collection may share a hash (see :func:`_flooded`)
MAX_SAME_HASH = 64


def decode(e, _depth=0):
    """The builtin value that :func:`encode` wrote; ``ValueError`` for anything malformed, or hostile:
    a float beyond the float range, or a collection flooded with distinct values of one hash."""
    if _depth > 101 or type(e) is not list or not e or type(e[0]) is not str:
        raise ValueError("malformed plain value")
    tag, rest = e[0], e[1:]
    if tag == "N" and not rest:
        return None
    try:
        if len(rest) == 1:
            (x,) = rest
            if tag == "b" and x in (0, 1) and type(x) is int:
                return x == 1
            if tag == "i" and type(x) is str:
                return int(x, 16)
            if tag == "f" and type(x) is str:
                return float.fromhex(x)
            if tag == "s" and type(x) is str:
                return x
            if tag == "y" and type(x) is str:
                return bytes.fromhex(x)
            if tag in "ltSF" and len(tag) == 1 and type(x) is list:
                items = [decode(i, _depth + 1) for i in x]
                _flooded(items)  # before a set hashes them (and before a grader's set() does)
                return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
            if tag == "d" and type(x) is list:
                pairs = []
                for pair in x:
                    if type(pair) is not list or len(pair) != 2:
                        raise ValueError("malformed plain value")
                    pairs.append((decode(pair[0], _depth + 1), decode(pair[1], _depth + 1)))
                _flooded([k for k, _ in pairs])
                return dict(pairs)
        if tag == "c" and len(rest) == 2 and all(type(x) is str for x in rest):
            return complex(float.fromhex(rest[0]), float.fromhex(rest[1]))
    except (TypeError, OverflowError):  # an unhashable set item or key; "0x1p99999"
        raise ValueError("malformed plain value") from None
    raise ValueError("malformed plain value")


def _flooded(items) -> None:
    """``ValueError`` if more than :data:`MAX_SAME_HASH` distinct values among ``items`` share one
    hash. Numbers hash to values their sender chooses (``k * (2**61 - 1)`` all hash to 0), and a set
    or dict of n of them takes n**2 comparisons to build: seconds of CPU for a report of a megabyte,
    in a thread no timer can stop. Checked in linear time: hashes sorted (no table is built), and in
    a run of equal hashes at most MAX_SAME_HASH + 1 distinct values are ever compared against."""
    if len(items) <= MAX_SAME_HASH:
        return
    keyed = []
    for i, v in enumerate(items):
        try:
            keyed.append((hash(v), i))
        except TypeError:  # unhashable (a list, a set, a dict): never a set item or a key
            pass
    keyed.sort()
    start = 0
    while start < len(keyed):
        end = start
        while end < len(keyed) and keyed[end][0] == keyed[start][0]:
            end += 1
        if end - start > MAX_SAME_HASH:
            distinct = []
            for _, i in keyed[start:end]:
                v = items[i]
                if not any(type(v) is type(d) and v == d for d in distinct):
                    distinct.append(v)
                    if len(distinct) > MAX_SAME_HASH:
                        raise ValueError("hash-flooded plain value")
        start = end


def same(a, b) -> bool:
    """Equal as plain data: the same types all the way down, and equal values (``1 != True != 1.0``)."""
    if type(a) is not type(b):
        return False
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return len(a) == len(b) and all(k in b and same(v, b[k]) for k, v in a.items())
    return a == b
