"""``python -m scalerl.loop.ship``: warm-start the embedded default's base model (the default
``model`` and ``task`` settings) and put it in the package, ``scalerl/model/base/warmstart-<key>``,
in place of the one there. Run it after changing what the warm-start key covers (the default model
or task settings, the warm-start procedure); test_model says when the shipped one no longer matches."""

from __future__ import annotations

import json
import logging
import platform
import shutil
import tempfile
from datetime import date
from pathlib import Path

import torch

from scalerl.config import compose
from scalerl.model.build import SHIPPED_BASE, _warmstart_key, warmstart_into
from scalerl.model.tokenizer import build_char_tokenizer
from scalerl.task import build_task


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cfg = compose([])
    key = _warmstart_key(cfg)
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d) / f"warmstart-{key}"
        info = warmstart_into(folder, cfg, build_task(cfg), build_char_tokenizer())
        info["made"] = {
            "on": str(date.today()),
            "machine": platform.processor() or platform.machine(),
            "torch": torch.__version__,
        }
        (folder / "meta.json").write_text(json.dumps(info, indent=1))
        shutil.rmtree(SHIPPED_BASE, ignore_errors=True)
        SHIPPED_BASE.mkdir(parents=True)
        shutil.copytree(folder, SHIPPED_BASE / folder.name)
    print(f"shipped {SHIPPED_BASE / folder.name} (loss {info['warmstart_loss']:.3f})")


if __name__ == "__main__":
    main()
