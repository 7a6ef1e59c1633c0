"""trainer=deepspeed for real (no mocks): ZeRO 0-3 on CPU with gloo, in one process and in two.

* One optimiser step under each ZeRO stage equals trainer=torch's from the same start and batch.
* Short runs under each stage train (finite loss and gradient norm, weights move) and resume from
  the engine checkpoint with continuous MLflow steps.
* Two processes (torchrun): a step on unequal shares of a batch equals one trainer=torch step on the
  whole batch (gradient averaging, global aggregation denominators, padded micro-batches; under
  ZeRO-3 also with shared prompts on one rank only and with length buckets on one rank only, the
  ranks agreeing on a plan of passes), a non-finite loss on one rank is skipped by both; a real run
  trains, keeps the ranks' weights identical, and resumes after SIGKILL into the same MLflow run.
* pipeline_rl with ZeRO-3: the generator process gets gathered weights.
* Nothing is JIT-compiled (TORCH_EXTENSIONS_DIR stays empty).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from extras import need
from procs import descendants
from test_trainer_contract import LENGTH, PROMPT, SHORT

# The in-process tests here run DeepSpeed on the CPU (gloo), also where there is a GPU: DeepSpeed picks
# its accelerator once per process, when it is imported. (Runs in child processes use the GPU there.)
_ds_acc = os.environ.get("DS_ACCELERATOR")
os.environ["DS_ACCELERATOR"] = "cpu"
try:
    need("deepspeed")
finally:
    if _ds_acc is None:
        del os.environ["DS_ACCELERATOR"]
    else:
        os.environ["DS_ACCELERATOR"] = _ds_acc

pytestmark = pytest.mark.deepspeed

REPO = Path(__file__).resolve().parents[1]
# TINY with a one-digit task, so that rewards vary within groups and the trainer really steps
# (on TINY's task the tiny warm-started model scores 0 on nearly every training prompt, and the
# zero-variance filter drops every group)
EASY = [
    "model.warmstart_steps=150",
    "task.min_digits=1",
    "task.max_digits=1",
    "task.warmstart_max_digits=1",
]


def merged(*lists: list[str]) -> list[str]:
    """Overrides, later ones replacing earlier ones of the same key (Hydra refuses duplicates)."""
    out: dict[str, str] = {}
    for lst in lists:
        for o in lst:
            out[o.split("=", 1)[0]] = o
    return list(out.values())


def _tracking(overrides: list[str]) -> tuple[str, str]:
    kv = dict(o.split("=", 1) for o in overrides)
    return kv["tracking.uri"], kv["tracking.experiment"]


_RANK_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(tmp_path: Path) -> dict:
    """Environment for a child run: no rank variables inherited, one thread, an empty extension dir."""
    # DS_ACCELERATOR too: a DeepSpeed trainer on the CPU in this process set it; a child chooses for its
    # own trainer.device
    env = {k: v for k, v in os.environ.items() if k not in (*_RANK_VARS, "DS_ACCELERATOR")}
    ext = tmp_path / "torch_extensions"
    ext.mkdir(exist_ok=True)
    path = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH")) if p)
    env.update(OMP_NUM_THREADS="1", TORCH_EXTENSIONS_DIR=str(ext), PYTHONPATH=path)
    return env


def _nothing_compiled(tmp_path: Path) -> None:
    ext = tmp_path / "torch_extensions"
    assert not ext.exists() or not any(ext.iterdir()), f"something was JIT-compiled: {list(ext.rglob('*'))}"


def _metrics(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    hist = MlflowClient(uri).get_metric_history(run_id, key)
    return sorted((m.step, m.value) for m in hist)


def _runs(uri: str, experiment: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    return client.search_runs([client.get_experiment_by_name(experiment).experiment_id])


def _digest(state: dict) -> str:
    """As DeepSpeedEngine.weights_digest."""
    h = hashlib.sha256()
    for k, v in sorted(state.items()):
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# ---------------------------------------------------------------------- a synthetic batch
SYNTH = [
    "model.hidden_size=32",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.num_kv_heads=2",
    "model.intermediate_size=64",
    "trainer.generations_per_prompt=4",
    "trainer.warmup_steps=0",
    "trainer.lr=1e-3",
    # Adam's first step is about lr x sign(g) where |g| >> eps: with eps 1e-8 a gradient element near
    # 1e-8 moves its weight by up to lr, in a direction that float rounding decides. With 1e-4 the
    # step stays smooth in the gradient, so equal gradients (to rounding) give equal weights
    "trainer.adam_eps=1e-4",
    "trainer.threads=1",
]


def synthetic(config, seed: int = 0):
    """(model, precision, batch): a random tiny policy and 4 groups x 4 sequences of random tokens with
    unequal completion lengths, each group's rows sharing their prompt (so ``trainer.share_prompts``
    runs it once); behaviour log-probs are the policy's own (importance ratios 1)."""
    from parts import trainer_options

    from scalerl.model.build import build_model
    from scalerl.model.precision import Precision
    from scalerl.trainer import TorchEngine, TrainBatch, Trainer

    model = build_model(config.model, vocab_size=40, seed=seed, pad_token_id=0, eos_token_id=1)
    p = config.precision
    precision = Precision.for_device(p.body, p.head, "cpu", impl=p.impl)
    precision.prepare(model)
    g = torch.Generator().manual_seed(seed)
    groups, per, length, prompt = 4, 4, 24, 6
    n = groups * per
    ids = torch.randint(2, 40, (n, length), generator=g)
    ids[:, :prompt] = ids[::per, :prompt].repeat_interleave(per, 0)
    mask = torch.zeros(n, length - 1)
    for i, c in enumerate(torch.randint(3, length - prompt, (n,), generator=g).tolist()):
        mask[i, prompt - 1 : prompt - 1 + c] = 1.0
    batch = TrainBatch(
        input_ids=ids,
        mask=mask,
        gen_logp=torch.zeros(n, length - 1),
        versions=torch.zeros(n, length - 1, dtype=torch.long),
        advantages=torch.randn(n, generator=g),
        group_ids=torch.arange(groups).repeat_interleave(per),
        start=prompt - 1,
    )
    with torch.no_grad():
        ref = TorchEngine(copy.deepcopy(model), config.trainer, torch.device("cpu"))
        trainer = Trainer(ref, precision, **trainer_options(config), temperature=1.0)
        logp, _ = trainer.token_logprobs(batch)
    batch.gen_logp[:, batch.start :] = logp * batch.mask[:, batch.start :]
    return model, precision, batch


