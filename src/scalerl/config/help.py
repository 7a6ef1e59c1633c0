"""The option listing of ``python train.py --help`` and of ``conf/README.md``, generated from the
registries.

``conf/hydra/help/scalerl.yaml`` writes ``${scalerl_help:}`` where the listing goes; the resolver
registered here fills it in: every group, its options (the default marked with ``*``), what each
option is (the opening sentence of its YAML's comment) and every field with the value a run of the
option gets. ``python -m scalerl.config.help`` writes the same listing, plus the run-wide keys, into
``conf/README.md`` (``tests/test_defaults_home.py`` fails when it is stale).

Hydra may resolve the help template while composing any config, so the listing is built without
composing: each option's values are its dataclass defaults (the one home of every default) with its
YAML file's own keys (the values that differ) laid over them, as composing does.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import sys
import textwrap
from pathlib import Path

from omegaconf import MISSING, OmegaConf

from scalerl.config.options import GROUPS, option_fields, options
from scalerl.config.variants import format_value

WIDTH = 100


def _yaml_summary(path: Path) -> str:
    """The first sentence of the comment opening the option's YAML file."""
    text = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        text.append(line.lstrip("#").strip())
    m = re.match(r"(.*?(?<!Dr)\.)(?=\s+[A-Z(]|$)", " ".join(text))
    return m.group(1) if m else " ".join(text)


def _doc_line(cls: type, path: Path) -> str:
    """What the option is: its YAML's opening sentence, else the first paragraph of its docstring."""
    summary = _yaml_summary(path) if path.is_file() else ""
    if summary:
        return summary
    doc = (cls.__doc__ or "").strip()
    if not doc or doc.startswith(cls.__name__ + "("):  # the signature dataclasses put there
        return ""
    return " ".join(ln.strip() for ln in doc.split("\n\n")[0].splitlines())


def yaml_values(conf: Path, group: str, name: str) -> dict:
    """The keys ``conf/<group>/<name>.yaml`` sets, with those of sibling options it lists first."""
    raw = OmegaConf.to_container(OmegaConf.load(conf / group / f"{name}.yaml"), resolve=False)
    out: dict = {}
    for entry in raw.pop("defaults", []):
        if isinstance(entry, str) and not entry.startswith("/") and entry != "_self_":
            out.update(yaml_values(conf, group, entry))
    out.update(raw)
    return out


def option_values(conf: Path, group: str, name: str) -> dict:
    """Every field of option ``group=name`` with the value a run of it composes to (unresolved: an
    interpolation as written): its dataclass's defaults with its YAML's own keys over them."""
    node = OmegaConf.structured(options(group)[name])
    if (conf / group / f"{name}.yaml").is_file():
        node = OmegaConf.merge(node, yaml_values(conf, group, name))
    return OmegaConf.to_container(node, resolve=False)


def _show(v: object) -> str:
    if isinstance(v, dict) and v and all(isinstance(x, dict) and "name" in x for x in v.values()):
        # options nested by name (task=multi's domains): their names; their settings are in the YAML
        return "{" + ", ".join(f"{k}: {x['name']}(...)" for k, x in v.items()) + "}"
    if isinstance(v, str) and v.startswith("${") and v.endswith("}"):  # an interpolation: as in the YAML
        return v
    return "(required)" if v is dataclasses.MISSING or v == MISSING else format_value(v)


@functools.lru_cache(maxsize=4)
def options_text(conf_dir: str) -> str:
    """One block per group: ``group: option1*, option2``, then per option its doc line and fields."""
    conf = Path(conf_dir)
    defaults = _default_choices(conf)
    lines = []
    for group in GROUPS:
        opts = options(group)
        lines.append(f"{group}: {', '.join(f'{n}*' if defaults.get(group) == n else n for n in opts)}")
        for name, cls in opts.items():
            path = conf / group / f"{name}.yaml"
            lines += textwrap.wrap(
                f"{name}: {_doc_line(cls, path)}", WIDTH, initial_indent="  ", subsequent_indent="    "
            )
            values = option_values(conf, group, name)
            lines += _wrap_fields([f"{f.name}={_show(values[f.name])}" for f in option_fields(cls)])
    return "\n".join(lines)


def run_wide_text(conf_dir: str) -> str:
    """The keys outside the groups (``eval.*``, ``tracking.*``, ``scaling.*``, ``seed``, ...) with the
    values a run gets: :class:`scalerl.config.schema.Config`'s defaults, ``conf/config.yaml``'s over them."""
    from scalerl.config.schema import SECTIONS, Config

    own = OmegaConf.to_container(OmegaConf.load(Path(conf_dir) / "config.yaml"), resolve=False)
    own = {k: v for k, v in own.items() if k not in ("defaults", "hydra", *GROUPS)}
    values = OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(Config), own), resolve=False)
    lines = []
    for section in SECTIONS:
        lines.append(f"{section}:")
        lines += _wrap_fields([f"{section}.{k}={_show(v)}" for k, v in values[section].items()])
    lines.append("run:")
    top = [f.name for f in dataclasses.fields(Config) if f.name not in (*GROUPS, *SECTIONS)]
    lines += _wrap_fields([f"{k}={_show(values[k])}" for k in top])
    return "\n".join(lines)


README_START = "<!-- fields: written by `python -m scalerl.config.help`; do not edit by hand -->"
README_END = "<!-- /fields -->"


def readme_fields(conf_dir: str) -> str:
    """The block ``conf/README.md`` lists every field in: the ``--help`` listing and the run-wide keys."""
    body = options_text(conf_dir) + "\n" + run_wide_text(conf_dir)
    return f"{README_START}\n```text\n{body}\n```\n{README_END}"


def write_readme(conf_dir: str) -> bool:
    """Rewrite the field listing of ``conf/README.md`` between its markers; whether it changed."""
    path = Path(conf_dir) / "README.md"
    text = path.read_text(encoding="utf-8")
    start, end = text.index(README_START), text.index(README_END) + len(README_END)
    new = text[:start] + readme_fields(conf_dir) + text[end:]
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


def _wrap_fields(fields: list[str]) -> list[str]:
    """``key=value, ...`` lines of at most WIDTH columns, never breaking inside a field."""
    out: list[str] = []
    for f in fields:
        if out and len(out[-1]) + 2 + len(f) <= WIDTH:
            out[-1] += f", {f}"
        else:
            if out:
                out[-1] += ","
            out.append(f"    {f}")
    return out


def _default_choices(conf: Path) -> dict[str, str]:
    out = {}
    for entry in OmegaConf.load(conf / "config.yaml").get("defaults", []):
        if not isinstance(entry, str):
            out.update({k: str(v) for k, v in entry.items() if k in GROUPS})
    return out


def _resolve_help() -> str:
    from scalerl.config import conf_dir

    # Hydra fills the help template with string.Template: a literal $ is written $$
    return options_text(conf_dir()).replace("$", "$$")


def register_help_resolver() -> None:
    if not OmegaConf.has_resolver("scalerl_help"):
        OmegaConf.register_new_resolver("scalerl_help", _resolve_help)


if __name__ == "__main__":
    from scalerl.config import conf_dir

    changed = write_readme(conf_dir())
    print(f"{Path(conf_dir()) / 'README.md'}: {'rewritten' if changed else 'up to date'}", file=sys.stderr)
