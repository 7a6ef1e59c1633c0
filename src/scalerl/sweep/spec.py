"""The sweep file: what a study runs, as data (YAML), not code.

.. code-block:: yaml

    name: loo                      # MLflow experiment = sweep name; folder outputs/sweeps/<name>
    description: ...               # free text (logged on the parent run)
    base: [trainer.total_steps=120]   # overrides for every variant (model, task, budget, launcher)
    seeds: [0]                     # optional: every variant runs once per seed (seed=<s>)
    baseline: scalerl              # the variant delta A is measured against
    variants:                      # name -> overrides (group=option / key=value); ordered
      scalerl: []
      dapo: [loss=dapo]

Shape errors raise :class:`SweepError` with one line naming the file (and the variant/key).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ALLOWED_KEYS = ("name", "description", "base", "seeds", "baseline", "variants")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
RESERVED_NAMES = ("logs", "report", "sweep.json", "status.json")  # entries of the sweep directory


class SweepError(ValueError):
    """A user error in a sweep file or on the command line; the message is one line."""


@dataclass
class SweepSpec:
    name: str
    variants: dict[str, list[str]]  # ordered: the baseline usually first
    base: list[str] = field(default_factory=list)
    seeds: list[int] | None = None  # None: one run per variant, seed from the config
    baseline: str | None = None
    description: str = ""
    path: str = ""  # as the user gave it (for messages)


def display_path(path: str | Path) -> str:
    """``path`` relative to the working directory when it is below it, else absolute."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p.resolve()) if p.is_absolute() or ".." in p.parts else str(p)


