"""DeepSpeed trainer: ZeRO stages 0-3 over torch.distributed (gloo on CPU, NCCL on GPUs).

Same loss, precision and statistics as :class:`TorchTrainer`; DeepSpeed owns the optimiser step,
gradient averaging across processes and (for ZeRO-3) parameter partitioning. One process needs
no launcher (the rank variables are set here); more processes come from ``torchrun`` or the
``deepspeed`` launcher, which set them.
"""

from __future__ import annotations

import os
import socket

import torch

from scalerl.trainer.torch_trainer import TorchTrainer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(device: torch.device) -> None:
    """Initialise torch.distributed for DeepSpeed (single process: without a launcher)."""
    import deepspeed

    if "RANK" not in os.environ:
        os.environ.update(
            {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(_free_port()),
                "RANK": "0",
                "WORLD_SIZE": "1",
                "LOCAL_RANK": "0",
            }
        )
    if device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend="gloo" if device.type == "cpu" else "nccl")


class DeepSpeedTrainer(TorchTrainer):
    def _build_optimizer(self) -> None:
        try:
            import deepspeed
        except ImportError as e:  # pragma: no cover - depends on the extra
            raise RuntimeError("trainer=deepspeed needs the extra: pip install -e '.[deepspeed]'") from e
        init_distributed(self.device)
        t = self.tcfg
        optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=t.lr, betas=tuple(t.betas), eps=t.adam_eps, weight_decay=t.weight_decay
        )
        warm = max(0, t.warmup_steps)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
        ds_config = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": float(t.grad_clip) if t.grad_clip > 0 else 0.0,
            "zero_optimization": {"stage": int(t.zero_stage)},
            "zero_allow_untested_optimizer": True,
            "bf16": {"enabled": False},  # precision is applied by scalerl.model.precision
            "fp16": {"enabled": False},
            "steps_per_print": 1 << 30,
            "wall_clock_breakdown": False,
        }
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=self.model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config
        )

    @property
    def module(self):
        return self.engine.module

    def _zero_grad(self) -> None:
        self.engine.zero_grad()

    def _backward(self, loss: torch.Tensor) -> None:
        # Micro-batch losses are already weighted to sum to the batch loss (algo.aggregation_weight).
        self.engine.set_gradient_accumulation_boundary(False)
        self.engine.backward(loss, scale_wrt_gas=False)

    def _clip_and_step(self) -> float:
        self.engine.set_gradient_accumulation_boundary(True)
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else 0.0

    def gathered(self):
        """Context in which every parameter is whole on every rank (ZeRO-3 partitions them)."""
        import contextlib

        if int(self.tcfg.zero_stage) == 3:
            import deepspeed

            return deepspeed.zero.GatheredParameters(list(self.module.parameters()), modifier_rank=None)
        return contextlib.nullcontext()

    def weights_for_generator(self) -> dict[str, torch.Tensor]:
        with self.gathered():
            return {k: v.detach().clone() for k, v in self.module.state_dict().items()}

    def state_dict(self) -> dict:
        # Optimiser state is saved by save_engine_checkpoint (partitioned under ZeRO).
        with self.gathered():
            model = {k: v.detach().clone() for k, v in self.module.state_dict().items()}
        return {"model": model, "nonfinite_total": self.nonfinite_total, "engine": True}

    def load_state_dict(self, state: dict) -> None:
        self.nonfinite_total = state.get("nonfinite_total", 0)

    def save_engine_checkpoint(self, path: str, tag: str) -> None:
        self.engine.save_checkpoint(path, tag=tag)

    def load_engine_checkpoint(self, path: str, tag: str) -> None:
        self.engine.load_checkpoint(path, tag=tag)
