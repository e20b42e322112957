"""What the fake kernels don't allocate, by op. The record adds cuBLAS's workspace, which
PyTorch takes from its caching allocator the first time a handle (one per device and
thread) meets a stream: :func:`cuda_workspaces` gives a card's sizes
(:data:`WORKSPACE_TABLE`, by compute capability, after ``CUBLAS_WORKSPACE_CONFIG`` and
``CUBLASLT_WORKSPACE_SIZE``). Scratch memory an op takes and returns inside its kernel
(cuDNN's convolution workspace, sorts) is not seen; the notes say when such ops ran.
:func:`op_kind` says which of these an op is (and which load cuDNN or NCCL); the per-run
state (``collectors/dry_run/state.py``) adds the workspaces to the events and the notes. A new
card generation, or a new op that calls cuBLAS, goes here. torch is not imported here:
:func:`capability` asks the torch it is given only when CUDA runs, else NVML."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ...units import MiB
from ..torch_build import cuda_ready


@dataclass(frozen=True, slots=True)
class Workspaces:
    """cuBLAS's workspaces: ``cublas`` bytes at the first cuBLAS call of each (device,
    thread, stream), then ``cublaslt`` more at the first cuBLASLt call (0: Lt shares
    cuBLAS's). ``lifetime``: ``cached`` (kept until the process ends; torch 2.11 as
    measured) or ``per_call`` (taken and given back around each call)."""

    cublas: int
    cublaslt: int
    source: str
    lifetime: Literal["cached", "per_call"] = "cached"


# cuBLAS's workspace by compute capability (major), with where each figure comes from.
# PyTorch asks its caching allocator for it in CublasHandlePool.cpp: ``getChosenWorkspaceSize``
# (CUBLAS_WORKSPACE_CONFIG, default ":4096:2:16:8" = 4096 KiB x 2 + 16 KiB x 8) and, for
# cuBLASLt, ``getCUDABlasLtWorkspaceSize`` (CUBLASLT_WORKSPACE_SIZE, default 1024 KiB).
_LT_DEFAULT = MiB
_OLD_DEFAULT = 4096 * 1024 * 2 + 16 * 1024 * 8  # 8,519,680 B
WORKSPACE_TABLE: dict[int, Workspaces] = {
    9: Workspaces(
        32 * MiB,
        _LT_DEFAULT,
        "Hopper (H100, H200): 32 MiB + 1 MiB measured on an H200 with torch 2.11 "
        "(tests/fixtures/allocator_traces.json, mlp_adamw); PyTorch's "
        "parseChosenWorkspaceSize gives 32 MiB to compute capability 9.x",
    ),
    10: Workspaces(
        32 * MiB,
        _LT_DEFAULT,
        "Blackwell (10.x): 32 MiB in PyTorch's parseChosenWorkspaceSize since pytorch#175344 "
        f"(Feb 2026), {_OLD_DEFAULT:,} B before it; not measured",
    ),
    12: Workspaces(
        32 * MiB,
        _LT_DEFAULT,
        "Blackwell (12.x): 32 MiB in PyTorch's parseChosenWorkspaceSize since pytorch#175344 "
        f"(Feb 2026), {_OLD_DEFAULT:,} B before it; not measured",
    ),
}
OTHER_CARDS = Workspaces(
    _OLD_DEFAULT,
    _LT_DEFAULT,
    'PyTorch\'s default CUBLAS_WORKSPACE_CONFIG ":4096:2:16:8" for compute capability '
    "below 9 (8,519,680 B, as torch.cuda.memory_snapshot shows on such cards); not measured here",
)


def parse_workspace_config(value: str) -> int | None:
    """Bytes of a ``CUBLAS_WORKSPACE_CONFIG`` (":SIZE_KiB:COUNT" pairs, added up as PyTorch
    does), or None when PyTorch would not parse it either (it then keeps its default)."""
    pairs = re.findall(r":([0-9]+):([0-9]+)", value)
    if not pairs:
        return None
    return sum(int(size) * 1024 * int(count) for size, count in pairs)


def cuda_workspaces(
    capability: tuple[int, int] | None, env: Mapping[str, str] | None = None
) -> Workspaces:
    """The workspaces PyTorch takes on a card of this compute capability (None: unknown,
    the pre-Hopper default), after the environment's ``CUBLAS_WORKSPACE_CONFIG`` and
    ``CUBLASLT_WORKSPACE_SIZE`` (KiB)."""
    env = os.environ if env is None else env
    base = WORKSPACE_TABLE.get(capability[0], OTHER_CARDS) if capability else OTHER_CARDS
    cublas, lt, source = base.cublas, base.cublaslt, base.source
    if capability is None:
        source = "card not known without starting CUDA: " + source
    config = env.get("CUBLAS_WORKSPACE_CONFIG")
    if config:
        parsed = parse_workspace_config(config)
        if parsed is not None:
            cublas, source = parsed, f"CUBLAS_WORKSPACE_CONFIG={config}"
    lt_env = env.get("CUBLASLT_WORKSPACE_SIZE", "").strip()
    if lt_env.isdigit():
        lt = int(lt_env) * 1024
        source += f"; CUBLASLT_WORKSPACE_SIZE={lt_env} KiB"
    return Workspaces(cublas, lt, source, base.lifetime)


# Ops that call cuBLAS (matmul, linear and attention's math path decompose into these).
_CUBLAS_OPS = frozenset(
    {"mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "vdot", "addr"}
    | {"linalg_solve_triangular", "triangular_solve"}
)
# Ops that always go through cuBLASLt; addmm does when its bias is a vector (below).
_CUBLASLT_OPS = frozenset(
    {"_addmm_activation", "_scaled_mm", "_scaled_mm_v2", "_int_mm", "_scaled_grouped_mm"}
)
# Ops whose kernels take scratch memory the fake kernels don't show (the RNN's: shown by
# collectors/dry_run/rnn.py, at estimated sizes)
SCRATCH_OPS = {
    "convolution": "cuDNN's workspace for convolutions (it depends on the algorithm picked)",
    "convolution_backward": "cuDNN's workspace for convolutions (it depends on the algorithm)",
    "_cudnn_rnn": "the exact size of cuDNN's RNN workspace (an estimate is counted)",
    "_scaled_dot_product_cudnn_attention": "cuDNN attention's workspace",
}
# Ops whose kernels take a workspace of their own that is not sized, and is not always
# there: noted, without making the figures a lower bound (the memory-efficient attention
# kernel's backward: 132 MiB a layer for a ViT-B/16 at batch 32, 95 MiB for wav2vec2 at
# 8 x 499 tokens on an H200, where GPT-2's and BERT's steps at 512 tokens replay exactly)
NOTED_OPS = {
    "_scaled_dot_product_efficient_attention_backward": (
        "memory-efficient attention's backward workspace, which its kernel takes and gives "
        "back (up to 132 MiB a layer measured on an H200): the reserved peak may be higher"
    ),
    "_efficient_attention_backward": (
        "memory-efficient attention's backward workspace, which its kernel takes and gives "
        "back (up to 132 MiB a layer measured on an H200): the reserved peak may be higher"
    ),
}
# ops that load cuDNN (its handle and kernels sit beside PyTorch: core/dry_run.LIBRARIES)
CUDNN_OPS = frozenset(
    {"convolution", "convolution_backward", "_cudnn_rnn", "_scaled_dot_product_cudnn_attention"}
)
# torch's own namespaces; an op from any other is a custom op or an extension's
_OWN_NAMESPACES = frozenset(
    {"aten", "prims", "prim", "profiler", "debugprims", "higher_order", "fsdp"}
)
_COLLECTIVES = frozenset({"c10d", "_c10d_functional", "_c10d_functional_autograd", "_dtensor"})


def addmm_uses_lt(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """PyTorch's ``isInputCompliesAddmmCudaLt`` (aten/src/ATen/native/cuda/Blas.cpp), in
    short: beta 1, a vector bias as long as the output's columns, no dimension of 1."""
    try:
        bias, mat1, mat2 = args[0], args[1], args[2]
        beta = kwargs.get("beta", args[3] if len(args) > 3 else 1)
        return bool(
            beta == 1
            and (bias.dim() == 1 or bias.squeeze().dim() == 1)
            and bias.shape[-1] == mat2.shape[1]
            and str(mat1.dtype) in ("torch.float32", "torch.float16", "torch.bfloat16")
            and min(mat1.shape[0], mat1.shape[1], mat2.shape[0], mat2.shape[1]) > 1
        )
    except Exception:
        return False


