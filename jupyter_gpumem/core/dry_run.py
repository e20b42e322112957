"""The dry run as a service: code runs under FakeTensorMode (``collectors/dry_run``), its
storages are replayed through the model of PyTorch's caching allocator
(``analysis/caching``), and one :class:`~jupyter_gpumem.model.DryRun` says what
each device would need, beside the CUDA context, and whether that fits a card.

What it predicts is a fresh process that ran the notebook's earlier cells: the kernel's
tensors the cell uses (a model built in an earlier cell, its optimizer state) are held from
the cell's start, then come the cell's own allocations; what the kernel holds that the cell
never uses is listed and, with ``count_untouched``, held too. The memory beside PyTorch (the
CUDA context, cuBLAS, cuDNN) is measured in this process when it already has a context on
that GPU, else taken from :data:`OUTSIDE`, measured on this project's GPUs.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ..analysis.caching import Alloc, AllocatorConfig, Free, replay
from ..analysis.targets import GPUS
from ..collectors.torch_build import imported_torch
from ..model import DryRun, DryRunDevice, Target
from ..units import MiB, format_bytes

if TYPE_CHECKING:
    from ..collectors.dry_run import FakeRun


class Cell(Protocol):
    """A notebook cell a dry run records (``_ipython/cell_source.CellSource``): its code,
    the execution count it runs as, and its dry run, with names bound for a scan's value."""

    code: str

    @property
    def execution_count(self) -> int | None: ...

    def record(
        self,
        *,
        device_type: str = ...,
        workspaces: Any = ...,
        breakdown: bool = ...,
        progress: Callable[[int, str | None, float], None] | None = ...,
        bind: Mapping[str, object] | None = ...,
    ) -> FakeRun: ...


# The CUDA context and libraries a PyTorch process holds beside its caching allocator once
# it has run matmuls (NVML's figure for the process minus reserved), by card.
OUTSIDE: dict[str, tuple[int, str]] = {
    "h100-80gb": (
        742 * MiB,
        "measured on an H100 80GB HBM3, torch 2.11 (CUDA 13), after cuBLAS loaded",
    ),
    "h200": (742 * MiB, "measured on an H200, torch 2.11 (CUDA 13), after cuBLAS loaded"),
}
DEFAULT_OUTSIDE = (
    742 * MiB,
    (
        "not measured on this card: as on an H100 and an H200 with torch 2.11 (CUDA 13); "
        "another driver, CUDA or card moves it by a few hundred MiB"
    ),
)
# Libraries a run's ops load, whose memory sits beside PyTorch's allocator on top of the
# figures above (which a process has after cuBLAS), measured with
# benchmarks/measure_outside.py (NVML's figure for the process minus reserved, before and
# after; benchmarks/results/h200x2-measure-outside.jsonl).
LIBRARIES: dict[str, tuple[int, str]] = {
    "cudnn": (
        14 * MiB,
        (
            "cuDNN's handle and kernels after a convolution: 14 MiB, measured on an H200, "
            "torch 2.11 (CUDA 13)"
        ),
    ),
    "nccl": (
        838 * MiB,
        (
            "NCCL's buffers in each rank of a job of 2 (an all-reduce, all-gather and "
            "reduce-scatter): 838 MiB, measured on two H200s over NVLink, torch 2.11 with its "
            "NCCL; more ranks on one host, or other links, take another amount"
        ),
    ),
}


def with_libraries(
    outside: tuple[int, str], libraries: frozenset[str], world_size: int, measured: bool
) -> tuple[int, str]:
    """``outside`` plus what the libraries the run loaded hold beside PyTorch: NCCL's
    buffers for a job of several processes that ran collectives, and cuDNN's handle when
    the figure is the table's (a measured figure has what this process already loaded)."""
    size, source = outside
    added = []
    if "cudnn" in libraries and not measured:
        added.append(LIBRARIES["cudnn"])
    if "nccl" in libraries and world_size > 1:
        added.append(LIBRARIES["nccl"])
    for extra, why in added:
        size += extra
        source += f"; plus {why}"
    return size, source


