"""FitProtocol: the one object every scaling fit is made with, built from the ``scaling`` config."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from omegaconf import OmegaConf

from scalerl.config.schema import ScalingConfig
from scalerl.scaling import FitProtocol, FitProtocolError
from scalerl.scaling.protocol import CONFIG_KEYS
from scalerl.scaling.synthetic import TrueCurve, sample_run

CUSTOM = FitProtocol(
    compute_axis="device_hours",
    min_step=3,
    min_compute=1.5,
    method="grid",
    grid_A=[0.4, 0.8, 0.01],
    grid_C_mid=[1.0, 100.0, 50],
    bootstrap=20,  # a config takes 0 or at least 2/(1-0.9) (test_config)
    extrapolate=3.0,
    level=0.8,
    seed=4,
)


def test_the_defaults_are_the_scaling_configs():
    assert FitProtocol.from_config(OmegaConf.structured(ScalingConfig())) == FitProtocol()
    assert FitProtocol.from_config(ScalingConfig()) == FitProtocol()
    assert FitProtocol.from_config({}) == FitProtocol()  # a sweep state without the keys


def test_from_config_round_trip():
    cfg = CUSTOM.to_config()
    assert set(cfg) == set(CONFIG_KEYS) and cfg["grid_A"] == [0.4, 0.8, 0.01]
    back = FitProtocol.from_config(cfg, level=0.8, seed=4)
    assert back == CUSTOM and back.grid_C_mid == (1.0, 100.0, 50.0)
    # through a DictConfig of the run's schema (what cfg.scaling is), refit_every ignored
    node = OmegaConf.merge(OmegaConf.structured(ScalingConfig(refit_every=3)), cfg)
    assert OmegaConf.to_object(node).check() == []
    assert FitProtocol.from_config(node, level=0.8, seed=4) == CUSTOM


def test_it_is_frozen_and_normalised():
    with pytest.raises(dataclasses.FrozenInstanceError):
        CUSTOM.method = "direct"  # type: ignore[misc]
    p = FitProtocol(min_step=4.0, bootstrap=10.0, grid_A=[0, 1, 1])
    assert type(p.min_step) is int and type(p.bootstrap) is int and p.grid_A == (0.0, 1.0, 1.0)
    assert hash(p) == hash(FitProtocol(min_step=4, bootstrap=10, grid_A=(0.0, 1.0, 1.0)))


@pytest.mark.parametrize(
    "key, value, allowed",
    [
        ("compute_axis", "hours", "one of device_hours, flops"),
        ("method", "bogus", "one of grid, direct"),
        ("min_step", -1, "an integer >= 0"),
        ("min_compute", float("nan"), ">= 0"),
        ("grid_A", [0.9, 0.1, 0.01], "[low, high, step] with 0 <= low <= high <= 1, step > 0"),
        ("grid_C_mid", [1.0, 10.0, 2.5], "[low, high, n] with 0 < low <= high, n an integer >= 1"),
        ("bootstrap", -1, ">= 0"),
        ("extrapolate", 0.5, ">= 1"),
    ],
)
def test_a_bad_setting_is_one_line_naming_key_value_and_allowed(key, value, allowed):
    with pytest.raises(FitProtocolError) as e:
        FitProtocol(**{key: value})
    msg = str(e.value)
    assert "\n" not in msg
    assert f"scaling.{key}=" in msg and repr(value) in msg and msg.endswith(f"must be {allowed}")
    # the config rejects the same value with the same words (one statement of the ranges)
    problems = ScalingConfig(**{key: value}).check()
    assert problems and problems[0][0] == key and problems[0][2] == allowed


@pytest.mark.parametrize("key, value", [("level", 1.0), ("level", 0), ("seed", -1), ("seed", 1.5)])
def test_a_bad_level_or_seed_is_one_line(key, value):
    with pytest.raises(FitProtocolError, match=rf"^invalid fit setting {key}={value!r}: must be "):
        FitProtocol(**{key: value})


def test_the_protocol_makes_the_fit_and_the_cut():
    rng = np.random.default_rng(3)
    c, y = sample_run(TrueCurve(A=0.7, B=1.5, C_mid=50.0, R0=0.1), rng, n_points=20)
    steps = np.arange(c.size) * 10
    p = FitProtocol(min_step=30, bootstrap=0)
    cut = p.cut(steps, c)
    assert cut == c[3]  # the first evaluation at step >= 30
    fit = p.fit(c, y, min_compute=cut)
    assert fit.ok and fit.method == "direct" and fit.min_compute == cut and sorted(fit.excluded) == [0, 1, 2]
    grid = FitProtocol(method="grid", grid_A=(0.6, 0.8, 0.05), bootstrap=5, level=0.8)
    gfit = grid.fit(c, y, min_compute=0.0)
    assert gfit.ok and gfit.method == "grid" and gfit.level == 0.8 and 0.6 <= gfit.A <= 0.8
    assert grid.fit(c, y, min_compute=0.0, bootstrap=0).ci == {} and gfit.ci
