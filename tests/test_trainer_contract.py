"""The trainer/engine contract: the same checks over every engine (plain torch; DeepSpeed ZeRO 0-3 in
one process, on the CPU with gloo; the two-process checks are in test_deepspeed.py).

* One step (two micro-batches, length buckets, shared prompts) lands on the weights of the plainest
  reference: plain torch, one padded pass per micro-batch, no sharing.
* Length bucketing and shared prompts are active: the positions through the model's body are those
  of the buckets, each group's prompt once.
* A non-finite loss skips the step (weights unchanged, counted); ``max_nonfinite_steps`` in a row
  raise :class:`NonFiniteError`.
* State + engine checkpoint round trip: a fresh trainer restored from them has identical weights,
  and a second step equal to the original's.
* ``policy_weights().tensors()`` are the module's whole weights.
"""

from __future__ import annotations

import copy
import socket

import pytest
import torch
from extras import need

CPU = torch.device("cpu")
VOCAB = 40
ENGINES = ["torch", *(pytest.param(f"zero{z}", marks=pytest.mark.deepspeed) for z in range(4))]
BASE = [
    "model.hidden_size=32",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.num_kv_heads=2",
    "model.intermediate_size=64",
    "precision=fp32",
    "trainer.generations_per_prompt=4",
    "trainer.micro_batch_size=8",
    "trainer.warmup_steps=0",
    "trainer.lr=1e-3",
    # Adam's first step is about lr x sign(g) where |g| >> eps: with eps 1e-4 the step stays smooth in
    # the gradient, so equal gradients (to rounding) give equal weights (as in test_deepspeed.py)
    "trainer.adam_eps=1e-4",
    "trainer.threads=1",
    "trainer.max_nonfinite_steps=2",
]
PROMPT, LENGTH, SHORT = 6, 64, 17


def engine_overrides(name: str) -> list[str]:
    if name == "torch":
        return ["trainer=torch"]
    return ["trainer=deepspeed", f"trainer.zero_stage={int(name.removeprefix('zero'))}"]


def bucketed_batch(long_row, *, distinct=(), seed: int = 0, groups: int = 4, per: int = 4):
    """``groups`` x ``per`` rows of random tokens: rows with ``long_row(r)`` run to ``LENGTH`` tokens,
    the others end at ``SHORT`` (right-padded with 0), so that a micro-batch's rows fall into two
    length buckets; each group's rows share their ``PROMPT``-token prompt, except groups in
    ``distinct`` (a prompt per row). Behaviour log-probs are 0 until :func:`with_own_logprobs`."""
    from scalerl.trainer import TrainBatch

    g = torch.Generator().manual_seed(seed)
    n = groups * per
    ids = torch.randint(2, VOCAB, (n, LENGTH), generator=g)
    mask = torch.zeros(n, LENGTH - 1)
    for gi in range(groups):
        if gi not in distinct:
            ids[gi * per : (gi + 1) * per, :PROMPT] = ids[gi * per, :PROMPT]
    for r in range(n):
        end = LENGTH if long_row(r) else SHORT
        ids[r, end:] = 0
        mask[r, PROMPT - 1 : end - 1] = 1.0
    return TrainBatch(
        input_ids=ids,
        mask=mask,
        gen_logp=torch.zeros(n, LENGTH - 1),
        versions=torch.zeros(n, LENGTH - 1, dtype=torch.long),
        advantages=torch.randn(n, generator=g),
        group_ids=torch.arange(groups).repeat_interleave(per),
        start=PROMPT - 1,
    )


