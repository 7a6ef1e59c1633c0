"""The weight-update group beside a ZeRO-3 default group, in one process (issue 56, item 6).

    python benchmarks/bench_weight_group.py --out DIR              # CUDA: NCCL, 1.5B and 7B shapes
    python benchmarks/bench_weight_group.py --out DIR --device cpu  # gloo, small shapes (checks the script)

One process is a DeepSpeed job of world 1 (its default group: NCCL on a GPU, gloo on a CPU). For
each model shape, its bf16 weights (no optimizer) are built partitioned by ZeRO-3
(``deepspeed.zero.Init``), and:

* **first gather, bucketed vs whole**: the extra memory of gathering the model one bucket at a time
  (``placement.bucket_mb``, as :class:`~scalerl.rollout.pool.EnginePool` does from its first update
  on) against gathering every parameter at once (what ``EnginePool._first`` did before), after the
  layout was learnt from ``ds_shape`` without a gather;
* **publish**: the weight-update group as a world of one (only the trainer's rank 0: every collective
  runs, nothing leaves the process) formed beside the default group, then two updates published
  through it; the extra memory rank 0 holds while publishing and after (before: a packed copy of
  every bucket, the whole model, kept until the next publish);
* **teardown**: the weight group closed, the default group ended, no process group left.

Memory: on CUDA ``torch.cuda.max_memory_allocated`` over the part, less what was allocated before
it; on a CPU the bytes the gathers made whole (ZeRO-3's gathered ``ds_numel``) and the sender's own
count of packed buckets alive, since the CPU allocator has no peak counter. Writes
``weight_group.json`` and ``weight_group.md`` to ``--out``; exits non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import common
import torch

# name -> (hidden, intermediate, layers, heads, kv heads, vocab): Qwen2.5-1.5B and -7B's shapes, and two
# small ones for a CPU
SHAPES = {
    "1.5b": (1536, 8960, 28, 12, 2, 151936),
    "7b": (3584, 18944, 28, 28, 4, 152064),
    "cpu-small": (256, 704, 4, 4, 2, 4096),
    "cpu-medium": (512, 1408, 6, 8, 2, 8192),
}


def build(shape: str, device: torch.device):
    """A bf16 Qwen2 of ``shape``, its parameters partitioned by ZeRO-3 as they are created."""
    import deepspeed
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hidden, inter, layers, heads, kv, vocab = SHAPES[shape]
    config = Qwen2Config(
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        vocab_size=vocab,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    ds = {"train_batch_size": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 3}}
    with deepspeed.zero.Init(config_dict_or_path=ds, dtype=torch.bfloat16, remote_device=None):
        model = Qwen2ForCausalLM(config)
    model.requires_grad_(False)
    return model


class Meter:
    """Extra memory of a part: CUDA's allocator peak over it, or (CPU) the largest byte count the
    part reports through :meth:`note`."""

    def __init__(self, device: torch.device):
        self.device = device
        self.noted = 0

    def note(self, nbytes: int) -> None:
        self.noted = max(self.noted, int(nbytes))

    @contextlib.contextmanager
    def part(self, out: dict, key: str):
        self.noted = 0
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        t0 = time.perf_counter()
        yield self
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            out[key] = torch.cuda.max_memory_allocated(self.device) - base
            out[key + "_after"] = torch.cuda.memory_allocated(self.device) - base
        else:
            out[key] = self.noted
        out[key + "_s"] = round(time.perf_counter() - t0, 3)


def measure(shape: str, device: torch.device, bucket_mb: float) -> dict:
    import deepspeed

    from scalerl.model.weights import PolicyWeights
    from scalerl.rollout.pool import weight_shapes
    from scalerl.transport import Layout, TransportSpec, WeightSender, connect

    out: dict = {"shape": shape, "bucket_mb": bucket_mb}
    model = build(shape, device)
    params = list(model.parameters())
    out["params"] = sum(p.ds_numel for p in params)
    out["model_bytes"] = sum(p.ds_numel * p.element_size() for p in params)
    meter = Meter(device)
    gathered: list[int] = []

    def gather(ps):
        ps = list(ps)
        nbytes = sum(p.ds_numel * p.element_size() for p in ps)
        gathered.append(nbytes)
        meter.note(nbytes)
        return deepspeed.zero.GatheredParameters(ps, modifier_rank=None)

    weights = PolicyWeights(model, gather=gather)
    precision = SimpleNamespace(body="bf16")  # the precision option's body
    layout = Layout.of(weight_shapes(weights, False, precision), bucket_mb)
    out["layout_gathers"] = len(gathered)  # learning the layout: none
    out["buckets"] = len(layout.buckets)
    out["largest_bucket_bytes"] = max(
        layout.numel(b) * torch.empty(0, dtype=getattr(torch, layout.dtype(b))).element_size()
        for b in range(len(layout.buckets))
    )
    source = weights.source(False)

    with meter.part(out, "bucketed_gather_bytes"):
        for b in range(len(layout.buckets)):
            with source(layout.names(b)):
                pass
    with meter.part(out, "whole_gather_bytes"):
        with source([e[0] for e in layout.entries]):
            pass

    # the weight-update group, a world of one, beside the default group
    backend = "nccl" if device.type == "cuda" else "gloo"
    spec = TransportSpec(backend, "127.0.0.1", 0, world=1, timeout_s=300)
    store = connect(spec, master=True)
    spec = TransportSpec(backend, "127.0.0.1", store.port, world=1, timeout_s=300)
    sender = WeightSender(store, spec, layout, device=device)
    t0 = time.perf_counter()
    sender.wait_joined(120)
    out["join_s"] = round(time.perf_counter() - t0, 3)
    with meter.part(out, "publish_bytes"):
        for version in range(2):
            sender.publish(source, version)
            meter.note(sender.peak_pending_bytes + max(gathered[-len(layout.buckets) :]))
    out["publish_pending_after_bytes"] = sender.pending_bytes()
    out["publish_peak_pending_bytes"] = sender.peak_pending_bytes
    sender.close()
    out["group_closed"] = sender.group is None
    del store, model, params, weights, source
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def checks(r: dict) -> list[str]:
    """What must hold of one shape's figures (a failed check is reported and fails the script)."""
    bad = []
    if r["layout_gathers"] != 0:
        bad.append("learning the layout gathered parameters")
    if r["bucketed_gather_bytes"] >= r["whole_gather_bytes"]:
        bad.append("the bucketed gather took no less memory than the whole one")
    if r["bucketed_gather_bytes"] > 2 * max(r["largest_bucket_bytes"], 1) + 64 * 2**20:
        bad.append("the bucketed gather held more than about a bucket")
    if r["publish_bytes"] >= r["model_bytes"]:
        bad.append("publish held a whole model's worth beside the model")
    if r["publish_pending_after_bytes"] > 2 * r["largest_bucket_bytes"]:
        bad.append("publish left more than two buckets alive after it returned")
    if not r["group_closed"]:
        bad.append("the weight group was not torn down")
    return bad


