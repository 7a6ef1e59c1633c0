"""One home per default: the option dataclasses (``src/scalerl/config/groups/*.py``) and the run-wide
sections of :class:`scalerl.config.schema.Config`.

An option's YAML (``conf/<group>/<name>.yaml``) holds only what its dataclass does not: a value that
differs from the dataclass default (an interpolation, a loss's parameters, which have none), never a
repetition of it; ``conf/config.yaml`` likewise for the run-wide keys. So a default is changed in one
place, and these tests fail the moment a YAML value and its dataclass default could drift apart: a
YAML key equal to the default (a copy that would go stale), a YAML key the dataclass lacks, or a
composed config that is not the dataclass defaults with the YAML's own keys laid over them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from scalerl.config import GROUPS, compose, conf_dir, options
from scalerl.config.help import option_values, options_text, readme_fields
from scalerl.config.options import option_fields, schema_path
from scalerl.config.schema import SECTIONS, Config

CONF = Path(conf_dir())
CASES = [(g, o) for g in GROUPS for o in options(g)]


def own_keys(path: Path) -> dict:
    """The keys a YAML file sets itself (its ``defaults`` list and ``hydra`` node left out)."""
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    return {k: v for k, v in raw.items() if k not in ("defaults", "hydra")}


def repetitions(base, values: dict, where: str = "") -> list[str]:
    """The keys of ``values`` (dotted, nested mappings followed) whose value is already ``base``'s:
    laying the key over ``base`` changes nothing."""
    out = []
    for key, value in values.items():
        path = f"{where}{key}"
        if isinstance(value, dict) and value and key in base and OmegaConf.is_dict(base[key]):
            out += repetitions(base[key], value, f"{path}.")
            continue
        before = OmegaConf.to_container(base, resolve=False)
        after = OmegaConf.to_container(OmegaConf.merge(base, {key: value}), resolve=False)
        if before == after:
            out.append(path)
    return out


def test_repetitions_finds_a_copied_default_and_not_a_change():
    """The check itself: a value equal to the default (also written as another type, or nested in a
    mapping of settings) is a repetition; a different one, or an interpolation, is not."""
    from scalerl.config.groups.task import Multi

    base = OmegaConf.structured(options("async_mode")["pipeline_rl"])
    assert repetitions(base, {"max_lag": 8, "max_buffered_batches": 2, "transport": "gloo"}) == [
        "max_lag",
        "max_buffered_batches",
    ]
    assert repetitions(base, {"max_buffered_batches": "${.max_lag}"}) == []
    multi = OmegaConf.structured(Multi)
    assert repetitions(multi, {"domains": {"math": {"seed": 1234, "num_train": 10}}}) == ["domains.math.seed"]


@pytest.mark.parametrize("group,option", CASES)
def test_an_option_yaml_holds_only_what_differs_from_its_dataclass(group, option):
    cls = options(group)[option]
    path = CONF / group / f"{option}.yaml"
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    # its own schema and nothing else: a sibling option listed first would be a second home
    assert raw.get("defaults") == [schema_path(group, option), "_self_"], path
    own = own_keys(path)
    fields = {f.name for f in dataclasses.fields(cls)}
    assert not set(own) - fields, (
        f"{path}: keys its dataclass {cls.__name__} lacks: {sorted(set(own) - fields)}"
    )
    repeated = repetitions(OmegaConf.structured(cls), own)
    assert not repeated, (
        f"{path} repeats its dataclass's default for {repeated}: the default's home is "
        f"{cls.__module__}.{cls.__name__}; remove the key from the YAML"
    )


@pytest.mark.parametrize("group,option", CASES)
def test_the_composed_option_is_its_dataclass_defaults_with_the_yaml_over_them(group, option):
    cls = options(group)[option]
    composed = compose([f"{group}={option}"], check=False)[group]
    expected = OmegaConf.merge(OmegaConf.structured(cls), own_keys(CONF / group / f"{option}.yaml"))
    assert OmegaConf.to_container(composed, resolve=False) == OmegaConf.to_container(expected, resolve=False)
    assert OmegaConf.get_type(composed) is cls


def test_config_yaml_holds_only_what_differs_from_the_run_wide_defaults():
    own = {k: v for k, v in own_keys(CONF / "config.yaml").items() if k not in GROUPS}
    fields = {f.name for f in dataclasses.fields(Config)}
    assert not set(own) - fields
    repeated = repetitions(OmegaConf.structured(Config), own)
    assert not repeated, f"conf/config.yaml repeats scalerl.config.schema.Config's defaults for {repeated}"
    # the composed run-wide keys: Config's defaults with config.yaml's own keys over them
    cfg = compose([], check=False)
    expected = OmegaConf.merge(OmegaConf.structured(Config), own)
    for key in [f.name for f in dataclasses.fields(Config) if f.name not in GROUPS]:
        got = OmegaConf.to_container(cfg, resolve=False)[key]
        assert got == OmegaConf.to_container(expected, resolve=False)[key], key
    for name, cls in SECTIONS.items():
        assert OmegaConf.get_type(cfg[name]) is cls


def test_help_values_are_the_composed_values():
    """``--help`` and conf/README.md list each option's fields with values built without composing
    (Hydra may ask for the listing while composing): they are the values a run of the option gets."""
    text = options_text(str(CONF))
    for group, option in CASES:
        composed = OmegaConf.to_container(compose([f"{group}={option}"], check=False)[group], resolve=False)
        assert option_values(CONF, group, option) == composed, (group, option)
        assert f"  {option}: " in text
    assert "    max_lag=8, max_buffered_batches=2.0, transport=auto" in text  # as composed: a float


def test_conf_readme_lists_every_field_with_its_default():
    """conf/README.md's field listing is the one ``--help`` prints (every option's every field and
    its value), written by ``python -m scalerl.config.help``: a default changed in a dataclass and not
    written there fails here."""
    readme = (CONF / "README.md").read_text(encoding="utf-8")
    assert readme_fields(str(CONF)) in readme, (
        "conf/README.md's field listing is stale: run `python -m scalerl.config.help` to rewrite it"
    )
    # every field of every option, and of the run-wide sections, with its default
    for group, option in CASES:
        for f in option_fields(options(group)[option]):
            assert f"{f.name}=" in readme, (group, option, f.name)
    for name, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            assert f"{name}.{f.name}=" in readme, (name, f.name)


# ---------------------------------------------------------------------------- consumers
SRC = Path(__file__).resolve().parents[1] / "src" / "scalerl"
# option classes whose attributes are a generator constructor's keyword defaults (a generator built
# without a run config): they read the dataclass itself, so they cannot drift from it
KNOWN_CLASS_READS = {
    "generator/hf.py": {"HFGeneratorOption"},
    "generator/vllm_gen.py": {"VLLMGeneratorOption", "PlacementOption"},
}


def _fields_everywhere() -> dict[str, set[str]]:
    """{group or section: the fields every one of its options has}: a read of one never needs a default."""
    out = {
        g: set.intersection(*({f.name for f in dataclasses.fields(c)} for c in options(g).values()))
        for g in GROUPS
    }
    out.update({s: {f.name for f in dataclasses.fields(c)} for s, c in SECTIONS.items()})
    return out


def _option_class_names() -> set[str]:
    """Every option dataclass and the bases they share (``GeneratorOption``), and the sections'."""
    from scalerl.config.options import Option

    classes = [*(c for g in GROUPS for c in options(g).values()), *SECTIONS.values()]
    return {b.__name__ for c in classes for b in c.__mro__ if issubclass(b, Option) and b is not Option}