# compute capability of the cards --fit-in knows (NVIDIA's list of CUDA GPUs): it picks
# cuBLAS's workspace size on that card
CAPABILITY: dict[str, tuple[int, int]] = {
    "rtx3090": (8, 6),
    "rtx4090": (8, 9),
    "t4": (7, 5),
    "l4": (8, 9),
    "a10g": (8, 6),
    "a100-40gb": (8, 0),
    "a100-80gb": (8, 0),
    "h100-80gb": (9, 0),
    "h200": (9, 0),
}


def card_table() -> list[str]:
    """docs/planning.md's table of the cards ``--fit-in`` knows, one Markdown row each:
    which figure was measured and which comes from elsewhere."""
    from ..collectors.dry_run import cuda_workspaces

    rows = []
    for key, (mib, label, _) in GPUS.items():
        major, minor = CAPABILITY[key]
        ws = cuda_workspaces((major, minor), env={})
        measured = key in OUTSIDE
        memory = "measured here" if measured else "nvidia-smi's total as reported for this card"
        space = "measured" if major == 9 else "PyTorch's source"
        beside = OUTSIDE.get(key, DEFAULT_OUTSIDE)[0] // MiB
        rows.append(
            f"| {label} | {mib:,} MiB ({memory}) | {major}.{minor} | "
            f"{(ws.cublas + ws.cublaslt) / MiB:.2f} MiB ({space}) | "
            f"{beside} MiB ({'measured' if measured else 'as on the H100 and H200'}) |"
        )
    return rows


def workspaces_for(target: Target | None) -> Any:
    """cuBLAS's workspaces on the target card (by its compute capability), or None (a
    size, or no target: the card this runs on decides, as ``collectors/dry_run`` finds it)."""
    key = card_key(target)
    if key is None or key not in CAPABILITY:
        return None
    from ..collectors.dry_run import cuda_workspaces

    return cuda_workspaces(CAPABILITY[key])


def card_key(target: Target | None) -> str | None:
    """The ``GPUS`` key of a card target (None for a size)."""
    if target is None:
        return None
    for key, (mib, label, _) in GPUS.items():
        if target.label.startswith(label) and target.bytes == mib * MiB:
            return key
    return None


CONV_SIZED = "cuDNN's workspace for convolutions:"  # the dry run's note when it sized them


def _same_card(key: str, here: tuple[int, str] | None, device_type: str) -> bool:
    """Whether the target card is this GPU's kind (by name where measured, else by compute
    capability, read without starting CUDA): cuDNN's choices asked here hold there."""
    if here is not None:
        return _name_key(here[1]) == key

    torch = imported_torch()
    if torch is None or device_type != "cuda":
        return False
    from ..collectors.dry_run import capability

    return capability(torch, 0) == CAPABILITY.get(key)


def _name_key(name: str) -> str | None:
    low = name.lower()
    if "h200" in low:
        return "h200"
    if "h100" in low:
        return "h100-80gb"
    return None


def outside_for(target: Target | None, here: tuple[int, str] | None) -> tuple[int, str]:
    """The memory beside PyTorch to count: measured here when this GPU is the target (or
    there is no target), else the table's figure for the target card. A process that has
    a context but has not run a matmul yet holds less than it will (cuBLAS's handle and
    kernels come with the first one): on a card the table knows, the larger figure."""
    key = card_key(target)
    if here is not None and (target is None or key is None or key == _name_key(here[1])):
        size, name = here
        table = OUTSIDE.get(_name_key(name) or "")
        if table is not None and table[0] > size:
            return table[0], (
                f"measured in this process on {name}: {format_bytes(size)}, before cuBLAS "
                f"was loaded; a step's matmuls load it: {table[1]}"
            )
        return size, f"measured in this process on {name}"
    if key in OUTSIDE:
        return OUTSIDE[key]
    return DEFAULT_OUTSIDE


