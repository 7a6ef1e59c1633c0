"""A typed config's options as the keywords of the builders that take them (issue 58: each part gets
only its own options), for tests that compose a recipe and build one part of it."""

from __future__ import annotations

from scalerl.config import Config, compose, typed


def options(overrides: list[str] | None = None) -> Config:
    """The recipe ``overrides`` compose into, read once into typed options."""
    return typed(compose(overrides))


def trainer_options(config: Config) -> dict:
    """``make_trainer``'s options: the trainer, loss, aggregation and correction."""
    return {
        "trainer": config.trainer,
        "loss": config.loss,
        "aggregation": config.aggregation,
        "correction": config.correction,
    }


def policy_options(config: Config) -> dict:
    """``build_policy``'s options (``load_policy``'s without ``precision``)."""
    return {"precision": config.precision, "task_option": config.task, "seed": config.seed}


def scoring_options(config: Config) -> dict:
    """``score_groups``'s options: the reward scale, the length control and the verifier's time limit."""
    return {
        "reward": config.reward,
        "length_control": config.length_control,
        "verifier_timeout_s": config.task.verifier_timeout_s,
    }


def pool_options(config: Config) -> dict:
    """``EnginePool``'s options: the generator and precision options, the placement's bucket size,
    and the engines' spec with the typed config bound to it (as the run's setup hands them)."""
    import functools

    from scalerl.rollout.engine import EngineSpec

    return {
        "generator": config.generator,
        "precision": config.precision,
        "bucket_mb": config.placement.bucket_mb,
        "engine_spec": functools.partial(EngineSpec, config),
    }


def layout_options(config: Config):
    """The layout's options (``scalerl.layout.LayoutOptions``): trainer, generator, placement, async mode."""
    from scalerl.layout import LayoutOptions

    return LayoutOptions(config.trainer, config.generator, config.placement, config.async_mode)
