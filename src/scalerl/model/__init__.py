"""The policy model: built from a transformers config (embedded default) or loaded from a path."""

from scalerl.model.hf_imports import without_sklearn_or_scipy

without_sklearn_or_scipy()  # before anything here imports transformers

# ruff: noqa: E402

from scalerl.model.build import build_model, load_policy, num_params
from scalerl.model.precision import Precision
from scalerl.model.tokenizer import build_char_tokenizer

__all__ = ["Precision", "build_char_tokenizer", "build_model", "load_policy", "num_params"]