def with_own_logprobs(batch, model, precision, config):
    """``batch`` with the policy's own log-probs as behaviour log-probs (importance ratios 1)."""
    from parts import trainer_options

    from scalerl.trainer import TorchEngine, Trainer

    engine = TorchEngine(copy.deepcopy(model), config.trainer, CPU)
    tr = Trainer(engine, precision, **trainer_options(config), temperature=1.0)
    with torch.no_grad():
        logp, _ = tr.token_logprobs(batch)
    batch.gen_logp[:, batch.start :] = logp * batch.mask[:, batch.start :]
    return batch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ds_process(tmp_path_factory):
    """This process as a one-rank DeepSpeed job on the CPU; the rank variables are restored afterwards."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DS_ACCELERATOR", "cpu")
        need("deepspeed")
        for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "RANK": "0"}.items():
            mp.setenv(k, v)
        mp.setenv("WORLD_SIZE", "1")
        mp.setenv("LOCAL_RANK", "0")
        mp.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path_factory.mktemp("torch_extensions")))
        yield


@pytest.fixture(params=ENGINES)
def setup(request):
    """(make a trainer of this engine from a model, the reference config, the start model, precision,
    a batch whose micro-batches each hold a long and a short group)."""
    from parts import options, trainer_options

    from scalerl.model.build import build_model
    from scalerl.model.precision import Precision
    from scalerl.trainer import make_trainer

    if request.param != "torch":
        request.getfixturevalue("ds_process")
    cfg = options([*BASE, *engine_overrides(request.param)])
    ref_cfg = options([*BASE, "trainer=torch"])
    model = build_model(cfg.model, vocab_size=VOCAB, seed=0, pad_token_id=0, eos_token_id=1)
    precision = Precision.for_device("fp32", "fp32", "cpu")
    precision.prepare(model)
    # micro-batches of 2 groups: groups 0 and 2 long, 1 and 3 short
    batch = with_own_logprobs(bucketed_batch(lambda r: (r // 4) % 2 == 0), model, precision, ref_cfg)

    def make(start=model, config=cfg):
        tr = make_trainer(
            copy.deepcopy(start), precision, **trainer_options(config), temperature=1.0, device=CPU
        )
        tr.bucket_overhead_tokens = 16  # this small batch splits into its two lengths
        return tr

    return make, ref_cfg, model, precision, batch


def positions_through(body: torch.nn.Module) -> list[int]:
    """A list that records how many token positions each call of ``body`` is given."""
    seen: list[int] = []
    body.register_forward_pre_hook(lambda m, args, kw: seen.append(kw["input_ids"].numel()), with_kwargs=True)
    return seen


def whole_weights(tr) -> dict[str, torch.Tensor]:
    with tr.gathered():
        return {k: v.detach().clone() for k, v in tr.module.state_dict().items()}


def test_step_equals_plain_reference_with_buckets_and_shared_prompts(setup):
    make, ref_cfg, model, _, batch = setup
    ref = make(config=ref_cfg)
    ref.bucket_lengths = False
    ref.options.share_prompts = False
    seen_ref = positions_through(ref.module.get_decoder())
    ref_stats = ref.step(batch)
    tr = make()
    seen = positions_through(tr.module.get_decoder())
    stats = tr.step(batch)

    # the reference: one padded pass per micro-batch (8 rows x 63 positions)
    assert seen_ref == [8 * (LENGTH - 1)] * 2
    # per micro-batch: the short group, then the long one, each its prompt once, then its rows up to
    # their own last trained token
    s = PROMPT - 1
    assert seen == [s, 4 * (SHORT - 1 - s), s, 4 * (LENGTH - 1 - s)] * 2

    assert stats["train/step_skipped"] == 0.0
    for k in ("train/loss", "train/grad_norm", "train/entropy", "train/is_ratio_mean", "train/lr"):
        assert stats[k] == pytest.approx(ref_stats[k], rel=1e-5, abs=1e-6), k
    want = ref.policy_weights().tensors()
    got = tr.policy_weights().tensors()
    update = max(float((want[k] - model.state_dict()[k]).abs().max()) for k in want)
    assert update > 1e-4  # the step moved the weights
    diff = max(float((got[k] - want[k]).abs().max()) for k in want)
    assert diff <= 1e-6, f"{diff:g} (update {update:g})"
    # and the hand-over holds the module's whole weights
    assert got.keys() == whole_weights(tr).keys()
    assert all(torch.equal(got[k], v) for k, v in whole_weights(tr).items())


def test_non_finite_loss_skips_the_step_and_too_many_raise(setup):
    from scalerl.trainer import NonFiniteError

    make, _, _, _, batch = setup
    bad = copy.deepcopy(batch)
    bad.advantages[5] = float("nan")
    tr = make()
    before = tr.policy_weights().tensors()
    stats = tr.step(bad)
    assert stats["train/step_skipped"] == 1.0 and stats["train/nonfinite_skipped"] == 1.0
    after = tr.policy_weights().tensors()
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert tr.step(batch)["train/step_skipped"] == 0.0  # the count of skips in a row starts again
    assert tr.step(bad)["train/nonfinite_skipped"] == 2.0
    with pytest.raises(NonFiniteError, match="trainer.max_nonfinite_steps=2"):
        tr.step(bad)


def test_checkpoint_round_trip_gives_the_same_weights_and_next_step(setup, tmp_path):
    make, _, model, _, batch = setup
    batch2 = copy.deepcopy(batch)
    batch2.advantages = batch2.advantages.flip(0)
    tr = make()
    tr.step(batch)
    # what a run saves: rank 0's state in the main checkpoint, then the engine's own
    torch.save(tr.state_dict(), tmp_path / "main.pt")
    tag = tr.save_engine_checkpoint(str(tmp_path / "engine"), "t1", {"mark": 7})

    fresh = make(start=model)  # from the start weights, with a fresh optimiser
    fresh.load_state_dict(torch.load(tmp_path / "main.pt", weights_only=False))
    own = fresh.load_engine_checkpoint(str(tmp_path / "engine"), tag) if tag is not None else None
    if tr.engine.name == "torch":
        assert tag is None  # its whole state is in state_dict
    else:
        assert tag == "t1" and own["mark"] == 7
    a, b = tr.policy_weights().tensors(), fresh.policy_weights().tensors()
    assert all(torch.equal(a[k], b[k]) for k in a)

    s1, s2 = tr.step(batch2), fresh.step(batch2)
    assert s1["train/step_skipped"] == 0.0 and s1 == s2
    a, b = tr.policy_weights().tensors(), fresh.policy_weights().tensors()
    assert max(float((a[k] - model.state_dict()[k]).abs().max()) for k in a) > 1e-4
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_make_trainer_names_the_engines():
    from scalerl.config.groups.trainer import TorchTrainerOption
    from scalerl.trainer import ENGINES, make_trainer

    assert {"torch", "deepspeed"} <= set(ENGINES)
    unknown = TorchTrainerOption(name="jax")
    with pytest.raises(ValueError, match=r"trainer.name='jax': one of deepspeed, torch"):
        make_trainer(
            torch.nn.Linear(1, 1),
            None,
            trainer=unknown,
            loss=None,
            aggregation=None,
            correction=None,
            temperature=1.0,
            device=CPU,
        )


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


_ENDED_ELSEWHERE = """
import copy, sys
import torch.distributed as dist
from deepspeed.utils import groups
sys.path.insert(0, sys.argv[1])
from test_trainer_contract import BASE, CPU, VOCAB, engine_overrides
from parts import options, trainer_options
from scalerl.model.build import build_model
from scalerl.model.precision import Precision
from scalerl.trainer import make_trainer

