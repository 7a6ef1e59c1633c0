"""One line for any error composing a config: unknown groups, options and keys, malformed overrides,
wrongly typed and out-of-range values. Used by ``python train.py`` and by sweeps."""

from __future__ import annotations

import dataclasses
import re

from omegaconf import DictConfig, OmegaConf


def override_key(ov: str) -> str:
    """``loss`` for ``loss=dapo``, ``trainer.lr`` for ``+trainer.lr=1``, ``x`` for ``~x``."""
    return ov.lstrip("+~").split("=", 1)[0].strip()


_DEFAULT_CFG: DictConfig | None = None


def _default_cfg() -> DictConfig:
    global _DEFAULT_CFG
    if _DEFAULT_CFG is None:
        from scalerl.config import compose

        _DEFAULT_CFG = compose([], check=False)
    return _DEFAULT_CFG


def _options(group: str) -> list[str]:
    """The options of ``group``: registered ones, or the YAML files of a folder of ``conf/``
    (``experiment``)."""
    from pathlib import Path

    from scalerl.config import GROUPS, conf_dir, options

    if group in GROUPS:
        return sorted(options(group))
    folder = Path(conf_dir()) / group
    return sorted(p.stem for p in folder.glob("*.yaml")) if group and folder.is_dir() else []


def _groups() -> list[str]:
    from scalerl.config import GROUPS

    return list(GROUPS)


# config groups outside the defaults list, chosen with a '+' (conf/experiment: override lists)
_ADDED_GROUPS = ("experiment",)


def _chosen_option(group: str, overrides: list[str]) -> str:
    """The option of ``group`` that ``overrides`` choose (the last ``group=option``), else the default."""
    chosen = [o.split("=", 1)[1] for o in overrides if "=" in o and override_key(o) == group]
    return chosen[-1] if chosen else str(_default_cfg()[group].name)


def _unknown_key_message(key: str, value: str | None = None, overrides: list[str] | None = None) -> str:
    from scalerl.config.options import GROUPS, option_fields, options

    cfg = _default_cfg()
    parts = key.split(".")
    head = parts[0]
    if head in GROUPS and len(parts) == 2:
        name = _chosen_option(head, overrides or [])
        if name in options(head):
            keys = ", ".join(f.name for f in option_fields(options(head)[name]))
            return f"unknown key {key} (keys of {head}={name}: {keys or 'none'})"
    if head not in cfg:
        others = ", ".join(k for k in cfg if k not in _groups())
        if len(parts) == 1 and key in _ADDED_GROUPS:  # not in the defaults: added with a '+'
            return f"unknown group or key {key!r}: the {key} group is added with a '+' (+{key}=<name>)"
        if len(parts) == 1:
            return f"unknown group or key {key!r} (groups: {', '.join(_groups())}; other keys: {others})"
        return f"unknown key {key}: there is no group {head!r} (groups: {', '.join(_groups())})"
    # walk down to the deepest existing node
    node, path = cfg, []
    for p in parts[:-1]:
        if isinstance(node, DictConfig) and p in node:
            node = node[p]
            path.append(p)
        else:
            break
    parent = ".".join(path)
    if isinstance(node, DictConfig):
        if not dataclasses.is_dataclass(OmegaConf.get_type(node)):
            val = f"={value}" if value is not None else "=..."
            return f"unknown key {key} ({parent} is a free mapping: add keys with +{key}{val})"
        keys = [k for k in node.keys()]
        return f"unknown key {key} (keys of {parent}: {', '.join(keys)})"
    return f"unknown key {key} ({parent} is a value, not a group)"


def _malformed(msg: str, overrides: list[str]) -> str:
    """One line for an override Hydra's grammar cannot parse, naming it (found by parsing each where
    Hydra's message does not quote it), what the parser said, and how to quote its value."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    bad = next((o for o in overrides if o in msg), None)
    if bad is None:
        parser = OverridesParser.create()
        for o in overrides:
            try:
                parser.parse_overrides([o])
            except Exception:  # noqa: BLE001 - any parse failure names this override
                bad = o
                break
    said = [
        x.strip()
        for x in msg.splitlines()
        if x.strip().strip("^") and not x.strip().startswith("See https://")
    ]
    detail = (
        (said[0] if said else "").replace(bad or "\0", "").replace("LexerNoViableAltException:", "").strip()
    )
    detail = detail or "a character the override grammar does not take there"
    if bad is None:
        return f"malformed override: {detail}"
    key, eq, value = bad.partition("=")
    if not eq:  # ``trainer.lr`` alone
        return f"malformed override {bad!r}: an override is key=value ({key.strip()}=...) or group=option"
    if not (key.strip() and value.strip()):  # nothing to quote
        return f"malformed override {bad!r}: {detail}"
    return (
        f"malformed override {bad!r}: {detail}; a value with spaces, parentheses, brackets, quotes or "
        f"commas is quoted whole: {key}={_quoted(value)}"
    )


def _quoted(value: str) -> str:
    """``value`` quoted for Hydra's override grammar (double quotes where it holds a single one)."""
    return f'"{value}"' if "'" in value else f"'{value}'"


