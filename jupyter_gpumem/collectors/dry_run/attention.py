"""What ``torch._native_multi_head_attention`` takes inside its CUDA kernel: the fused
self-attention ``nn.MultiheadAttention`` runs in inference (``native_multi_head_attention_cuda``,
aten/src/ATen/native/transformers/cuda/attention.cu). Its fake kernel makes the output
only; the real one, when the query is the key and the value, the head size a multiple of 8,
no weights asked, no mask and a fused attention backend, first projects q, k and v into one
``(B, T, 3 x D)`` tensor, then runs ``scaled_dot_product_attention`` into a ``(B, T, D)``
one, projects that into the output, and gives both back when it returns (on an H200, a
ViT-B/16's inference: 3 x 38.7 MB and 38.7 MB per layer, as the allocator's history
shows). Other cases take the unfused path, whose temporaries are not sized here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .events import Free

_NAMES = ("query", "key", "value", "embed_dim", "num_head", "qkv_weight", "qkv_bias",
          "proj_weight", "proj_bias", "mask", "need_weights")  # fmt: skip
UNFUSED = "the temporaries of nn.MultiheadAttention's unfused inference path"


def temporaries(args: Sequence[Any], kwargs: dict[str, Any]) -> list[int] | None:
    """Bytes of the fused path's temporaries, in the order they are made (all alive until
    the op returns); None for the unfused path."""
    given = dict(zip(_NAMES, args, strict=False))
    given.update({k: v for k, v in kwargs.items() if k in _NAMES})
    query = given["query"]
    need_weights = given.get("need_weights", True)
    num_head = int(given["num_head"])
    embed_dim = int(given["embed_dim"])
    self_attention = query is given["key"] and given["key"] is given["value"]
    if (
        not self_attention
        or need_weights
        or given.get("mask") is not None
        or query.dim() != 3
        or (embed_dim // num_head) % 8
        or getattr(query, "is_nested", False)
    ):
        return None
    rows = int(query.shape[0]) * int(query.shape[1])
    size = query.element_size()
    return [rows * 3 * embed_dim * size, rows * embed_dim * size]


def record_temporaries(state: Any, func: Any, args: Any, kwargs: Any, out: Any) -> None:
    """The fused path's temporaries into the run's events (``state``: the run's
    ``State``), after the op's output and given back at once: the order measured closest
    to the real run's reserved on an H200 (a ViT-B/16's inference: -3.0 %; made before the
    output, with cuBLAS's workspaces after it, +10.9 %); the unfused path is noted as not
    seen."""
    sizes = temporaries(args, kwargs)
    device = getattr(out[0] if isinstance(out, (tuple, list)) else out, "device", None)
    if device is None or device.type != state.device_type:
        return
    if sizes is None:
        state.note(f"scratch:{func}", f"not seen: {UNFUSED} ({func})")
        state.unseen.add(UNFUSED)
        return
    keys = [state.alloc(n, device.index or 0, str(func), "tensor") for n in sizes if n]
    state.events.extend(Free(k) for k in keys)
