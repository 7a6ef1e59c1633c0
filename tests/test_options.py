"""The config is read once (issue 58): setup turns the composed config into typed options
(:func:`scalerl.config.typed`) and every part receives only its own; the whole config stops at the
CLI, the config package and the two roles' setup."""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import scalerl
from scalerl.config import GROUPS, compose, option_class, typed
from scalerl.config.schema import SECTIONS, Config

ROOT = Path(scalerl.__file__).resolve().parent

# where the whole config may still travel: the config package, the command line, and setup (the
# trainer's, loop/setup.py; the engine role's, in rollout/engine.py: it builds its own task, policy
# and generator in a process of its own)
SETUP = ("config/", "cli.py", "loop/setup.py")
ENGINE_SETUP = {
    "rollout/engine.py:engine_role",
    "rollout/engine.py:serve_task",
    "rollout/engine.py:build",
    "rollout/engine.py:over",
}
# and these, each of which is about the whole recipe: the run's entry, the check that a resumed run
# keeps its recipe, the wall-time estimate of a whole run, the MLflow params that log every key, and
# the one place that picks the layout's four options out of a config
WHOLE_CONFIG = {
    "layout.py:of",
    "loop/run.py:train",
    "loop/checkpointing.py:check_same_recipe",
    "estimate.py:estimate",
    "tracking/tracker.py:run_params",
}
WHOLE_NAMES = {"cfg", "config"}
WHOLE_TYPES = {"DictConfig", "Config"}


def whole_config_functions(source: str, where: str) -> list[str]:
    """``where:function`` for each function of ``source`` with a parameter that is the whole config:
    named ``cfg`` or ``config``, or annotated ``DictConfig`` / ``Config``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        args = node.args
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            note = ast.unparse(a.annotation) if a.annotation is not None else ""
            if a.arg in WHOLE_NAMES or any(t in note.replace("|", " ").split() for t in WHOLE_TYPES):
                found.append(f"{where}:{node.name}")
                break
    return found


def _all_whole_config_functions() -> list[str]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        out += whole_config_functions(path.read_text(), rel)
    return out


def test_the_whole_config_stops_at_the_cli_the_config_package_and_setup():
    outside = [f for f in _all_whole_config_functions() if not f.startswith(SETUP) and f not in ENGINE_SETUP]
    assert sorted(set(outside) - WHOLE_CONFIG) == [], "functions taking the whole config outside setup"
    assert len(outside) <= 5


def test_the_scan_finds_a_whole_config_parameter_by_name_and_by_type():
    src = (
        "def a(cfg): pass\n"
        "def b(x, *, config=None): pass\n"
        "def c(opts: DictConfig | None): pass\n"
        "def d(options: 'Config'): pass\n"
        "def e(trainer, loss): pass\n"
    )
    # a string annotation is still a name the scan reads ("'Config'" unparses with its quotes)
    assert whole_config_functions(src, "m.py") == ["m.py:a", "m.py:b", "m.py:c"]


@pytest.mark.parametrize(
    "overrides",
    [[], ["loss=dapo", "async_mode=sync"], ["generator=vllm"], ["trainer=deepspeed"], ["task=multi"]],
)
def test_typed_gives_every_group_its_chosen_option_dataclass(overrides):
    cfg = compose(overrides)
    opts = typed(cfg)
    assert isinstance(opts, Config)
    for group in GROUPS:
        assert type(getattr(opts, group)) is option_class(group, cfg[group].name), group
    for section, cls in SECTIONS.items():
        assert type(getattr(opts, section)) is cls
    # every value as composed, interpolations resolved
    assert OmegaConf.to_container(OmegaConf.structured(opts), resolve=True) == OmegaConf.to_container(
        cfg, resolve=True
    )


def test_typed_reads_a_runs_untyped_config_yaml_the_same():
    """A run's ``config.yaml`` read back has no schema types: typed() types it by its options' names."""
    cfg = compose(["task=multi", "loss=dapo", "trainer.lr=3e-4"])
    back = OmegaConf.create(OmegaConf.to_yaml(cfg, resolve=True))
    assert OmegaConf.get_type(back) is not Config
    assert typed(back) == typed(cfg)
    assert typed(back).trainer.lr == 3e-4


def test_components_are_typed():
    from scalerl.loop.components import Components

    hints = typing.get_type_hints(Components)
    untyped = [f.name for f in dataclasses.fields(Components) if hints[f.name] is typing.Any]
    assert untyped == []
