"""Import transformers without the scikit-learn and SciPy it loads for features scalerl never uses.

Two of transformers' modules that every causal LM class imports load an optional library whenever it
is installed, and MLflow brings both to every scalerl install:

* ``transformers.generation.candidate_generator`` (through ``GenerationMixin``) imports
  ``sklearn.metrics``, for assisted decoding's confidence-threshold tuning; it pulls in SciPy,
  pandas and pyarrow;
* ``transformers.loss.loss_utils`` (through ``PreTrainedModel``) imports the object-detection losses,
  which import ``scipy.optimize`` for their Hungarian matching.

That is a large share of what a run's process spends importing (the trainer, every engine process,
every subprocess a test or a sweep starts). scalerl generates without assistant models and trains no
detector, and its own fits import SciPy when they first run (:mod:`scalerl.scaling`). So
:func:`without_sklearn_or_scipy` imports those two modules once with transformers' availability checks
answering "not installed" for these two libraries alone (the checks are restored for every other
caller; a process that imported a module before keeps it as it was).
"""

from __future__ import annotations

import sys

_MODULES = ("transformers.generation.candidate_generator", "transformers.loss.loss_utils")
_CHECKS = ("is_sklearn_available", "is_scipy_available")


def without_sklearn_or_scipy() -> None:
    """Import transformers' candidate generator and its losses (and so transformers' generation and
    model classes) without importing scikit-learn or SciPy. A no-op once both are loaded."""
    if all(m in sys.modules for m in _MODULES):
        return
    import transformers.utils as hf_utils

    saved = {name: getattr(hf_utils, name) for name in _CHECKS if hasattr(hf_utils, name)}
    # a transformers without a check imports as it is for that library
    for name in saved:
        setattr(hf_utils, name, lambda: False)
    try:
        for module in _MODULES:
            if module not in sys.modules:
                try:
                    __import__(module)
                except ModuleNotFoundError:  # a transformers without it: nothing to keep out there
                    pass
    finally:
        for name, check in saved.items():
            setattr(hf_utils, name, check)