def config_fallbacks(path: Path, root: Path = SRC) -> list[str]:
    """``<cfg>.<group>.get("field", default)`` (also through a local name bound to ``<cfg>.<group>``)
    for a field every option of the group has, and reads of an option class's attribute, in ``path``
    (named relative to ``root``)."""
    import ast
    import re

    tree = ast.parse(path.read_text(encoding="utf-8"))
    name = str(path.relative_to(root))
    fields = _fields_everywhere()
    classes = _option_class_names()
    group_of = re.compile(r"(?:^|\.)cfg\.(\w+)$")
    found = []
    alias = {}  # names and attributes bound to a group (g = cfg.generator; self.tcfg = cfg.trainer)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            value = node.value.body if isinstance(node.value, ast.IfExp) else node.value
            m = group_of.search(ast.unparse(value))
            if m:
                alias[ast.unparse(node.targets[0])] = m.group(1)
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
        ):
            continue
        if len(node.args) < 2 or not isinstance(node.args[0], ast.Constant):
            continue
        receiver = ast.unparse(node.func.value)
        m = group_of.search(receiver)
        group = m.group(1) if m else alias.get(receiver)
        if group in fields and node.args[0].value in fields[group]:
            found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    known = KNOWN_CLASS_READS.get(name, set())
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in classes - known
            and not node.attr.startswith("_")
            and node.attr not in ("check", "correction", "node_gpus", "widest")
        ):
            found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_config_fallbacks_finds_a_default_copied_into_a_consumer(tmp_path):
    """The scan itself, on the forms it must catch and one it must leave (a field only some
    options have, asked for by presence)."""
    code = tmp_path / "consumer.py"
    code.write_text(
        "def f(cfg):\n"
        "    a = cfg.trainer.get('logits_chunk_tokens', TorchTrainerOption.logits_chunk_tokens)\n"
        "    g = cfg.generator\n"
        "    b = g.get('continuous', False)\n"
        "    c = cfg.placement.get('generator_tasks', 0)\n"
    )
    found = [line.split(": ", 1)[1] for line in config_fallbacks(code, tmp_path)]
    assert found == [
        "cfg.trainer.get('logits_chunk_tokens', TorchTrainerOption.logits_chunk_tokens)",
        "g.get('continuous', False)",
        "TorchTrainerOption.logits_chunk_tokens",
    ]


def test_no_consumer_carries_a_fallback_for_a_config_field():
    """The composed config holds every field of the chosen option (the schema guarantees it): a
    consumer reads ``cfg.trainer.logits_chunk_tokens``, never ``.get(key, <a copy of its default>)``
    or the dataclass's attribute as a fallback (a second home of the default)."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        found += config_fallbacks(path)
    assert not found, "config fields read with a fallback default:\n" + "\n".join(found)
