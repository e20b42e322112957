"""A model of PyTorch's CUDA caching allocator: allocation requests in, the allocator's
segments, blocks and counters out, with no GPU and no torch (``replay``: the entry and what
the model leaves out). The parts, one module each: ``config`` (the settings, a new
``PYTORCH_CUDA_ALLOC_CONF`` key goes there), ``records`` (the requests and results),
``model`` (the allocator's rules, each in the method that mirrors PyTorch's function),
``blocks`` (its blocks and free lists). Others import from this package only."""

from .replay import (
    Alloc,
    AllocatorConfig,
    BlockRecord,
    CachingAllocatorModel,
    Free,
    ModelOutOfMemory,
    OutOfMemoryRecord,
    Prediction,
    SegmentRecord,
    allocation_size,
    replay,
    requests_from_trace,
    round_size,
)

__all__ = [
    "Alloc",
    "AllocatorConfig",
    "BlockRecord",
    "CachingAllocatorModel",
    "Free",
    "ModelOutOfMemory",
    "OutOfMemoryRecord",
    "Prediction",
    "SegmentRecord",
    "allocation_size",
    "replay",
    "requests_from_trace",
    "round_size",
]
