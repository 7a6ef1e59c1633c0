"""The trainer's memory bound: the LM head over chunks of tokens (``trainer.logits_chunk_tokens``) gives
the unchunked log-probs, entropy, loss and gradients without storing a micro-batch's full logits;
``trainer.activation_checkpointing`` recomputes the blocks with the same result."""

from __future__ import annotations

import copy

import pytest
import torch
from test_model import tiny_model_cfg
from test_trainer import VOCAB, grouped_batch, trainer_opts

from scalerl.model.build import build_model
from scalerl.model.precision import Precision, head_logprobs
from scalerl.trainer import make_trainer

CPU = torch.device("cpu")
# (body, head): fp32, the paper's FP32 head on a bf16 body, and bf16 throughout (emulated on CPU)
PRECISIONS = [("fp32", "fp32"), ("bf16", "fp32"), ("bf16", "bf16")]


def opts_with(chunk: int, *, share: bool = True, checkpointing: bool = False) -> dict:
    opts = trainer_opts(share)
    opts["trainer"].logits_chunk_tokens = chunk
    opts["trainer"].activation_checkpointing = checkpointing
    return opts


def logprobs_and_grads(model, precision, opts, batch):
    """(log-probs, entropy, loss, gradients) of the trainer's forward and its CISPO loss on ``batch``."""
    tr = make_trainer(copy.deepcopy(model), precision, **opts, temperature=0.7, device=CPU)
    tr.module.train()
    logp, entropy = tr.token_logprobs(batch, with_entropy=True)
    totals = {"tokens": float(batch.mask.sum()), "sequences": float(batch.num_sequences), "groups": 3.0}
    loss = tr._scaled_loss(batch, logp, totals)
    loss.backward()
    grads = {k: p.grad.clone() for k, p in tr.module.named_parameters() if p.grad is not None}
    return logp.detach(), entropy, float(loss.detach()), grads


def assert_same(a, b, *, tol: float, grad_tol: float = 1e-4):
    """Log-probs and entropies within ``tol``, the loss within 1e-5, each gradient within
    ``grad_tol`` of its norm (a bf16 body rounds its linear layers' gradients to bf16, as autocast
    does: sums in another order move some of those roundings by one bf16 step, 2^-8)."""
    logp_a, ent_a, loss_a, g_a = a
    logp_b, ent_b, loss_b, g_b = b
    assert torch.allclose(logp_a, logp_b, atol=tol, rtol=0), (logp_a - logp_b).abs().max()
    assert torch.allclose(ent_a, ent_b, atol=tol, rtol=0), (ent_a - ent_b).abs().max()
    assert loss_a == pytest.approx(loss_b, rel=1e-5, abs=1e-7)
    assert g_a.keys() == g_b.keys() and len(g_a) > 0
    for k in g_a:
        err = float((g_a[k] - g_b[k]).norm() / g_a[k].norm().clamp_min(1e-12))
        assert err < grad_tol, (k, err)


# the fast selection keeps one case (the paper's fp32 head on a bf16 body, gpt2); the other five
# (seconds each: every chunk size, both ways of sharing prompts) run with the slow tests
CHUNK_CASES = [
    pytest.param(
        arch, body, head, marks=() if (arch, body, head) == ("gpt2", "bf16", "fp32") else pytest.mark.slow
    )
    for arch in ("gpt2", "llama")
    for body, head in PRECISIONS
]


