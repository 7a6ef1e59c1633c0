"""The estimated wall time `python train.py --cfg job` and `python sweep.py --dry-run` print
(scalerl.estimate): printed by both commands as users run them, proportional to the work a run
does (twice the steps, about twice the time), and a sweep's the sum of its runs over how many run
at once. The probe is real (the configured model timed on this machine); no assertion here depends
on this machine's speed: the comparison with whole runs is in benchmarks/results/*_walltime-estimate.md."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from scalerl import estimate as est
from scalerl import layout
from scalerl.config import compose, typed

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"estimated wall time: about (\d+(?:\.\d+)?) (s|min|h) \((\d+(?:\.\d+)?)-(\d+(?:\.\d+)?)\)")


def _seconds(value: str, unit: str) -> float:
    return float(value) * {"s": 1, "min": 60, "h": 3600}[unit]


def cfg_job(folder, *overrides: str) -> subprocess.CompletedProcess:
    """``python train.py <overrides> --cfg job`` run in ``folder``, outside any launcher's ranks."""
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *overrides, "--cfg", "job"],
        capture_output=True,
        text=True,
        cwd=folder,
        timeout=180,
        env={k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "MASTER_PORT")},
    )


@pytest.mark.slow  # a train.py process (about 10 s: --cfg job composes, prints and probes; nothing trains)
def test_cfg_job_prints_the_estimated_wall_time(tmp_path):
    r = cfg_job(tmp_path, "trainer.total_steps=30")
    assert r.returncode == 0, r.stderr[-2000:]
    line = next(ln for ln in r.stdout.splitlines() if "estimated wall time" in ln)
    assert line.startswith("# estimated wall time: about "), line  # a YAML comment after the layout
    m = LINE.search(line)
    assert m, line
    central, lo, hi = _seconds(m[1], m[2]), _seconds(m[3], m[2]), _seconds(m[4], m[2])
    assert 0 < lo <= central <= hi
    assert "on this machine" in line and "30 steps x ~" in line and "3 evaluations x ~" in line
    assert r.stdout.index("# layout") < r.stdout.index("# estimated wall time")
    # 30 steps evaluated every 15 leave 2 evaluations past the early cut (step 10): said before it runs
    assert (
        "# scaling fit: not scored at this length: 2 evaluations a run at or after scaling.min_step=10"
        in r.stdout
    )
    assert list(tmp_path.iterdir()) == []  # printing writes nothing


@pytest.mark.slow  # a train.py process
def test_cfg_job_says_what_it_cannot_estimate(tmp_path):
    """A SLURM job on GPUs: its nodes and queue are not this machine's; said, not guessed."""
    r = cfg_job(tmp_path, "launcher=slurm", "launcher.gpus_per_node=1")
    assert r.returncode == 0, r.stderr[-2000:]
    line = next(ln for ln in r.stdout.splitlines() if "estimated wall time" in ln)
    assert line.startswith("# estimated wall time: not estimated here (") and "GPU" in line, line


def test_estimate_scales_with_steps():
    """Twice the steps (and so twice the evaluations): twice the steps' and evaluations' time, the
    start paid once; the probe is shared (one architecture, the same shapes), so the difference is
    the work's, not the machine's noise (how much of a run the start is depends on the machine)."""
    probes: dict = {}
    one, two = (
        est.estimate(compose([f"trainer.total_steps={n}"]), probes=probes, load=False) for n in (300, 600)
    )
    assert len(probes) == 1
    assert isinstance(one, est.Estimate) and isinstance(two, est.Estimate)
    assert one.steps == 300 and two.steps == 600 and two.evals == 2 * one.evals - 1
    assert two.step_s == pytest.approx(one.step_s)
    # the start is paid once, and the second run's extra evaluations are one fewer than its first
    # run's: exactly twice the steps' and evaluations' time (a share that depends on this machine)
    assert two.total == pytest.approx(2 * one.total - one.startup_s - one.eval_s)
    assert one.hi < two.hi < 2 * one.hi and one.lo < two.lo < 2 * one.lo
    # and with the work a step does: twice the samples to generate and train on (a probe of its
    # own: 256 rows a decode step), on the same machine, costs more a step
    big = est.estimate(compose(["trainer.total_steps=300", "trainer.batch_size=256"]), load=False)
    assert big.step_s > one.step_s


