"""One cuDNN convolution operation as a plain record (:class:`ConvCall`): what
``conv.py`` finds an op runs and ``cudnn.py`` sizes the workspace of. Both import it from
here; ``conv.py`` hands its calls to ``cudnn.py``, which never imports it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ConvOp = Literal["forward", "backward data", "backward filter"]

# cudnnDataType_t of a torch dtype (cudnn_graph.h)
DATA_TYPES = {"torch.float32": 0, "torch.float64": 1, "torch.float16": 2, "torch.bfloat16": 9}


@dataclass(frozen=True, slots=True)
class TensorDesc:
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    alignment: int


@dataclass(frozen=True, slots=True)
class ConvCall:
    """One cuDNN convolution operation: ``x`` the input (``dx`` for backward data), ``w``
    the filter (``dw`` for backward filter), ``y`` the output (``dy`` in backward)."""

    op: ConvOp
    x: TensorDesc
    w: TensorDesc
    y: TensorDesc
    data_type: int  # cudnnDataType_t of the tensors
    padding: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    device: int
    deterministic: bool
    allow_tf32: bool

    @property
    def compute_type(self) -> int:
        """PyTorch's convolution descriptor computes in float for half and bfloat16."""
        return 1 if self.data_type == 1 else 0