# OmegaConf's words for a value of the wrong type, and what they mean to a user
_TYPE_ERRORS = (
    (r"could not be converted to Float", "must be a number"),
    (
        r"^Value '(-?\d+)\.0' of type 'float' could not be converted to Integer",
        r"must be a whole number: write \1",
    ),
    (r"could not be converted to Integer", "must be a whole number"),
    (r"could not be converted to Boolean|is not a valid bool", "must be true or false"),
    (r"is not a ListConfig, list or tuple", "must be a list: write [a, b]"),
    (r"^Cannot assign \w+ to Dict", "must be a mapping ({key: value})"),
    (r"is not Optional", "must be set (null is not allowed here)"),
)


def plain_type_error(detail: str) -> str:
    """OmegaConf's message for a value of the wrong type in plain words (``Value 'abc' of type
    'str' could not be converted to Float`` -> ``must be a number``); any other message as it is."""
    for pattern, plain in _TYPE_ERRORS:
        if m := re.search(pattern, detail):
            return m.expand(plain)
    return detail


def explain(exc: BaseException, overrides: list[str]) -> str:
    """One line for a compose/validate error, naming the override at fault."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException

    from scalerl.messages import UserError

    msg = str(exc)
    first = msg.strip().splitlines()[0] if msg.strip() else type(exc).__name__
    if isinstance(exc, UserError):  # a ConfigError, a task's DataFileError: one line already
        return msg
    if isinstance(exc, MissingConfigException):
        m = re.search(r"Could not (?:find|load) '([^'/]+)/([^']*)'", msg)
        if m:
            group, option = m.group(1), m.group(2)
            # the user's override (a list value shows up as one of its elements)
            ov = next((o for o in overrides if override_key(o) == group), f"{group}={option}")
            value = ov.split("=", 1)[1] if "=" in ov else option
            avail = _options(group)
            return f"unknown option {group}={value} (available: {', '.join(avail)})"
        return first
    if msg.startswith("Config group override must be"):  # group=null
        nulls = [o for o in overrides if o.lower().replace(" ", "").endswith("=null")]
        ov = next((o for o in nulls if _options(override_key(o))), None)
        if ov:
            return f"unknown option {ov.lstrip('+')} (available: {', '.join(_options(override_key(ov)))})"
        return first
    if isinstance(exc, OverrideParseException):
        return _malformed(msg, overrides)
    if isinstance(exc, ConfigCompositionException):
        m = re.search(r"^Ambiguous value for argument '(.+)'$", first)
        if m:  # key=a,b outside a multirun
            key, _, value = m.group(1).partition("=")
            return (
                f"bad value {m.group(1)}: a comma makes it several values: write {key}=[{value}] for a list, "
                f"{key}={_quoted(value)} for text with a comma, or run one job per value "
                f"(python train.py -m {m.group(1)})"
            )
        m = re.search(r"Could not override '([^']+)'", msg)
        if m:
            key = m.group(1)
            ov = next((o for o in overrides if override_key(o) == key), None)
            if ov and "is not in struct" in str(exc.__cause__):  # a free mapping set with new keys
                return f"bad value {ov}: {key} takes new keys only with '+': write +{ov}"
            return _unknown_key_message(key, ov.split("=", 1)[1] if ov and "=" in ov else None, overrides)
        m = re.search(r"Error merging override (.+)$", first)
        if m:
            cause = exc.__cause__
            detail = str(cause).strip().splitlines()[0] if cause is not None and str(cause).strip() else ""
            return f"bad value {m.group(1)}" + (f": {plain_type_error(detail)}" if detail else "")
        m = re.search(r"^In '(?:scalerl_schema/)?([^'/]+)/[^']*': ValidationError", first)
        lists = [o for o in overrides if m and override_key(o) == m.group(1) and "[" in o]
        if lists:  # group=[a,b]: Hydra merges the options, whose schemas differ
            return f"bad value {lists[-1]}: one option (available: {', '.join(_options(m.group(1)))})"
        m = re.search(r"^Multiple values for ([^ .]+)\. To override", first)
        if m:  # +group=option for a group the defaults already choose
            ov = next((o for o in overrides if o.startswith("+") and override_key(o) == m.group(1)), None)
            fix = ov.lstrip("+") if ov else f"{m.group(1)}=..."
            return f"{m.group(1)} already has an option: write {fix} without the '+'"
        m = re.search(r"Could not append to config. An item is already at '([^']+)'", msg)
        if m:
            return f"{m.group(1)} already exists: write {m.group(1)}=... without the '+'"
        return first
    return f"{type(exc).__name__}: {first}"
