"""``precision``: the dtypes of the transformer body and of the LM head, in generator and trainer."""

from __future__ import annotations

from dataclasses import dataclass

from scalerl.config.checks import one_of, problems
from scalerl.config.options import Option, register_option

# the dtype names a precision option may use (scalerl.model.precision maps each to its torch dtype),
# and the implementations of reduced precision
DTYPE_NAMES = ("fp32", "bf16", "fp16")
IMPLS = ("auto", "native", "emulated")


@dataclass
class PrecisionOption(Option):
    name: str = ""
    body: str = "fp32"  # dtype of the transformer body
    head: str = "fp32"  # dtype of the LM head and its log-softmax
    # native: real low-precision tensors; emulated: fp32 math rounded to the dtype at every layer;
    # auto: native on CUDA, emulated on CPU
    impl: str = "auto"

    def check(self):
        return problems(
            one_of("body", self.body, DTYPE_NAMES),
            one_of("head", self.head, DTYPE_NAMES),
            one_of("impl", self.impl, IMPLS),
        )


@register_option("precision", "fp32_head")
@dataclass
class FP32Head(PrecisionOption):
    """ScaleRL: body in bf16, LM head and log-softmax in fp32."""

    name: str = "fp32_head"
    body: str = "bf16"
    head: str = "fp32"


@register_option("precision", "bf16")
@dataclass
class BF16(PrecisionOption):
    """Everything in bf16, the LM head included."""

    name: str = "bf16"
    body: str = "bf16"
    head: str = "bf16"


@register_option("precision", "fp32")
@dataclass
class FP32(PrecisionOption):
    """Everything in fp32."""

    name: str = "fp32"
