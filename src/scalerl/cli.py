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
    from scalerl.task import DataFileError

    try:
        validate(cfg)
        from scalerl.loop import train

        train(cfg)
    except (ConfigError, DataFileError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except RunError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


def main() -> None:
    _main()


if __name__ == "__main__":
    main()
