"""The worker side of scalerl's vLLM generator: a vLLM worker extension (``worker_extension_cls``).

vLLM mixes these methods into each of its workers; the generator calls them on every worker with
``LLM.collective_rpc("scalerl_...")``. They run where the model runner is, so a weight update never
goes through vLLM's request path: in a pipeline_rl engine each worker joins the run's weight-update
group itself (rank = the engine's first rank + the worker's tensor-parallel rank) and streams every
broadcast bucket straight into ``load_weights``; no other copy of the model exists in the process
(a bucket's buffer lives while it is loaded), and it leaves the group when the engine stops.
"""

from __future__ import annotations

import logging

import torch

# vLLM warns, on every reload, of each weight the call did not bring: an update in buckets (whole
# layers each) brings only some in each call, so the warning would list most of the model every step
_RELOAD_LOG = "vllm.model_executor.model_loader.reload.inplace"


class _OnlyOtherBuckets(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "were not loaded from checkpoint" not in record.getMessage()


def _as_engine_dtype(items, dtype: torch.dtype):
    """Each (name, tensor) with an fp32 tensor whose values the engine's dtype holds exactly (an
    emulated bf16 trainer's rounded weights) cast to that dtype before vLLM loads it: the same values,
    and no "Attempted to load weight ... with dtype" warning from vLLM for every tensor of every update.
    A tensor the cast would change is left as it is (vLLM then warns, rightly: it rounds it)."""
    for name, t in items:
        if t.dtype == torch.float32 and dtype in (torch.bfloat16, torch.float16):
            low = t.to(dtype)
            if torch.equal(low.to(torch.float32), t):
                t = low
        yield name, t


def held_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every weight ``model`` computes with, by vLLM's name and in its layout (a tensor-parallel
    worker's: its shards).

    vLLM's CPU backend packs each linear layer's weight for its GEMM kernel (oneDNN, or AMX kernels)
    when it loads it, keeps only the packed form and leaves the ``weight`` parameter empty: a digest
    of the parameters would not see any linear layer. Such a weight is read back through the layer's
    own kernel: the identity matrix times it gives it exactly (every output is one weight times 1
    plus zeros), so the digest is of what the layer multiplies with. That costs a K x K x N product
    a layer (seconds for a 1B model on a CPU): fingerprints are a check, not a hot path."""
    out = dict(model.named_parameters())
    with torch.no_grad():
        for name, module in model.named_modules():
            w, kernel = getattr(module, "weight", None), getattr(module, "cpu_linear", None)
            if kernel is None or not isinstance(w, torch.Tensor) or w.numel():
                continue
            k = int(getattr(module, "input_size_per_partition", getattr(module, "input_size", 0)))
            eye = torch.eye(k, dtype=w.dtype, device=w.device)
            out[f"{name}.weight"] = kernel(eye, w, None).t()
    return out


class WeightSync:
    """Mixed into vLLM's worker (``self.model_runner`` is the worker's model runner)."""

    def scalerl_reload(self, state: dict[str, torch.Tensor]) -> int:
        """Load every tensor of ``state`` (checkpoint names) into the running model in place; the
        number of tensors loaded. vLLM re-applies its own post-processing (fused QKV, tied heads).
        ``state`` is one bucket of whole layers (the generator never splits a layer across calls)."""
        log, only = logging.getLogger(_RELOAD_LOG), _OnlyOtherBuckets()
        log.addFilter(only)
        try:
            items = _as_engine_dtype(state.items(), self.model_runner.model_config.dtype)
            self.model_runner.reload_weights(weights_iterator=items, is_checkpoint_format=True)
        finally:
            log.removeFilter(only)
        return len(state)

    def scalerl_join(self, spec, first_rank: int) -> int:
        """Join the weight-update group described by ``spec`` (a
        :class:`~scalerl.transport.TransportSpec`) as rank ``first_rank`` + this worker's rank
        in its engine; returns that rank."""
        from scalerl.transport import WeightReceiver

        rank = int(first_rank) + int(getattr(self, "rank", 0) or 0)
        device = getattr(self, "device", None) or torch.device("cpu")
        self._scalerl_rx = WeightReceiver(spec, rank, device)
        return rank

    def scalerl_receive(self) -> int:
        """Take the announced update: every bucket as it is broadcast, loaded as it arrives; returns
        the number of tensors loaded."""
        count = 0

        # each bucket's buffer is the receiver's own, allocated as it arrives: vLLM's layer-wise
        # reload may hold a tensor until the rest of its layer arrives in a later bucket, and keeps
        # just that buffer alive by reference (no buffer is reused within an update)
        def stream():
            nonlocal count
            for item in self._scalerl_rx.receive():
                count += 1
                yield item

        items = _as_engine_dtype(stream(), self.model_runner.model_config.dtype)
        self.model_runner.reload_weights(weights_iterator=items, is_checkpoint_format=True)
        return count

    def scalerl_leave(self) -> None:
        """Leave the weight-update group (the engine stops): its connections and communicator go."""
        rx = getattr(self, "_scalerl_rx", None)
        if rx is not None:
            rx.close()
            self._scalerl_rx = None

    def scalerl_fingerprint(self) -> dict[str, str]:
        """SHA-256 of each of the engine's weights (vLLM's names and layout, CPU-packed linear
        layers read back: :func:`held_weights`), to compare two engines' weights bit for bit."""
        from scalerl.generator.base import digests

        return digests(held_weights(self.model_runner.get_model()))

    def scalerl_head_dtype(self) -> str:
        """The dtype the engine computes its LM head logits in."""
        model = self.model_runner.get_model()
        lp = getattr(model, "logits_processor", None)
        head = getattr(lp, "head_dtype", None)
        if head is None:
            head = next(model.parameters()).dtype
        return str(head).replace("torch.", "")
