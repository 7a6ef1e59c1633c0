"""The KV-cache argument of a transformers model's forward, across the versions the package allows:
``cache`` from transformers 5.2x on (where ``past_key_values`` is deprecated, with a FutureWarning at
every call), ``past_key_values`` before; and the transformer body the cache belongs to."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch


@functools.cache
def decoder(model: torch.nn.Module) -> torch.nn.Module:
    """The transformer body of a causal LM (its decoder stack, without the LM head): transformers'
    ``get_decoder()``, or the ``model`` attribute of a class without it."""
    return model.get_decoder() if hasattr(model, "get_decoder") else model.model


def _cache_kwarg_of(cls: type) -> str:
    params = inspect.signature(cls.forward).parameters  # follows the deprecation wrappers (__wrapped__)
    return "cache" if "cache" in params else "past_key_values"


def cache_kwarg(module: torch.nn.Module) -> str:
    """The keyword ``module.forward`` takes its KV cache (a ``transformers`` ``Cache``) under."""
    return _cache_kwarg_of(type(module))


def with_cache(module: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """``{keyword: cache}`` for ``module(**inputs, **with_cache(module, cache))``."""
    return {cache_kwarg(module): cache}


def cached_hidden(body: torch.nn.Module, cache: Any, ids, mask4, pos) -> torch.Tensor:
    """The decoder ``body``'s last hidden states over ``ids`` (attention ``mask4``, ``pos``
    positions), writing their keys and values into ``cache``: the one call the slot and static
    decoders make of a transformers body."""
    out = body(
        input_ids=ids, attention_mask=mask4, position_ids=pos, use_cache=True, **with_cache(body, cache)
    )
    return out.last_hidden_state


def output_cache(out: Any) -> Any:
    """The KV cache a forward returned (``use_cache=True``): ``out.cache``, or ``out.past_key_values``
    on transformers versions before the rename (reading that name on later ones warns)."""
    fields = getattr(type(out), "__dataclass_fields__", {})
    return out.cache if "cache" in fields else out.past_key_values


def kv_bytes_per_token(model_config: Any, dtype: str, tensor_parallel_size: int = 1) -> int:
    """Bytes of KV cache one token takes on each tensor-parallel worker: keys and values of every
    layer's KV heads (a worker holds its share of them, at least one head)."""
    layers = int(getattr(model_config, "num_hidden_layers", 0) or model_config.n_layer)
    heads = int(getattr(model_config, "num_attention_heads", 0) or model_config.n_head)
    kv_heads = int(getattr(model_config, "num_key_value_heads", 0) or heads)
    head_dim = int(getattr(model_config, "head_dim", 0) or int(model_config.hidden_size) // heads)
    per_worker = max(1, -(-kv_heads // max(1, int(tensor_parallel_size))))
    itemsize = {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]
    return 2 * layers * per_worker * head_dim * itemsize


def kv_bytes_per_row(model_config: Any) -> int | None:
    """Bytes of one row's fp32 KV cache at the whole context of a transformers model (its config;
    None for a config without the fields)."""
    try:
        positions = int(model_config.max_position_embeddings)
        return positions * kv_bytes_per_token(model_config, "float32")
    except (AttributeError, TypeError, ValueError):
        return None