@pytest.mark.parametrize("arch,body,head", CHUNK_CASES)
def test_chunked_head_equals_the_whole_head(arch, body, head):
    """Chunk sizes that divide the positions, that do not (the last chunk short), of one position,
    and larger than the batch; padded rows of unequal lengths, shared prompts on and off."""
    model = build_model(tiny_model_cfg(arch), VOCAB, seed=0, pad_token_id=0, eos_token_id=1)
    precision = Precision.for_device(body, head, "cpu", impl="emulated")
    precision.prepare(model)
    batch = grouped_batch(seed=2)
    positions = batch.num_sequences * (batch.input_ids.shape[1] - 1 - batch.start)
    for share in (False, True):
        ref = logprobs_and_grads(model, precision, opts_with(0, share=share), batch)
        assert positions % 40 and positions % 17 == 0  # 17 divides the positions, 40 does not
        for chunk in (1, 17, 40, positions // 2, positions + 5):
            got = logprobs_and_grads(model, precision, opts_with(chunk, share=share), batch)
            # bf16 emulation rounds the logits: a chunk's matmul may round one logit the other way
            assert_same(
                got, ref, tol=2e-5 if head == "fp32" else 2e-2, grad_tol=1e-4 if body == "fp32" else 2**-8
            )


def test_the_fp32_head_stays_fp32_when_chunked():
    """precision=fp32_head on a bf16 body: the chunked log-probs are the fp32 head's, not bf16's."""
    model = build_model(tiny_model_cfg("llama"), VOCAB, seed=0, pad_token_id=0, eos_token_id=1)
    fp32_head = Precision.for_device("bf16", "fp32", "cpu", impl="emulated")
    fp32_head.prepare(model)
    batch = grouped_batch(seed=3)
    with torch.no_grad():
        hidden = torch.randn(batch.num_sequences, 9, 32)
        targets = torch.randint(0, VOCAB, (batch.num_sequences, 9))
        whole, _ = head_logprobs(fp32_head, model, hidden, targets)
        chunked, _ = head_logprobs(fp32_head, model, hidden, targets, chunk_tokens=10)
        bf16 = Precision.for_device("bf16", "bf16", "cpu", impl="emulated")
        rounded, _ = head_logprobs(bf16, model, hidden, targets, chunk_tokens=10)
    assert torch.allclose(chunked, whole, atol=1e-6, rtol=0)
    direct = torch.log_softmax(hidden.float() @ model.get_output_embeddings().weight.float().T, -1)
    assert torch.allclose(chunked, direct.gather(-1, targets[..., None]).squeeze(-1), atol=1e-5)
    assert (rounded - chunked).abs().max() > 1e-4  # the bf16 head differs: the test can tell them apart


def saved_tensor_sizes(fn) -> list[torch.Size]:
    """The shapes of the tensors autograd stores for the backward while ``fn`` runs."""
    shapes: list[torch.Size] = []

    def pack(t):
        shapes.append(t.shape)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return shapes


@pytest.mark.parametrize("checkpointing", [False, True])
def test_no_full_vocabulary_logits_are_stored_for_the_backward(checkpointing):
    """Unchunked, autograd keeps [positions, vocabulary] tensors for the backward; chunked, none
    larger than one chunk's: the peak no longer grows with vocabulary x tokens. With activation
    checkpointing the blocks' activations go too (only what their inputs need is kept)."""
    vocab = 300
    model = build_model(tiny_model_cfg("llama"), vocab, seed=0, pad_token_id=0, eos_token_id=1)
    precision = Precision.for_device("fp32", "fp32", "cpu")
    batch = grouped_batch(seed=4)
    positions = batch.num_sequences * (batch.input_ids.shape[1] - 1 - batch.start)
    stored = {}
    for chunk in (0, 16):
        tr = make_trainer(
            copy.deepcopy(model),
            precision,
            **opts_with(chunk, checkpointing=checkpointing),
            temperature=1.0,
            device=CPU,
        )
        tr.module.train()
        shapes = saved_tensor_sizes(lambda tr=tr: tr.token_logprobs(batch))
        stored[chunk] = max((s.numel() for s in shapes if len(s) and s[-1] == vocab), default=0)
        if checkpointing:  # no [.., intermediate_size] MLP activations kept
            assert not [s for s in shapes if len(s) and s[-1] == 64], shapes
    assert stored[0] >= positions * vocab
    assert stored[16] <= 16 * vocab


def test_activation_checkpointing_recomputes_the_blocks_with_the_same_result():
    model = build_model(tiny_model_cfg("llama"), VOCAB, seed=0, pad_token_id=0, eos_token_id=1)
    precision = Precision.for_device("bf16", "fp32", "cpu", impl="emulated")
    precision.prepare(model)
    batch = grouped_batch(seed=5)
    ref = logprobs_and_grads(model, precision, opts_with(0, share=False), batch)
    calls: list[int] = []
    # a module inside the block: transformers >= 5.2x replays the block's ``forward``, not its
    # ``__call__``, so the block's own hooks run once; what its forward calls runs in both passes
    layer = model.get_decoder().layers[0].mlp
    hook = layer.register_forward_pre_hook(lambda *a: calls.append(1))
    # share_prompts stays on in the config: it is turned off (a replayed block would write the cache twice)
    got = logprobs_and_grads(model, precision, opts_with(16, share=True, checkpointing=True), batch)
    hook.remove()
    assert_same(got, ref, tol=2e-5)
    assert len(calls) == 2  # the block's forward, then its replay in the backward


def test_a_whole_step_lands_on_the_same_weights_chunked():
    """Micro-batches, length buckets, shared prompts and AdamW, chunked against unchunked."""
    model = build_model(tiny_model_cfg("gpt2"), VOCAB, seed=1, pad_token_id=0, eos_token_id=1)
    precision = Precision.for_device("fp32", "fp32", "cpu")
    batch = grouped_batch(seed=1)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    after, stats = {}, {}
    for chunk in (0, 13):
        opts = opts_with(chunk)
        opts["trainer"].micro_batch_size = 4
        tr = make_trainer(copy.deepcopy(model), precision, **opts, temperature=1.0, device=CPU)
        stats[chunk] = tr.step(batch)
        after[chunk] = tr.module.state_dict()
    assert stats[13]["train/step_skipped"] == 0.0
    for k in ("train/loss", "train/entropy", "train/gen_train_logprob_diff"):
        assert stats[13][k] == pytest.approx(stats[0][k], rel=1e-5, abs=1e-7), k
    assert max(float((after[0][k] - start[k]).abs().max()) for k in start) > 1e-4
    assert max(float((after[13][k] - after[0][k]).abs().max()) for k in start) < 1e-5


RETAIN = """
import sys, torch
from scalerl.trainer.trainer import set_malloc_mmap_threshold
def rss():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")) / 1024
if sys.argv[1] == "1":
    assert set_malloc_mmap_threshold(1)
x = torch.ones(16 << 18)  # a 16 MB block freed: glibc's default then serves up to 16 MB from its heap
del x
keep, big = [], []
before = rss()
for i in range(60):  # 4 MB activations interleaved with small tensors that stay
    big.append(torch.ones(1 << 20))
    # 64 KB each: too large for the holes the imports left in the heap (4 KB tensors landed in them
    # on a CI machine, and the freed 4 MB blocks then merged and were trimmed)
    keep.append(torch.ones(1 << 14))
del big
print(rss() - before)
"""


@pytest.mark.slow  # starts two Python processes that import torch and the trainer
def test_freed_activations_go_back_to_the_system():
    """trainer.malloc_mmap_threshold_mb: with glibc's default a step's freed activation tensors stay
    in the process (its heap cannot shrink past the small tensors allocated after them); with a 1 MB
    threshold they are returned when freed."""
    import subprocess
    import sys

    kept = {}
    for on in ("0", "1"):
        out = subprocess.run([sys.executable, "-c", RETAIN, on], capture_output=True, text=True, check=True)
        kept[on] = float(out.stdout.strip())
    assert kept["0"] > 150, kept  # about 240 MB of the 240 freed stay by default
    assert kept["1"] < 30, kept  # the 4 MB of the 64 KB tensors, not the activations


TRIM = """
import torch
from scalerl.trainer.trainer import malloc_trim, set_malloc_mmap_threshold
def rss():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")) / 1024
assert set_malloc_mmap_threshold(1)
keep, small = [], []
for i in range(400):  # 512 KB tensors (under the 1 MB threshold: from the heap) between ones that stay
    small.append(torch.ones(1 << 17))
    keep.append(torch.ones(1 << 12))
del small
before = rss()
assert malloc_trim()
print(before - rss())
"""


@pytest.mark.slow  # starts a Python process that imports torch and the trainer
def test_free_heap_pages_between_live_tensors_go_back_with_malloc_trim():
    """Tensors under the mmap threshold come from glibc's heap; freed between tensors that stay, their
    pages stay in the process until malloc_trim, which the trainer calls after each micro-batch."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", TRIM], capture_output=True, text=True, check=True)
    assert float(out.stdout.strip()) > 150  # of the 200 MB freed
