"""Import transformers without the scikit-learn it loads for a feature scalerl never uses.

``transformers.generation.candidate_generator`` (imported by every causal LM class, through
``GenerationMixin``) imports ``sklearn.metrics`` whenever scikit-learn is installed, for assisted
decoding's confidence-threshold tuning; MLflow requires scikit-learn, so every scalerl install has
it, and it pulls in SciPy, pandas and pyarrow: about a quarter of what a run's process spends
importing (the trainer, every engine process, every subprocess a test or a sweep starts). scalerl
generates without assistant models, so :func:`without_sklearn` imports that module once with
transformers' availability check answering "not installed" for it alone (the check is restored for
every other caller; a process that imported the module before keeps it as it was).
"""

from __future__ import annotations

import sys

_MODULE = "transformers.generation.candidate_generator"


def without_sklearn() -> None:
    """Import transformers' candidate generator (and so transformers' generation) without
    importing scikit-learn. A no-op once the module is loaded."""
    if _MODULE in sys.modules:
        return
    import transformers.utils as hf_utils

    check = getattr(hf_utils, "is_sklearn_available", None)
    if check is None:  # a transformers that no longer has the check: import as it is
        return
    hf_utils.is_sklearn_available = lambda: False
    try:
        __import__(_MODULE)
    finally:
        hf_utils.is_sklearn_available = check