@pytest.fixture(scope="module")
def ds_process(tmp_path_factory):
    """This process as a one-rank DeepSpeed job; the rank variables are restored afterwards."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MASTER_ADDR", "127.0.0.1")
        mp.setenv("MASTER_PORT", str(_free_port()))
        mp.setenv("RANK", "0")
        mp.setenv("WORLD_SIZE", "1")
        mp.setenv("LOCAL_RANK", "0")
        mp.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path_factory.mktemp("torch_extensions")))
        yield


MEMORY_PATH = ["trainer.logits_chunk_tokens=16", "trainer.activation_checkpointing=true"]


@pytest.mark.parametrize(
    ("stage", "precision", "extra"),
    [
        (0, "fp32", []),
        (1, "fp32", []),
        (2, "fp32", []),
        (3, "fp32", []),
        (3, "bf16", []),
        # the LM head chunk by chunk and the blocks checkpointed: both recompute in the backward,
        # where ZeRO-3 must gather the head's and the blocks' parameters again
        (3, "bf16", MEMORY_PATH),
    ],
)
def test_steps_equal_torch(stage, precision, extra, ds_process):
    """Optimiser steps under ZeRO-`stage` == trainer=torch's from the same start and batch: the first
    step (and the second, so gradients must not leak from one step into the next), with two
    micro-batches per step (DeepSpeed accumulates them)."""
    from parts import options, trainer_options

    from scalerl.trainer import make_trainer

    cpu = torch.device("cpu")
    over = [*SYNTH, f"precision={precision}", "trainer.micro_batch_size=8", *extra]
    cfg_t = options([*over, "trainer=torch"])
    cfg_d = options([*over, "trainer=deepspeed", f"trainer.zero_stage={stage}"])
    model, prec, batch = synthetic(cfg_t)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    torch_tr = make_trainer(copy.deepcopy(model), prec, **trainer_options(cfg_t), temperature=1.0, device=cpu)
    ds = make_trainer(copy.deepcopy(model), prec, **trainer_options(cfg_d), temperature=1.0, device=cpu)
    for step in (1, 2):
        ref_stats = torch_tr.step(batch)
        ref = {k: v.detach().clone() for k, v in torch_tr.module.state_dict().items()}
        stats = ds.step(batch)
        got = ds.policy_weights().tensors()

        assert stats["train/step_skipped"] == 0.0
        for k in ("train/loss", "train/grad_norm", "train/entropy", "train/is_ratio_mean", "train/lr"):
            assert math.isfinite(stats[k]), k
            assert stats[k] == pytest.approx(ref_stats[k], rel=1e-5, abs=1e-6), (step, k)
        update = max(float((ref[k] - start[k]).abs().max()) for k in ref)
        assert update > 1e-4  # the steps moved the weights
        diff = max(float((got[k] - ref[k]).abs().max()) for k in ref)
        # equal to a few float32 ulps of the weights (1 ulp of a weight near 2 is 2.4e-7): ZeRO-1/2/3
        # flatten and partition, and even ZeRO-0 may order the clipping arithmetic differently
        tol = 1e-6
        assert diff <= tol, f"step {step}, ZeRO-{stage} vs torch: max |diff| {diff:g} (update {update:g})"


# ---------------------------------------------------------------------- single-process runs
def _run_in_process(overrides: list[str], *, resume: bool = False):
    """(summary, weights at the start, weights at the end) of a run in this process; with ``resume``
    the start is the state restored from the checkpoint."""
    from omegaconf import OmegaConf

    from scalerl.config import compose
    from scalerl.loop import build, train
    from scalerl.loop.checkpointing import restore

    cfg = compose(overrides)
    OmegaConf.resolve(cfg)
    run = build(cfg)
    if resume:  # restored here to read the start weights; train restores the same state again
        assert restore(run) is not None
    start = run.trainer.policy_weights().tensors()
    summary = train(cfg, components=run)
    return summary, start, run.trainer.policy_weights().tensors()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_stage_trains_and_resumes(stage, ds_process, tiny_overrides):
    """`trainer=deepspeed trainer.zero_stage=Z async_mode=sync` in one process without a launcher:
    finite losses and gradient norms, weights that move; then resumed from the engine checkpoint."""
    over = merged(
        tiny_overrides,
        EASY,
        [
            "trainer=deepspeed",
            f"trainer.zero_stage={stage}",
            "async_mode=sync",
            "trainer.total_steps=2",
            "trainer.device=cpu",  # DeepSpeed's accelerator in this process (above)
        ],
    )
    uri, experiment = _tracking(over)
    summary, start, end = _run_in_process(over)
    assert summary["steps"] == 2
    assert max(float((end[k] - start[k]).abs().max()) for k in start) > 0  # the weights moved
    rid = summary["run_id"]
    skipped = dict(_metrics(uri, rid, "train/step_skipped"))
    trained = [s for s, v in skipped.items() if v == 0.0]
    assert trained, "no step trained (every group filtered out?)"
    for key in ("train/loss", "train/grad_norm", "train/entropy"):
        vals = dict(_metrics(uri, rid, key))
        assert all(math.isfinite(vals[s]) for s in trained), (key, vals)
    out = Path(dict(o.split("=", 1) for o in over)["out_dir"])
    own = torch.load(
        out / "checkpoint" / "engine" / "step_00000002" / "scalerl_rank_00000.pt", weights_only=False
    )
    assert own["weights_digest"] == _digest(end)

    # one more step, resumed from the engine checkpoint: its weights, the same MLflow run, continuous steps
    summary2, start2, _ = _run_in_process(merged(over, ["trainer.total_steps=3"]), resume=True)
    assert summary2["run_id"] == rid and summary2["steps"] == 3
    assert all(torch.equal(start2[k], end[k]) for k in end)
    assert [s for s, _ in _metrics(uri, rid, "train/reward")] == [1, 2, 3]
    assert [s for s, _ in _metrics(uri, rid, "val/pass_rate")] == [0, 2, 3]
    assert len(_runs(uri, experiment)) == 1


def test_pipeline_rl_zero3(tiny_overrides, tmp_path):
    """`python train.py trainer=deepspeed trainer.zero_stage=3 async_mode=pipeline_rl`, no launcher:
    the generator process runs on weights gathered from the ZeRO-3 partitions."""
    over = merged(
        tiny_overrides,
        EASY,
        ["trainer=deepspeed", "trainer.zero_stage=3", "async_mode=pipeline_rl", "async_mode.max_lag=2"],
    )
    uri, _ = _tracking(over)
    proc = subprocess.run(
        [sys.executable, str(REPO / "train.py"), *over],
        env=_env(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _nothing_compiled(tmp_path)
    rid = json.loads((tmp_path / "run" / "summary.json").read_text())["run_id"]
    assert [s for s, _ in _metrics(uri, rid, "train/reward")] == [1, 2, 3, 4]
    # new weights reached the generator: with k=2 the 4th batch (trainer at version 3) may hold only
    # tokens of versions >= 1, older data is dropped, so a generator left on the first weights would
    # never have let the run finish. (Mixed versions within a batch depend on timing: here the one-digit
    # completions are decoded faster than a ZeRO-3 step, so a publish rarely lands mid-batch; test_loop
    # checks the mixing where generation is the slower side.)
    lags = [v for _, v in _metrics(uri, rid, "train/policy_lag_max")]
    assert len(lags) == 4 and max(lags) <= 2, lags
    # and they were the trainer's weights, whole: behaviour and trainer log-probs stay close
    diffs = [v for _, v in _metrics(uri, rid, "train/gen_train_logprob_diff")]
    assert diffs and all(math.isfinite(d) and d < 0.5 for d in diffs), diffs


# ---------------------------------------------------------------------- two processes
TWO_RANK_SCRIPT = textwrap.dedent(
    """
    import copy, json, sys
    import torch
    import torch.distributed as dist
    sys.path.insert(0, sys.argv[2])
    from test_deepspeed import SYNTH, synthetic
    from test_trainer_contract import bucketed_batch, with_own_logprobs
    from parts import options, trainer_options
    from scalerl.trainer import make_trainer
    from scalerl.trainer.deepspeed_engine import end_distributed, init_distributed

    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    init_distributed(cpu)
    rank = dist.get_rank()

    def against_torch(cfg_t, cfg_d, model, precision, batch, overhead=None):
        # one step of torch on the whole batch and of DeepSpeed on this rank's share: rank 0 trains
        # on 3 groups (3 micro-batches), rank 1 on 1 group (1 micro-batch + 2 of padding passes)
        ref_tr = make_trainer(copy.deepcopy(model), precision, **trainer_options(cfg_t), temperature=1.0, device=cpu)
        ref_stats = ref_tr.step(batch)
        ref = ref_tr.module.state_dict()
        ds = make_trainer(copy.deepcopy(model), precision, **trainer_options(cfg_d), temperature=1.0, device=cpu)
        if overhead is not None:
            ds.bucket_overhead_tokens = overhead
        seen = []  # positions through the body, per call
        ds.module.get_decoder().register_forward_pre_hook(
            lambda m, args, kw: seen.append(kw["input_ids"].numel()), with_kwargs=True
        )
        share = batch.slice_groups(0, 3) if rank == 0 else batch.slice_groups(3, 4)
        stats = ds.step(share)
        got = ds.policy_weights().tensors()
        res = {
            "diff": max(float((got[k] - ref[k]).abs().max()) for k in ref),
            "update": max(float((ref[k] - model.state_dict()[k]).abs().max()) for k in ref),
            "loss": [stats["train/loss"], ref_stats["train/loss"]],
            "grad_norm": [stats["train/grad_norm"], ref_stats["train/grad_norm"]],
            "entropy": [stats["train/entropy"], ref_stats["train/entropy"]],
            "positions": seen,
        }
        return ds, share, res

    out = {}
    cases = [(0, "token"), (2, "sample"), (3, "prompt")]  # (ZeRO-1: the run test below)
    for stage, agg in cases:
        over = [*SYNTH, "precision=fp32", "trainer.micro_batch_size=4", f"aggregation={agg}"]
        cfg_t = options([*over, "trainer=torch"])
        cfg_d = options([*over, "trainer=deepspeed", f"trainer.zero_stage={stage}"])
        model, precision, batch = synthetic(cfg_t)
        ds, share, res = against_torch(cfg_t, cfg_d, model, precision, batch)
        if stage in (0, 3):  # a non-finite loss on rank 1 only: both ranks skip, weights unchanged
            before = ds.engine.weights_digest()
            bad = copy.deepcopy(share)
            if rank == 1:
                bad.advantages[0] = float("nan")
            skipped = ds.step(bad)
            res["nan_step"] = skipped
            res["nan_unchanged"] = ds.engine.weights_digest() == before
            res["after_nan"] = ds.step(share)["train/step_skipped"]
        res["digest"] = ds.engine.weights_digest()
        out[f"{stage}-{agg}"] = res
        if stage == 3:
            # rank 1's group gets a distinct prompt per row, so only rank 0 could share prompts (two
            # model calls, each gathering the ZeRO-3 parameters collectively): the ranks must agree
            # on one path per micro-batch, or the step hangs
            mixed = copy.deepcopy(batch)
            rows = mixed.group_ids == 3
            g = torch.Generator().manual_seed(7)
            mixed.input_ids[rows, : mixed.start] = torch.randint(2, 40, (int(rows.sum()), mixed.start), generator=g)
            ds, _, res = against_torch(cfg_t, cfg_d, model, precision, mixed)
            res["digest"] = ds.engine.weights_digest()
            out["3-mixed-prompts"] = res
            # rows of very different lengths on rank 0 only (two length buckets in each of its
            # micro-batches), and rank 1's rows with a prompt each: the ranks agree on a plan of
            # passes, rank 1 filling it with padding passes
            uneven = bucketed_batch(lambda r: r < 12 and r % 2 == 0, distinct=(3,))
            uneven = with_own_logprobs(uneven, model, precision, cfg_t)
            ds, _, res = against_torch(cfg_t, cfg_d, model, precision, uneven, overhead=16)
            res["digest"] = ds.engine.weights_digest()
            out["3-buckets-on-one-rank"] = res
    with open(f"{sys.argv[1]}/rank{rank}.json", "w") as f:
        json.dump(out, f)
    # as a run ends: its process groups destroyed and gloo's worker threads settled before the
    # interpreter finalizes (a worker still dropping the last collective's tensors then would abort
    # the process: "terminate called without an active exception", see end_distributed)
    assert end_distributed() and not dist.is_initialized()
    """
)


def _torchrun(args: list[str], tmp_path: Path, **kw) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(_free_port()),
    ]
    return subprocess.Popen(
        [*cmd, *args],
        env=_env(tmp_path),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        **kw,
    )


def _sigkill_tree(proc: subprocess.Popen) -> None:
    for pid in [proc.pid, *descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.communicate()


def _finish(proc: subprocess.Popen, timeout: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _sigkill_tree(proc)
        pytest.fail("torchrun timed out")
    assert proc.returncode == 0, out[-4000:]
    # no rank aborted as it exited (each rank's stderr is in out; see end_distributed)
    assert "terminate called" not in out, out[-4000:]
    return out


def test_two_ranks_step_equals_torch_on_whole_batch(tmp_path):
    script = tmp_path / "two_ranks.py"
    script.write_text(TWO_RANK_SCRIPT)
    _finish(_torchrun([str(script), str(tmp_path), str(Path(__file__).parent)], tmp_path), timeout=240)
    _nothing_compiled(tmp_path)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for case, res in ranks[0].items():
        assert res["update"] > 1e-4, case
        # a few float32 ulps of a weight near 2 (2.4e-7 each): measured up to 1.1e-6 on a 16-core CPU
        assert res["diff"] <= 2e-6, f"{case}: 2 ranks vs torch on the whole batch: max |diff| {res['diff']:g}"
        for key in ("loss", "grad_norm", "entropy"):
            assert res[key][0] == pytest.approx(res[key][1], rel=1e-5, abs=1e-6), (case, key)
        assert ranks[1][case]["digest"] == res["digest"], f"{case}: the ranks' weights differ"
        assert ranks[1][case]["loss"][0] == pytest.approx(
            res["loss"][0], abs=1e-7
        )  # global statistics on both
        if "nan_step" in res:
            for r in ranks:
                assert r[case]["nan_step"]["train/step_skipped"] == 1.0, case
                assert r[case]["nan_step"]["train/nonfinite_skipped"] == 1.0, case
                assert r[case]["nan_unchanged"], case
                assert r[case]["after_nan"] == 0.0, case
    # length buckets under ZeRO-3 on rank 0 only: per micro-batch a short and a long pass (2 rows each),
    # each its prompt once (s positions) where every rank's pass can share; rank 1's real pass (4 rows,
    # a prompt each: no sharing, so rank 0's first pass does not share either), then padding passes
    # (2 rows sharing a 1-token prompt, 1 position each after it)
    s, short, long = PROMPT - 1, SHORT - 1, LENGTH - 1
    assert ranks[0]["3-buckets-on-one-rank"]["positions"] == [
        *[2 * short, s, 2 * (long - s)],
        *[s, 2 * (short - s), s, 2 * (long - s)] * 2,
    ]
    assert ranks[1]["3-buckets-on-one-rank"]["positions"] == [4 * short, 1, 2, *[1, 2, 1, 2] * 2]


def test_two_ranks_run_sigkill_resume(tiny_overrides, tmp_path):
    """torchrun, 2 processes, ZeRO-1 (the trainer=deepspeed default): killed with SIGKILL after its
    first checkpoint, started again: one MLflow run with every step once, each rank generating and
    training on its half of the batch, the ranks' weights identical."""
    over = merged(
        tiny_overrides,
        EASY,
        [
            "trainer=deepspeed",
            "async_mode=sync",
            "trainer.total_steps=4",
            "eval.every=2",
            "checkpoint_every=2",
            "trainer.device=cpu",  # two ranks on gloo, also on a machine with one GPU
        ],
    )
    uri, experiment = _tracking(over)
    out = tmp_path / "run"
    args = [str(REPO / "train.py"), *over]
    proc = _torchrun(args, tmp_path)
    last = out / "checkpoint" / "last.pt"
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if last.is_file() and torch.load(last, weights_only=False)["step"] >= 2:
                break
            time.sleep(0.05)
        assert proc.poll() is None, (
            "the run ended before it could be killed:\n" + proc.communicate()[0][-3000:]
        )
    finally:
        _sigkill_tree(proc)  # torchrun and both ranks, at once
    killed_at = torch.load(last, weights_only=False)["step"]
    assert 2 <= killed_at < 4

    log = _finish(_torchrun(args, tmp_path), timeout=240)
    _nothing_compiled(tmp_path)
    assert f"at step {killed_at}" in log  # resumed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 4
    assert len(_runs(uri, experiment)) == 1
    rid = summary["run_id"]
    assert [s for s, _ in _metrics(uri, rid, "train/reward")] == [1, 2, 3, 4]
    assert [s for s, _ in _metrics(uri, rid, "val/pass_rate")] == [0, 2, 4]
    assert any(v == 0.0 for _, v in _metrics(uri, rid, "train/step_skipped"))
    # 32 sequences a step = 2 ranks x 4 prompts x 4 generations: 8 groups, trained or dropped
    trained = dict(_metrics(uri, rid, "train/groups_trained"))
    dropped = dict(_metrics(uri, rid, "data/zero_variance_dropped_step"))
    assert all(trained[s] + dropped[s] == 8 for s in range(1, 5)), (trained, dropped)
    engine = out / "checkpoint" / "engine" / "step_00000004"
    digests = {
        torch.load(engine / f"scalerl_rank_{r:05d}.pt", weights_only=False)["weights_digest"] for r in (0, 1)
    }
    assert len(digests) == 1, "the ranks' weights differ"
    module = torch.load(engine / "mp_rank_00_model_states.pt", weights_only=False)["module"]
    policy = {k.removeprefix("policy."): v for k, v in module.items()}  # DeepSpeed wraps the policy
    assert digests == {_digest(policy)}  # and it is the digest of the weights DeepSpeed saved


