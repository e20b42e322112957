"""What ``--fit-in`` accepts: a size (``24GiB``) or a GPU's name (``T4``, ``A100-80GB``).

Each card's figure is the total memory its driver reports (``nvidia-smi``'s Memory-Usage
total), not the marketing number: a "24 GB" RTX 4090 reports 24564 MiB, an "80 GB" H100
81559 MiB. CUDA (``cudaMemGetInfo``, PyTorch) offers less: on this project's H100 81079
MiB, on its H200 615 MiB below nvidia-smi's figure. docs/planning.md lists each card's
vendor figure with the document that states it, and where each MiB figure was read.
"""

from __future__ import annotations

import re

from ..model import Target
from ..units import MiB, parse_size, shown

MIN_TARGET = MiB  # smaller is no card's memory: a size typed without its unit

# name -> (MiB the driver reports, what it is, where the figure was read)
GPUS: dict[str, tuple[int, str, str]] = {
    "rtx3090": (24576, "GeForce RTX 3090 (24 GB)", "nvidia-smi total on an RTX 3090"),
    "rtx4090": (24564, "GeForce RTX 4090 (24 GB)", "nvidia-smi total on an RTX 4090"),
    "t4": (15360, "Tesla T4 (16 GB)", "nvidia-smi total on a T4 (some drivers: 15109 MiB)"),
    "l4": (23034, "NVIDIA L4 (24 GB)", "nvidia-smi total on an L4"),
    "a10g": (23028, "NVIDIA A10G (24 GB)", "nvidia-smi total on an A10G (AWS g5)"),
    "a100-40gb": (40960, "A100 40GB", "nvidia-smi total on an A100-SXM4-40GB"),
    "a100-80gb": (81920, "A100 80GB", "nvidia-smi total on an A100-SXM4-80GB"),
    "h100-80gb": (
        81559,
        "H100 80GB HBM3",
        "nvidia-smi total on an H100 80GB HBM3 (this project's GPU machine, driver 580)",
    ),
    "h200": (
        143771,
        "H200 (141 GB)",
        "nvidia-smi total on an H200 (this project's GPU machine, driver 580)",
    ),
}
ALIASES: dict[str, str] = {
    "3090": "rtx3090",
    "4090": "rtx4090",
    "consumer24gb": "rtx4090",  # the smaller of the two consumer 24 GB cards
    "consumer-24gb": "rtx4090",
    "a10": "a10g",
    "a100": "a100-80gb",
    "a100-40": "a100-40gb",
    "a100-80": "a100-80gb",
    "h100": "h100-80gb",
    "h100-80": "h100-80gb",
    "h100-sxm": "h100-80gb",
}


def _key(text: str) -> str:
    k = re.sub(r"[\s_]+", "", text.strip().lower())
    return re.sub(r"^(nvidia|geforce|tesla)-?", "", k)


def known_names() -> list[str]:
    return sorted(GPUS)


def parse_target(text: str | int, option: str = "--fit-in") -> Target:
    """A :class:`~jupyter_gpumem.model.Target` from ``--fit-in`` (a whole number, from
    the functions' ``fit_in``: bytes, as a number typed without a unit is); ``ValueError``
    with the accepted forms otherwise, its message starting with ``option``."""
    number = isinstance(text, int) and not isinstance(text, bool)
    if number:
        text = str(text)  # a number without a unit: bytes, checked as typed
    elif not isinstance(text, str):
        raise ValueError(
            f"{option}: {shown(text)} is a {type(text).__name__}: give a size such as "
            "'24GiB', a card such as 'T4', or a whole number of bytes"
        )
    if text.strip().startswith("-"):
        typed = text if number else shown(text.strip())
        raise ValueError(f"{option}: a size can't be negative: {typed}")
    key = _key(text)
    key = ALIASES.get(key, key)
    if key in GPUS:
        mib, label, source = GPUS[key]
        return Target(mib * MiB, f"{label}: {mib} MiB", source, whole_card=True)
    try:
        size = parse_size(text)
    except ValueError as e:
        if text.strip()[:1].isdigit() or text.strip()[:1] == ".":
            raise ValueError(f"{option}: {e}") from None
        typed = repr(text[:40]) + ("…" if len(text) > 40 else "")
        raise ValueError(
            f"{option}: {typed} is neither a size (24GiB, 16GB, 8000MiB) nor a known GPU "
            f"({', '.join(known_names())})"
        ) from None
    from ..units import format_bytes

    if size < MIN_TARGET:
        # parse_size takes a bare number as bytes (as %gpumem limit does); as a card's
        # memory, "--fit-in 24" is surely not 24 bytes
        typed = text if number else repr(text.strip()[:40])
        raise ValueError(
            f"{option}: {typed} is {format_bytes(size)} (a number without a unit is bytes); "
            "a target is a card's memory, at least 1 MiB: give a unit or a card, e.g. "
            "24GiB, 24GB or T4"
        )
    return Target(size, format_bytes(size), f"--fit-in {text.strip()}", whole_card=True)