def predict(
    events: list[Any],
    *,
    target: Target | None,
    outside: tuple[int, str],
    conf: str | None = None,
    breakdown: bool = True,
    untouched: dict[int, int] | None = None,
    count_untouched: bool = False,
) -> tuple[tuple[DryRunDevice, ...], bool | None, int | None]:
    """Each device's prediction from the dry run's events; whether the busiest fits the
    target, and by how much (target minus need, negative when short). ``breakdown``: also
    what each peak is made of, when the events carry what the run's hooks saw
    (``fake_run.Events.seen``; one more replay per device, ~1 % of a dry run).
    The user's tensors the cell used (``held before the cell``, first in the events) are
    held from the start, as in a fresh process that ran the earlier cells. ``untouched``:
    by device, what the kernel holds that the cell never used; listed, and held from the
    start too with ``count_untouched``."""
    from ..collectors.dry_run import HELD
    from ..collectors.dry_run import Alloc as FakeAlloc

    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") if conf is None else conf
    seen = getattr(events, "seen", None) if breakdown else None
    untouched = untouched or {}
    per_device: dict[int, list[Alloc | Free]] = defaultdict(list)
    where: dict[int, int] = {}
    workspaces: dict[int, int] = defaultdict(int)
    held: dict[int, int] = defaultdict(int)
    own: dict[int, int] = defaultdict(int)  # the cell's own allocations
    if count_untouched:
        for device, nbytes in untouched.items():
            if nbytes > 0:  # one block, below everything else
                per_device[device].append(Alloc(-1 - device, nbytes, 0))
    for e in events:
        if isinstance(e, FakeAlloc):
            if not e.nbytes:  # a cuDNN workspace of 0 bytes (or not sized): not asked for
                continue
            where[e.key] = e.device
            per_device[e.device].append(Alloc(e.key, e.nbytes, e.stream))
            if e.kind in ("cublas workspace", "cublaslt workspace"):
                workspaces[e.device] += e.nbytes
            if e.op == HELD:
                held[e.device] += e.nbytes
            else:
                own[e.device] += 1
        elif e.key in where:
            per_device[where[e.key]].append(Free(e.key))
    cap = None
    if target is not None:
        cap = target.bytes - outside[0] if target.whole_card else target.bytes
    devices = []
    fits: bool | None = None if target is None else True
    headroom: int | None = None
    for device, requests in sorted(per_device.items()):
        free = replay(requests, AllocatorConfig.from_conf(conf))
        oom_text = None
        if cap is not None:
            capped = replay(requests, AllocatorConfig.from_conf(conf, cap=max(cap, 0)))
            if capped.ooms:
                o = capped.ooms[0]
                oom_text = (
                    f"out of memory asking {format_bytes(o.requested)} with "
                    f"{format_bytes(o.reserved)} reserved under the {format_bytes(cap)} cap"
                )
                fits = False
                short = free.peak_reserved - cap
                headroom = -short if headroom is None else min(headroom, -short)
            else:
                room = cap - capped.peak_reserved
                headroom = room if headroom is None else min(headroom, room)
        parts = None
        if seen is not None:
            from ..analysis.dry_breakdown import analyze

            parts = analyze(device, events, seen, config=AllocatorConfig.from_conf(conf))
        devices.append(
            DryRunDevice(
                device=device,
                peak_allocated=free.peak_allocated,
                peak_reserved=free.peak_reserved,
                workspaces=workspaces[device],
                requests=own[device],
                segments=free.device_allocs,
                out_of_memory=oom_text,
                breakdown=parts,
                held=held[device],
                untouched=untouched.get(device, 0),
                untouched_counted=count_untouched and untouched.get(device, 0) > 0,
            )
        )
    if cap is not None and cap <= 0:
        fits, headroom = False, cap
    return tuple(devices), fits, headroom