def test_two_ranks_pipeline_rl_zero3_from_one_engine(tiny_overrides, tmp_path):
    """torchrun, 2 trainer processes, ZeRO-3, async_mode=pipeline_rl: rank 0 hosts the engine and
    hands each rank its share of every step's groups; each weight update gathers one bucket at a
    time on both ranks. Every step trains 8 groups over the two ranks, the lag stays within k, and
    the ranks end with identical weights."""
    over = merged(
        tiny_overrides,
        EASY,
        [
            "trainer=deepspeed",
            "trainer.zero_stage=3",
            "async_mode=pipeline_rl",
            "placement.bucket_mb=0.05",
            "trainer.total_steps=4",
            "eval.every=2",
            "checkpoint_every=4",
            "trainer.device=cpu",
        ],
    )
    uri, _ = _tracking(over)
    out = tmp_path / "run"
    _finish(_torchrun([str(REPO / "train.py"), *over], tmp_path), timeout=300)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 4
    rid = summary["run_id"]
    trained = dict(_metrics(uri, rid, "train/groups_trained"))
    dropped = dict(_metrics(uri, rid, "data/zero_variance_dropped_step"))
    assert all(trained[s] + dropped[s] == 8 for s in range(1, 5)), (trained, dropped)
    assert max(v for _, v in _metrics(uri, rid, "train/policy_lag_max")) <= 8
    engine = out / "checkpoint" / "engine" / "step_00000004"
    digests = {
        torch.load(engine / f"scalerl_rank_{r:05d}.pt", weights_only=False)["weights_digest"] for r in (0, 1)
    }
    assert len(digests) == 1, "the ranks' weights differ"