def _overrides(value, where: str, path: str) -> list[str]:
    """A list of override strings (``None`` = no overrides; one string = a list of one)."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise SweepError(
            f"{path}: {where}: expected a list of overrides like [loss=dapo, trainer.lr=1e-4], "
            f"got {type(value).__name__}"
        )
    from scalerl.config.errors import override_key  # here: a sweep file is read, then planned with it

    out = []
    for item in value:
        if isinstance(item, dict) and len(item) == 1:
            # `- loss: dapo` (a YAML mapping) instead of `- loss=dapo`
            ((k, v),) = item.items()
            raise SweepError(
                f"{path}: {where}: write the override as '{k}={_yaml_scalar(v)}', not '{k}: ...'"
            )
        if not isinstance(item, str):
            raise SweepError(f"{path}: {where}: override {item!r} is not a string like key=value")
        s = item.strip()
        if ("=" not in s and not s.startswith("~")) or not override_key(s):
            raise SweepError(
                f"{path}: {where}: malformed override {s!r} (expected group=option or key=value)"
            )
        out.append(s)
    return out


def _yaml_scalar(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return "null" if v is None else str(v)


def parse_spec(data, path: str) -> SweepSpec:
    """Check the shape of a loaded sweep file and build the spec."""
    if data is None:
        raise SweepError(f"{path}: empty sweep file (expected a mapping with keys {', '.join(ALLOWED_KEYS)})")
    if not isinstance(data, dict):
        raise SweepError(
            f"{path}: expected a mapping with keys {', '.join(ALLOWED_KEYS)}, got {type(data).__name__}"
        )
    unknown = [k for k in data if k not in ALLOWED_KEYS]
    if unknown:
        raise SweepError(f"{path}: unknown key {unknown[0]!r} (allowed: {', '.join(ALLOWED_KEYS)})")
    name = data.get("name", Path(path).stem)
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise SweepError(f"{path}: name {name!r} must be letters, digits, '_', '.', '-' (it names folders)")
    desc = data.get("description")
    desc = "" if desc is None else desc
    if not isinstance(desc, str):
        raise SweepError(f"{path}: description must be a string")
    base = _overrides(data.get("base"), "base", path)

    seeds = data.get("seeds")
    if seeds is not None:
        if isinstance(seeds, int) and not isinstance(seeds, bool):  # ``seeds: 3`` read as one seed, 3
            raise SweepError(
                f"{path}: seeds must be a list of seed numbers, got {seeds!r} "
                f"([{seeds}] for seed {seeds} alone, [0, 1, 2] for three seeds)"
            )
        if (
            not isinstance(seeds, list)
            or not seeds
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
        ):
            raise SweepError(f"{path}: seeds must be a non-empty list of integers, got {seeds!r}")
        if len(set(seeds)) != len(seeds):
            raise SweepError(f"{path}: seeds has duplicates: {seeds}")

    raw = data.get("variants")
    if "variants" not in data:
        raise SweepError(f"{path}: no 'variants' (a mapping of variant name -> list of overrides)")
    if not isinstance(raw, dict) or not raw:
        raise SweepError(
            f"{path}: 'variants' must be a non-empty mapping of variant name -> list of overrides"
        )
    variants: dict[str, list[str]] = {}
    for vname, ovs in raw.items():
        if vname is None or isinstance(vname, bool):
            # YAML reads an unquoted yes/no/on/off/true/false/~ as a boolean or null, not a name
            raise SweepError(
                f"{path}: variant name {vname!r}: YAML reads this unquoted name as a "
                f"{'boolean' if vname is not None else 'null'}; quote it (e.g. 'off': [...])"
            )
        vname = str(vname)
        if not NAME_RE.match(vname) or vname.lower() in RESERVED_NAMES:
            raise SweepError(
                f"{path}: variant {vname!r}: a variant name must be letters, digits, '_', '.', '-' "
                f"and not one of {', '.join(RESERVED_NAMES)} (it names a folder and an MLflow run)"
            )
        variants[vname] = _overrides(ovs, f"variant {vname!r}", path)
    lower = [v.lower() for v in variants]
    dup = next((v for v in variants if lower.count(v.lower()) > 1), None)
    if dup:
        raise SweepError(f"{path}: variant {dup!r}: names differ only in case (folders would clash)")

    baseline = data.get("baseline")
    if baseline is not None:
        baseline = str(baseline)
        if baseline not in variants:
            raise SweepError(
                f"{path}: baseline {baseline!r} is not a variant (variants: {', '.join(variants)})"
            )
    return SweepSpec(
        name=name, variants=variants, base=base, seeds=seeds, baseline=baseline, description=desc, path=path
    )


def _unique_key_loader():
    """A safe YAML loader that refuses a mapping with the same key twice (plain YAML keeps the last)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        pass

    def construct_mapping(loader, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None, None, f"unhashable key {key!r}", key_node.start_mark
                ) from None
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    f"in the mapping at line {node.start_mark.line + 1}",
                    None,
                    f"key {key!r} appears twice (lines {seen[key] + 1} and {key_node.start_mark.line + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return loader.construct_mapping_plain(node, deep=deep)

    UniqueKeyLoader.construct_mapping_plain = yaml.SafeLoader.construct_mapping
    UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return UniqueKeyLoader


def load_spec(path: str | Path) -> SweepSpec:
    """Read and check a sweep file; :class:`SweepError` (one line) on any problem."""
    import yaml

    shown = display_path(path)
    p = Path(path)
    if p.is_dir():
        raise SweepError(f"{shown}: is a folder, not a sweep file (a YAML file)")
    if not p.is_file():
        raise SweepError(f"{shown}: no such sweep file")
    try:
        data = yaml.load(p.read_text(encoding="utf-8"), Loader=_unique_key_loader())  # noqa: S506
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise SweepError(f"{shown}: invalid YAML{where}: {problem}") from None
    except UnicodeDecodeError:
        raise SweepError(f"{shown}: not a UTF-8 text file") from None
    except OSError as e:  # unreadable (permissions, a device): one line, not a traceback
        raise SweepError(f"{shown}: cannot read the sweep file ({e.strerror or type(e).__name__})") from None
    return parse_spec(data, shown)