config = options([*BASE, *engine_overrides("zero0")])
model = build_model(config.model, vocab_size=VOCAB, seed=0, pad_token_id=0, eos_token_id=1)
precision = Precision.for_device("fp32", "fp32", "cpu")
precision.prepare(model)
opts = trainer_options(config)
make_trainer(copy.deepcopy(model), precision, **opts, temperature=1.0, device=CPU)
assert groups._get_data_parallel_group() is not None
dist.destroy_process_group()  # as vLLM's teardown does
make_trainer(copy.deepcopy(model), precision, **opts, temperature=1.0, device=CPU)
assert groups._get_data_parallel_group() in dist.distributed_c10d._world.pg_group_ranks
print("started")
"""


@pytest.mark.deepspeed
def test_a_deepspeed_trainer_starts_where_another_party_ended_torch_distributed():
    """vLLM's teardown of an engine that ran in a process ends torch.distributed with torch's own
    call, which DeepSpeed does not hear of: its cached groups outlived the world, and the next
    DeepSpeed trainer in the process failed at its first broadcast ("Group ... is not registered").
    A trainer built after such an ending starts, on a registered group. In a process of its own:
    ending the world here would end the groups of any vLLM engine this test process holds."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    need("deepspeed")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0")
    env.update(WORLD_SIZE="1", LOCAL_RANK="0")
    here = str(Path(__file__).resolve().parent)
    proc = subprocess.run(
        [sys.executable, "-c", _ENDED_ELSEWHERE, here], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and "started" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