def test_one_process_listens_on_loopback_only(tmp_path):
    """trainer=deepspeed without a launcher: the rendezvous goes through a file (torch's TCP store
    would listen on every interface) and gloo's own connections stay on loopback."""
    code = textwrap.dedent(
        """
        import json, os, torch
        from procs import listening_addresses
        from scalerl.trainer.deepspeed_engine import init_distributed
        init_distributed(torch.device("cpu"))
        print(json.dumps(listening_addresses(os.getpid())))
        """
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    env["TORCH_EXTENSIONS_DIR"] = str(tmp_path / "ext")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    addrs = json.loads(r.stdout.strip().splitlines()[-1])
    assert addrs and all(a == "127.0.0.1" for a, _ in addrs), addrs


def test_a_rendezvous_port_another_process_holds_is_one_line(tiny_overrides, tmp_path):
    """Rank 0 under launcher variables whose MASTER_PORT another process holds (two sweep jobs on one
    node whose ids share a port pair, two torchrun runs given the same port): the run ends with one
    line naming the address and what to do, not torch's DistNetworkError."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        env = _env(tmp_path)
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        r = subprocess.run(
            [
                sys.executable,
                str(REPO / "train.py"),
                *tiny_overrides,
                "trainer=deepspeed",
                "trainer.total_steps=1",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"error: rank 0 could not open the rendezvous at 127.0.0.1:{port} (address already in use)"
    )
    assert "run the sweep again" in last and "--master-port" in last and "Traceback" not in r.stderr


def test_a_run_ends_the_process_group_its_trainer_started(tmp_path):
    """train() that builds its own trainer ends the torch.distributed the trainer started, when the
    run ends normally and when it fails: the groups destroyed, the rank variables a single process
    was given taken back, gloo's worker threads settled (a worker still dropping a collective's
    tensors as the interpreter finalizes aborts the process). A run given its components leaves the
    caller's process group alone. (The parts are stand-ins: only the ownership is tested here.)"""
    code = textwrap.dedent(
        """
        import json, os, sys, torch
        import torch.distributed as dist
        from scalerl.config import compose
        from scalerl.loop import run as loop_run
        from scalerl.messages import RunError
        from scalerl.trainer.deepspeed_engine import init_distributed

        def build(cfg, tracker=None, config=None):  # what a DeepSpeed trainer starts, and one collective
            init_distributed(torch.device("cpu"))
            dist.all_reduce(torch.ones(64))
            return "parts"

        def recipe(run, stop):
            if os.environ.get("RUN_FAILS"):
                raise RunError("the run failed")
            return {"steps": 1}

        loop_run.build, loop_run._recipe = build, recipe
        cfg = compose([f"out_dir={sys.argv[1]}"])
        seen = {}
        seen["normal"] = [loop_run.train(cfg), dist.is_initialized(), "RANK" in os.environ]
        os.environ["RUN_FAILS"] = "1"
        try:
            loop_run.train(cfg)
        except RunError as e:
            seen["error"] = [str(e), dist.is_initialized(), "RANK" in os.environ]
        del os.environ["RUN_FAILS"]
        init_distributed(torch.device("cpu"))  # the caller's
        seen["given"] = [str(loop_run.train(cfg, components="parts")), dist.is_initialized()]
        print(json.dumps(seen))
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in (*_RANK_VARS, "DS_ACCELERATOR")}
    env["TORCH_EXTENSIONS_DIR"] = str(tmp_path / "ext")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH")) if p)
    r = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode == 0 and "terminate called" not in r.stderr, r.stderr[-3000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen == {
        "normal": [{"steps": 1}, False, False],
        "error": ["the run failed", False, False],
        "given": ["{'steps': 1}", True],
    }


def test_a_crafted_engine_checkpoint_is_refused_on_resume(tiny_overrides, tmp_path):
    """DeepSpeed loads its own files with weights_only=False: a file of the engine checkpoint that
    names a code-running global is refused in one line before DeepSpeed reads it, and runs nothing."""
    from test_checkpoint import _Payload

    over = merged(
        tiny_overrides,
        EASY,
        ["trainer=deepspeed", "trainer.zero_stage=1", "async_mode=sync", "trainer.total_steps=2"],
    )
    cmd = [sys.executable, str(REPO / "train.py"), *over]
    r = subprocess.run(cmd, env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    tag = Path(dict(o.split("=", 1) for o in over)["out_dir"]) / "checkpoint" / "engine" / "step_00000002"
    marker = tmp_path / "pwned"
    torch.save({"module": _Payload(str(marker))}, tag / "mp_rank_00_model_states.pt")
    r = subprocess.run(
        [*cmd, "trainer.total_steps=3"], env=_env(tmp_path), capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and "[WARNING]" not in ln]
    assert len(lines) == 1 and "refused" in lines[0] and "posix.system" in lines[0], r.stderr[-2000:]
    assert not marker.exists()
