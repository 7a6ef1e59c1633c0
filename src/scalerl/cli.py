"""`python train.py [group=option ...] [key=value ...]`: one training run."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from scalerl.config import ConfigError, conf_dir, register_configs, validate

register_configs()


@hydra.main(config_path=conf_dir(), config_name="config", version_base="1.3")
def _main(cfg: DictConfig) -> None:
    from scalerl.loop import RunError
    from scalerl.storage import CheckpointError
    from scalerl.task import DataFileError

    try:
        validate(cfg)
        from scalerl.loop import train

        train(cfg)
    except (ConfigError, DataFileError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except RunError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


def _check_overrides(args: list[str]) -> None:
    """Compose the overrides before Hydra does, so that an unknown group, option or key, a malformed
    override or a wrongly typed value is one line (exit 2) instead of Hydra's multi-line report.
    Command lines with Hydra flags (--help, --cfg, -m, ...) go to Hydra as they are."""
    if any(a.startswith("-") for a in args):
        return
    from scalerl.config import compose
    from scalerl.config.errors import explain, override_key

    overrides = [a for a in args if not override_key(a).startswith("hydra")]
    try:
        compose(overrides, check=False)
    except Exception as e:  # Hydra/OmegaConf composition errors
        print(f"error: {explain(e, overrides)}", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    _check_overrides(sys.argv[1:])
    _main()


if __name__ == "__main__":
    main()