def markdown(report: dict) -> str:
    mib = 2**20
    lines = [
        f"# Weight group beside ZeRO-3 ({report['device']}, {report['backend']})",
        "",
        f"- machine: {report['machine']}; torch {report['torch']}, deepspeed {report['deepspeed']}",
        f"- bucket: {report['bucket_mb']} MiB; memory: {report['memory']}",
        "",
        "| shape | params | model MiB | buckets | whole gather MiB | bucketed gather MiB | publish extra MiB"
        " | left after publish MiB | join s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["shapes"]:
        lines.append(
            f"| {r['shape']} | {r['params'] / 1e9:.3f} B | {r['model_bytes'] / mib:.1f} | {r['buckets']} "
            f"| {r['whole_gather_bytes'] / mib:.1f} | {r['bucketed_gather_bytes'] / mib:.1f} "
            f"| {r['publish_bytes'] / mib:.1f} | {r['publish_pending_after_bytes'] / mib:.1f} | {r['join_s']} |"
        )
    lines += ["", f"- teardown: {report['teardown']}", f"- failed checks: {report['failed'] or 'none'}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu"
    )
    ap.add_argument("--shapes", default=None, help="comma-separated: 1.5b,7b (CUDA default), cpu-small,...")
    ap.add_argument("--bucket-mb", type=float, default=None, help="default 256 (CUDA), 1 (CPU)")
    args = ap.parse_args(argv)
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    shapes = (args.shapes or ("1.5b,7b" if device.type == "cuda" else "cpu-small,cpu-medium")).split(",")
    bucket_mb = args.bucket_mb or (256.0 if device.type == "cuda" else 1.0)

    from scalerl.trainer.deepspeed_engine import end_distributed, import_deepspeed, init_distributed

    deepspeed = import_deepspeed(device)
    init_distributed(device)
    import torch.distributed as dist

    report: dict = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "backend": "nccl" if device.type == "cuda" else "gloo",
        "machine": common.machine(),
        "commit": common.commit(),
        "torch": torch.__version__,
        "deepspeed": deepspeed.__version__,
        "bucket_mb": bucket_mb,
        "memory": (
            "torch.cuda.max_memory_allocated over each part, less what was allocated before it"
            if device.type == "cuda"
            else "bytes the gathers made whole / the sender's packed buckets (no CPU allocator peak)"
        ),
        "default_group": dist.get_backend(),
        "shapes": [],
    }
    failed: list[str] = []
    for shape in shapes:
        r = measure(shape, device, bucket_mb)
        report["shapes"].append(r)
        failed += [f"{shape}: {b}" for b in checks(r)]
        print(json.dumps(r), flush=True)
    settled = end_distributed()
    report["teardown"] = (
        f"weight groups closed; default group ended: {not dist.is_initialized()}; gloo workers settled: {settled}"
    )
    if dist.is_initialized():
        failed.append("the default group outlived end_distributed")
    report["failed"] = failed
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "weight_group.json").write_text(json.dumps(report, indent=1))
    (out / "weight_group.md").write_text(markdown(report))
    print(markdown(report), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