def grouped_mm_uses_cublas(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """Whether a ``_grouped_mm`` call goes through cuBLAS: ``_grouped_mm_cuda``
    (aten/src/ATen/native/cuda/GroupedBlas.cpp) runs ``_grouped_mm_fallback``, one
    ``mm_out`` per group, unless both inputs and the output are bfloat16 (then CUTLASS on
    compute capability 9.x and 10.x; on other cards the fallback's cuBLAS, not counted
    here). On an H200 (torch 2.11), a float32 mixture-of-experts step reserved exactly one
    32 MiB workspace more than its dry run without this, as when its backward thread's
    first cuBLAS call is a ``_grouped_mm``; the bfloat16 one matched."""
    try:
        a, b = args[0], args[1]
        out = kwargs.get("out_dtype", args[4] if len(args) > 4 else None) or a.dtype
        return not all(str(d) == "torch.bfloat16" for d in (a.dtype, b.dtype, out))
    except Exception:
        return False


def op_kind(func: Any) -> str:
    """What an op is beside its outputs: "cublas", "cublaslt", "addmm" (cuBLASLt when its
    bias is a vector, :func:`addmm_uses_lt`), "grouped_mm" (cuBLAS when
    :func:`grouped_mm_uses_cublas`), "mha" (fused attention's temporaries and its
    projections' cuBLASLt), "scratch" (scratch memory not seen), "noted" (a workspace not
    sized that is not always there: a note only), "collective",
    "custom" (a namespace not torch's own), or "" (nothing more)."""
    name = func._opname if hasattr(func, "_opname") else str(func)
    namespace = getattr(func, "namespace", "aten")
    if namespace in _COLLECTIVES:
        return "collective"
    if namespace not in _OWN_NAMESPACES:
        return "custom"
    if name == "addmm":
        return "addmm"
    if name == "_grouped_mm":
        return "grouped_mm"
    if name == "_native_multi_head_attention":
        return "mha"
    if name in _CUBLASLT_OPS:
        return "cublaslt"
    if name in _CUBLAS_OPS:
        return "cublas"
    if name in SCRATCH_OPS:
        return "scratch"
    if name in NOTED_OPS:
        return "noted"
    return ""


def capability(t: Any, index: int) -> tuple[int, int] | None:
    """A card's compute capability without starting CUDA: torch's when CUDA is running,
    else the driver's through NVML; None when neither can tell."""
    try:
        if cuda_ready(t):
            major, minor = t.cuda.get_device_capability(index)
            return int(major), int(minor)
    except Exception:
        return None
    try:
        from ..nvml import Nvml

        nvml = Nvml()
        n = nvml.nvml_index(index)
        if n is None:
            return None
        major, minor = nvml._nvml.nvmlDeviceGetCudaComputeCapability(nvml._handle(n))
        return int(major), int(minor)
    except Exception:
        return None