def _work(*overrides: str) -> tuple[est.Work, object]:
    """(the work of the run ``overrides`` compose, its model option)."""
    o = typed(compose(list(overrides)))
    parts = ("trainer", "generator", "async_mode", "filter", "eval", "length_control", "task", "model")
    return est.work(**{name: getattr(o, name) for name in parts}), o.model


def test_estimate_follows_the_mode_the_run_uses():
    """sync generates, then trains; pipeline_rl does both at once on cores of their own: a sync
    step costs the sum, a pipeline_rl step the slower part (the same probe times both)."""
    w, model = _work("trainer.total_steps=100")
    p = est.probe(model, w)
    assert isinstance(p, est.Probe) and p.decode_step_s > 0 and p.train_sample_s > 0
    sync = est.combine(w, p, apart=False)
    pipe = est.combine(w, p, apart=True)
    assert pipe.step_s < sync.step_s
    assert 1.0 < pipe.busy_threads <= 2.0 and sync.busy_threads == 1.0
    # longer completions: longer decodes and longer training rows. Under forced interruptions the
    # thinking and answer budgets bound them (with the forced phrase), not a larger cap alone
    longer = ("trainer.total_steps=100", "length_control.max_new_tokens=100")
    assert _work(*longer)[0].new_tokens == w.new_tokens
    w_long, _ = _work(*longer, "length_control.think_budget_max=80")
    assert w_long.new_tokens == w.new_tokens + 80 - 48
    assert est.combine(w_long, p, apart=True).step_s > pipe.step_s
    w_cap, _ = _work("trainer.total_steps=100", "length_control=none", "length_control.max_new_tokens=100")
    assert w_cap.new_tokens == 100  # no budgets: the cap


def test_the_probe_times_the_lean_decode_where_the_generator_takes_it():
    """The HF generator decodes the embedded model through its lean forward (the body over slot
    buffers, the compiled attention, the bf16 emulation's GEMMs in bf16), faster than
    transformers' forward here: the probe times that path in the run's precision where the run takes
    it, and transformers' where it does not (a native low-precision body, the static cache)."""
    import torch

    o = typed(compose([]))
    net = est._probe_model(o.model)
    decoder = est._lean_decoder(net, o.precision)
    assert decoder is not None
    body, prec = decoder
    assert body.dtype == torch.bfloat16 and (prec.body, prec.head) == ("bf16", "fp32")  # fp32_head
    assert est._lean_decode_step_s(decoder, 8, 10, 20, 1_000_000) > 0
    native = typed(compose(["precision.impl=native"]))
    assert est._lean_decoder(est._probe_model(native.model), native.precision) is None
    probes: dict = {}
    for overrides in ([], ["generator.static_cache=true"]):
        assert isinstance(est.estimate(compose(overrides), probes=probes, load=False), est.Estimate)
    assert sorted(key[2] for key in probes) == [False, True]  # one probe a path


def test_a_loaded_machine_stretches_the_estimate():
    e = est.Estimate(
        total=100.0, lo=60.0, hi=150.0, steps=10, step_s=8.0, evals=2, eval_s=1.0, startup_s=10.0
    )
    assert est.at_load(e, 0.0, 2).total == 100.0  # quiet: as probed
    loaded = est.at_load(e, 3.0, 2)  # 3 runnable besides the run's 1 on 2 cores: each gets half a core
    assert loaded.total == pytest.approx(200.0) and loaded.hi == pytest.approx(300.0)
    assert "at its present load (3.0 on 2 cores: x2.0" in loaded.line()
    # two threads a process: on a quiet machine as probed; where more threads are runnable than
    # cores, they wait on each other (a measured penalty, counted and said)
    two = est.Estimate(
        total=100.0, lo=60.0, hi=150.0, steps=10, step_s=8.0, evals=2, eval_s=1.0, startup_s=10.0, threads=2
    )
    assert est.at_load(two, 0.0, 2).total == 100.0
    crowded = est.at_load(two, 3.0, 2)
    factor = est.OVERSUBSCRIBED_THREADS[1] * est.thread_speedup(2)
    assert crowded.total == pytest.approx(200.0 * factor)
    assert any("trainer.threads=1 avoids it" in n for n in crowded.notes)
    sweep = est.sweep_estimate([two, two], at_once=2, cores=2, load=1.0)
    assert sweep.total == pytest.approx(100.0 * sweep.stretch * factor)
    assert "trainer.threads=1 avoids it" in sweep.line()
    assert est.sweep_estimate([two, two], at_once=1, cores=64).total == pytest.approx(200.0)


