"""The worker side of scalerl's vLLM generator: a vLLM worker extension (``worker_extension_cls``).

vLLM mixes these methods into its worker; the generator calls them with
``LLM.collective_rpc("scalerl_...")``. They run where the model runner is, so a weight update
never goes through vLLM's request path, and they are the hook for a transport that delivers
weights straight into the worker.
"""

from __future__ import annotations

import torch


class WeightSync:
    """Mixed into vLLM's worker (``self.model_runner`` is the worker's model runner)."""

    def scalerl_reload(self, state: dict[str, torch.Tensor]) -> int:
        """Load every tensor of ``state`` (checkpoint names) into the running model in place; the
        number of tensors loaded. vLLM re-applies its own post-processing (fused QKV, tied heads)."""
        self.model_runner.reload_weights(weights_iterator=iter(state.items()), is_checkpoint_format=True)
        return len(state)

    def scalerl_head_dtype(self) -> str:
        """The dtype the engine computes its LM head logits in."""
        model = self.model_runner.get_model()
        lp = getattr(model, "logits_processor", None)
        head = getattr(lp, "head_dtype", None)
        if head is None:
            head = next(model.parameters()).dtype
        return str(head).replace("torch.", "")
