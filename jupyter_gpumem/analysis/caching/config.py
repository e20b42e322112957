"""The caching allocator's settings and size rules, as PyTorch has them: the constants of
``c10/cuda/CUDACachingAllocator.cpp`` (``kMinBlockSize``, the pools' thresholds, segment
sizes), :class:`AllocatorConfig` (``PYTORCH_CUDA_ALLOC_CONF`` and the cap, read as
``AcceleratorAllocatorConfig`` reads them), and the two size rules every request goes
through: :func:`round_size` (the block a request gets) and :func:`allocation_size` (the
segment a new block is cut from). Pure functions of sizes, for the model
(``model``) and for the dry run's breakdown."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ...units import MiB
from ..allocator_rules import (
    LARGE_BUFFER,
    ROUNDUP_INTERVALS,
    SIZE_MAX,
)

Pool = Literal["small", "large"]


# -- configuration ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AllocatorConfig:
    """The allocator settings the model follows (``PYTORCH_CUDA_ALLOC_CONF`` and the cap).

    ``max_split_size``: bytes, or None (unset: every block may be split).
    ``roundup_power2_divisions``: one value for every size, or 16, one per power-of-two
    interval starting at 1 MiB (sizes under 1 MiB use the first; 32 GiB and up, the last).
    ``cap``: the bytes PyTorch may reserve (``set_per_process_memory_fraction`` times the
    device's memory), or None. ``device_total``: the GPU's memory, which only sizes an
    expandable segment's address range (9/8 of it, as PyTorch reserves); None: unbounded.
    ``garbage_collection_threshold`` is not modelled: a model with it set and a cap raises
    ``ValueError`` (without a cap PyTorch ignores it too)."""

    max_split_size: int | None = None
    max_non_split_rounding_size: int = LARGE_BUFFER
    expandable_segments: bool = False
    roundup_power2_divisions: int | tuple[int, ...] = 0
    cap: int | None = None
    device_total: int | None = None
    garbage_collection_threshold: float = 0.0

    @classmethod
    def from_conf(cls, conf: str, cap: int | None = None) -> AllocatorConfig:
        """Read a ``PYTORCH_CUDA_ALLOC_CONF`` string, as ``AcceleratorAllocatorConfig::
        parseArgs`` does (``max_split_size_mb``, ``max_non_split_rounding_mb``,
        ``roundup_power2_divisions`` in both forms, ``expandable_segments``,
        ``garbage_collection_threshold``; other keys are ignored)."""
        tokens = _tokens(conf)
        values: dict[str, Any] = {"cap": cap}
        i = 0
        while i < len(tokens):
            key = tokens[i]
            if i + 2 >= len(tokens) or tokens[i + 1] != ":":
                raise ValueError(f"allocator setting {key!r} has no value")
            if key == "roundup_power2_divisions" and tokens[i + 2] == "[":
                divisions, i = _parse_divisions(tokens, i + 3)
                values["roundup_power2_divisions"] = divisions
            else:
                value = tokens[i + 2]
                i += 3
                if key == "max_split_size_mb":
                    mb = int(value)
                    if mb < LARGE_BUFFER // MiB:
                        raise ValueError("max_split_size_mb must be >= 20")
                    values["max_split_size"] = mb * MiB
                elif key == "max_non_split_rounding_mb":
                    mb = int(value)
                    if mb < LARGE_BUFFER // MiB:
                        raise ValueError("max_non_split_rounding_mb must be >= 20")
                    values["max_non_split_rounding_size"] = mb * MiB
                elif key == "roundup_power2_divisions":
                    values["roundup_power2_divisions"] = int(value)
                elif key == "expandable_segments":
                    values["expandable_segments"] = value.lower() in ("true", "1")
                elif key == "garbage_collection_threshold":
                    values["garbage_collection_threshold"] = float(value)
            if i < len(tokens) and tokens[i] == ",":
                i += 1
        return cls(**values)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], cap: int | None = None) -> AllocatorConfig:
        """Read the ``allocator_settings`` of ``torch.cuda.memory._snapshot()``. They do not
        list max_non_split_rounding_size: it is read from the settings string they carry
        (``PYTORCH_CUDA_ALLOC_CONF``), else left at its default."""
        conf = settings.get("PYTORCH_CUDA_ALLOC_CONF")
        rounding = LARGE_BUFFER
        if isinstance(conf, str) and "max_non_split_rounding_mb" in conf:
            rounding = cls.from_conf(conf).max_non_split_rounding_size
        split = int(settings.get("max_split_size", -1))
        raw = settings.get("roundup_power2_divisions", 0)
        divisions: int | tuple[int, ...]
        if isinstance(raw, Mapping):
            ordered = sorted(raw.items(), key=lambda kv: int(kv[0]))
            divisions = tuple(int(v) for _, v in ordered)
        elif isinstance(raw, Sequence):
            divisions = tuple(int(v) for v in raw)
        else:
            divisions = int(raw)
        return cls(
            max_split_size=None if split < 0 or split >= SIZE_MAX else split,
            max_non_split_rounding_size=rounding,
            expandable_segments=bool(settings.get("expandable_segments", False)),
            roundup_power2_divisions=divisions,
            cap=cap,
            garbage_collection_threshold=float(settings.get("garbage_collection_threshold", 0)),
        )

    def divisions(self) -> tuple[int, ...]:
        """The 16 interval values (``roundup_power2_divisions_``)."""
        d = self.roundup_power2_divisions
        if isinstance(d, int):
            return (d,) * ROUNDUP_INTERVALS
        if len(d) != ROUNDUP_INTERVALS:
            raise ValueError("roundup_power2_divisions needs one value or 16")
        return tuple(d)


def _tokens(conf: str) -> list[str]:
    """``AcceleratorAllocatorConfig``'s tokenizer: ``,`` ``:`` ``[`` ``]`` are tokens."""
    out: list[str] = []
    word = ""
    for ch in conf:
        if ch in ",:[]":
            if word.strip():
                out.append(word.strip())
            word = ""
            out.append(ch)
        else:
            word += ch
    if word.strip():
        out.append(word.strip())
    return out


def _parse_divisions(tokens: list[str], i: int) -> tuple[tuple[int, ...], int]:
    """``parseRoundUpPower2Divisions``, list form: ``[256:1,512:2,>:4]`` (sizes in MiB)."""
    values = [0] * ROUNDUP_INTERVALS
    first, last = True, 0
    while i < len(tokens) and tokens[i] != "]":
        bound, value = tokens[i], int(tokens[i + 2])
        i += 3
        if bound == ">":
            for j in range(last + 1, ROUNDUP_INTERVALS):
                values[j] = value
        else:
            index = min(max(int(bound).bit_length() - 1, 0), ROUNDUP_INTERVALS - 1)
            if first:
                for j in range(index):
                    values[j] = value
                first = False
            values[index] = value
            last = index
        if i < len(tokens) and tokens[i] == ",":
            i += 1
    return tuple(values), i + 1