def test_sweep_estimate_sums_its_runs_over_its_parallelism():
    cfg = compose(["trainer.total_steps=40", "trainer.threads=1"])
    o = typed(cfg)
    options = layout.LayoutOptions.of(o)
    run = est.estimate(
        cfg, layout.plan(options, layout.launch_from_launcher(o.launcher, o.trainer)), load=False
    )
    assert isinstance(run, est.Estimate)
    runs = [run] * 6
    alone = est.sweep_estimate(runs, at_once=1, cores=64)
    assert alone.total == pytest.approx(6 * run.total) and alone.hi == pytest.approx(6 * run.hi)
    # 3 at once where the cores suffice: a third of the sum
    assert est.sweep_estimate(runs, at_once=3, cores=64).total == pytest.approx(2 * run.total)
    # 3 at once on 2 cores: the runs share them, so each is slower and the sweep gains less
    shared = est.sweep_estimate(runs, at_once=3, cores=2)
    assert shared.stretch == pytest.approx(3 * run.busy_threads / 2)
    assert shared.total == pytest.approx(2 * run.total * shared.stretch)
    assert "6 runs x ~" in shared.line() and "3 at once" in shared.line()
    # runs of unequal length: the launcher starts the next as one ends
    assert est.schedule([3.0, 1.0, 1.0, 1.0], 2) == 3.0 and est.schedule([2.0, 2.0, 2.0], 2) == 4.0
    # what cannot be estimated is said
    gpu = est.Unknown("the run would compute on GPUs")
    assert "1 kind(s) of run not estimated" in est.sweep_estimate([run, gpu], 1, 64).line()
    assert est.sweep_estimate([gpu], 1, 64).line().startswith("estimated wall time: not estimated here")


def _write(path: Path, variants: dict, **extra) -> Path:
    path.write_text(yaml.safe_dump({**extra, "variants": variants}, sort_keys=False))
    return path


def test_dry_run_prints_the_sweeps_estimated_wall_time(tmp_path, monkeypatch, capsys):
    """`python sweep.py s.yaml --dry-run`: the plan, then the estimate over its runs (2 variants x 2
    seeds, 2 at once); a variant that is not run is not counted; nothing is written."""
    from scalerl.sweep.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    _write(
        tmp_path / "s.yaml",
        {"base": [], "dapo": ["loss=dapo"]},
        name="s",
        base=["trainer.total_steps=20", "eval.every=5"],
        seeds=[0, 1],
        baseline="base",
    )
    before = sorted(tmp_path.rglob("*"))
    assert main(["s.yaml", "--dry-run", "launcher.max_parallel=2"]) == 0
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if "estimated wall time" in ln)
    assert line.startswith("[sweep] estimated wall time: about "), line
    assert LINE.search(line) and "4 runs x ~" in line and "2 at once" in line
    assert sorted(tmp_path.rglob("*")) == before
    # one at a time: the same runs, about twice the wall time (the two probes time the same shapes)
    assert main(["s.yaml", "--dry-run", "launcher.max_parallel=1"]) == 0
    line1 = next(ln for ln in capsys.readouterr().err.splitlines() if "estimated wall time" in ln)
    assert "4 runs x ~" in line1 and "1 at once" in line1
    # SLURM: its nodes and queue are not known here
    assert main(["s.yaml", "--dry-run", "launcher=slurm"]) == 0
    line2 = next(ln for ln in capsys.readouterr().err.splitlines() if "estimated wall time" in ln)
    assert "not estimated here" in line2 and "queue" in line2