def untouched_by_device(seen: Any) -> dict[int, int]:
    """What the kernel holds on each device that the run never used: PyTorch's allocated
    when it ended, less the blocks of the storages it used (each rounded as the allocator
    rounds it)."""
    from ..analysis.allocator_rules import round_size

    used: dict[int, int] = defaultdict(int)
    for a in seen.held:
        used[a.device] += round_size(a.nbytes)
    return {d: max(0, n - used[d]) for d, n in seen.kernel_allocated.items() if n - used[d] > 0}


def held_by(seen: Any) -> tuple[tuple[str, int], ...]:
    """Who holds what the run found on the device, largest first."""
    owners: dict[str, int] = defaultdict(int)
    for a in seen.held:
        owners[seen.held_owners.get(a.key, "tensors")] += a.nbytes
    return tuple(sorted(owners.items(), key=lambda o: (-o[1], o[0])))


def dry_run(
    run: Callable[[], object] | None = None,
    *,
    cell: Cell | None = None,
    target: Target | None = None,
    here: tuple[int, str] | None = None,
    device_type: str = "cuda",
    world_size: int = 1,
    count_untouched: bool = False,
    progress: Callable[[int, str | None, float], None] | None = None,
) -> DryRun:
    """Dry-run ``run()`` (or a notebook ``cell``) and predict its peaks.
    ``device_type="cpu"`` models the CPU's storages as if they were one GPU's (tests).
    ``world_size`` > 1: as rank 0 of a job of that many processes, in PyTorch's fake
    process group (``collectors/dry_run/group.py``); the prediction is rank 0's."""
    from ..collectors.dry_run import STARTED_CUDA, fake_job, record

    t0 = time.perf_counter()
    spaces = workspaces_for(target) if device_type == "cuda" else None
    with fake_job(world_size) as job:
        if cell is not None:
            seen = cell.record(device_type=device_type, workspaces=spaces, progress=progress)
        else:
            assert run is not None
            seen = record(run, device_type=device_type, workspaces=spaces, progress=progress)
    outside = outside_for(target, here)
    measured = outside[1].startswith("measured in this process")
    outside = with_libraries(outside, seen.libraries, job.world_size, measured)
    notes = job.explain(list(seen.notes))
    stopped = seen.error.line if seen.error is not None else None
    if stopped is not None and stopped in notes:
        notes.remove(stopped)
    try:
        devices, fits, headroom = predict(
            seen.events,
            target=target,
            outside=outside,
            untouched=untouched_by_device(seen),
            count_untouched=count_untouched,
        )
    except ValueError as e:  # a PYTORCH_CUDA_ALLOC_CONF the model does not follow
        devices, fits, headroom = (), None, None
        notes.append(f"PYTORCH_CUDA_ALLOC_CONF: {e}")
    if stopped is not None:
        fits = None
    key = card_key(target)
    if key is not None and any(n.startswith(CONV_SIZED) for n in notes):
        if not _same_card(key, here, device_type):
            notes.append(
                f"the convolutions' workspaces are those cuDNN picks on this GPU; on the "
                f"{target.label if target else key} it may pick other plans, with other "
                "workspaces"
            )
    if seen.cuda_initialized:
        notes.append(
            STARTED_CUDA
            if job.world_size > 1
            else "the dry run started CUDA in this process (it should not have)"
        )

    torch = imported_torch()
    return DryRun(
        devices=devices,
        outside=outside[0],
        outside_source=outside[1],
        target=target,
        seconds=time.perf_counter() - t0,
        world_size=job.world_size,
        notes=tuple(notes),
        stopped=stopped,
        execution_count=cell.execution_count if cell is not None else None,
        code=cell.code if cell is not None else "",
        torch_version=getattr(torch, "__version__", None),
        fits=fits,
        headroom=headroom,
        held_by=held_by(seen),
        unseen=tuple(sorted(seen.unseen)),
    )
