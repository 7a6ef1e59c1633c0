"""``python -m scalerl.ship``: warm-start the embedded base models a user runs first and put them
in the package, ``scalerl/model/base/warmstart-<key>``, in place of those there: the default's (the
default ``model`` and ``task`` settings, ``python train.py``) and the leave-one-out studies' (the
``base`` of ``sweeps/loo.yaml`` and of ``sweeps/loo_ceiling.yaml``, ``python sweep.py --loo``), so
that none trains a warm-start first and every machine starts from the same base. A base already in
the warm-start cache (``model.cache_dir``) under the same key is shipped as it is: the key covers
every setting and the procedure's version, so the cache holds what this would make again. Run it
after changing what the warm-start key covers (the default model or task settings, the studies'
task settings, the warm-start procedure); test_model says when a shipped one no longer matches."""

from __future__ import annotations

import json
import logging
import platform
import shutil
import tempfile
from datetime import date
from pathlib import Path

import torch

from scalerl.config import Config, compose, typed
from scalerl.model.build import SHIPPED_BASE, _warmstart_key, warmstart_into
from scalerl.model.tokenizer import build_char_tokenizer
from scalerl.task import build_task

# the studies whose base model ships: a name -> its sweep file in sweeps/
STUDIES = {"loo study": "loo.yaml", "loo_ceiling study": "loo_ceiling.yaml"}


def shipped_settings() -> dict[str, list[str]]:
    """What each shipped base is warm-started for: a name -> the overrides of its runs (the study's:
    its sweep file's ``base``, read as the sweep reads it, without the launcher's settings)."""
    import yaml

    from scalerl.config import conf_dir
    from scalerl.config.errors import override_key

    out: dict[str, list[str]] = {"default": []}
    for name, file in STUDIES.items():
        study = yaml.safe_load((Path(conf_dir()).parent / "sweeps" / file).read_text())
        base = [str(o) for o in study.get("base") or []]
        out[name] = [o for o in base if override_key(o).split(".")[0] != "launcher"]
    return out


def shipped_configs() -> dict[str, Config]:
    """name -> the config (typed: :func:`scalerl.config.typed`) of the runs its base is shipped for."""
    return {name: typed(compose(ovs)) for name, ovs in shipped_settings().items()}


def shipped_keys() -> dict[str, str]:
    """name -> the warm-start key of the base shipped for it."""
    return {name: _warmstart_key(c.model, c.task) for name, c in shipped_configs().items()}


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "--force",
        action="store_true",
        help="make again the bases already shipped or cached for these settings",
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    configs = shipped_configs()
    targets = {
        name: SHIPPED_BASE / f"warmstart-{_warmstart_key(c.model, c.task)}" for name, c in configs.items()
    }
    SHIPPED_BASE.mkdir(parents=True, exist_ok=True)
    for old in SHIPPED_BASE.iterdir():  # a base for settings no longer shipped
        if old not in targets.values():
            shutil.rmtree(old)
            print(f"removed {old} (no longer the settings of a shipped base)")
    with tempfile.TemporaryDirectory() as d:
        for name, config in configs.items():
            target = targets[name]
            if (target / "meta.json").is_file() and not args.force:
                print(f"kept {target} for the {name} (the same settings; --force makes it again)")
                continue
            folder = Path(d) / target.name
            cached = Path(str(config.model.cache_dir)) / target.name
            if (cached / "meta.json").is_file() and not args.force:
                shutil.copytree(cached, folder)
                info = json.loads((cached / "meta.json").read_text())
                info.setdefault("made", {"for": name, "on": str(date.fromtimestamp(cached.stat().st_mtime))})
                print(f"{name}: the base in the warm-start cache ({cached}) has these settings: shipping it")
            else:
                info = warmstart_into(folder, config.model, build_task(config.task), build_char_tokenizer())
                info["made"] = {
                    "for": name,
                    "on": str(date.today()),
                    "machine": platform.processor() or platform.machine(),
                    "torch": torch.__version__,
                }
            (folder / "meta.json").write_text(json.dumps(info, indent=1))
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(folder, target)
            print(f"shipped {target} for the {name} (loss {info['warmstart_loss']:.3f})")


if __name__ == "__main__":
    main()
