"""One record of every type ``protocol.to_protocol`` converts, every field set to a value
that is not its default (a field the converter forgot would show), for the conversion
tests (``test_protocol_convert.py``) and the timing in ``benchmarks/bench_convert.py``."""

from __future__ import annotations

from typing import Any

from jupyter_gpumem.model import (
    AllocatorStats,
    Breakdown,
    CategoryShare,
    CellReport,
    DeviceAttribution,
    DeviceCellReport,
    DeviceRow,
    DeviceSample,
    Fix,
    Forecast,
    FreeSpace,
    HistoryRow,
    LineShare,
    Measurement,
    ModuleShare,
    OomEvent,
    PostMortem,
    ProcessMemory,
    Replay,
    SegmentMap,
    Site,
    WhoReport,
    WhoRow,
    WorkerReport,
)
from jupyter_gpumem.model.free import DeviceFree, FreeReport, Holder, LetGo
from jupyter_gpumem.model.measurement import Limit
from jupyter_gpumem.model.snapshot import BlockView, SegmentView
from jupyter_gpumem.model.workers import WorkerDevice

GiB = 1 << 30


def allocator(k: int = 1) -> AllocatorStats:
    return AllocatorStats(
        allocated=1 * GiB * k,
        reserved=2 * GiB * k,
        active=1 * GiB * k + 5,
        requested=1 * GiB * k - 7,
        inactive_split=123 * k,
        peak_allocated=3 * GiB * k,
        peak_reserved=4 * GiB * k,
        device_allocs=11 * k,
        device_frees=3 * k,
        alloc_retries=1 * k,
        ooms=2 * k,
        segments=9 * k,
        blocks=77 * k,
        peak_inactive_split=55 * k,
    )


def device(k: int = 1, alloc: bool = True) -> DeviceSample:
    return DeviceSample(
        index=k - 1,
        name="NVIDIA H200",
        backend="cuda",
        initialized=alloc,
        allocator=allocator(k) if alloc else None,
        total=140 * GiB,
        device_used=20 * GiB * k,
        process_used=6 * GiB * k,
        limit=Limit(0.5, 70 * GiB) if alloc else None,
        error=None if alloc else "not initialised",
        children=(ProcessMemory(4242, "python", 512 << 20),),
    )


def worker() -> WorkerReport:
    d = WorkerDevice(1, "NVIDIA H200", 5, 1 * GiB, 2 * GiB, 3 * GiB, 4 * GiB, 1, 12, True)
    return WorkerReport(
        pid=4242,
        rank=1,
        world_size=2,
        host="gpu-node",
        status="running",
        started_in_cell=True,
        age=1.23456789,
        devices=(d,),
        ooms=(OomEvent(1, 100, 200, 50),),
        via="spawn",
    )


REPLAY = Replay("NVIDIA H200", "2.11.0+cu130", "2026-11-21")


def measurement(n_devices: int = 1, full: bool = True) -> Measurement:
    return Measurement(
        time=1700000000.25,
        clock=12.5,
        state="ok",
        message="",
        torch_version="2.13.0",
        host_rss=3 * GiB,
        caching=True,
        devices=tuple(device(k) for k in range(1, n_devices + 1)),
        workers=(worker(),) if full else (),
        replay=REPLAY if full else None,
    )


SITE = Site("cell", "<ipython-input-7>", 3, "f", 7, "x = torch.ones(n)", "torch/x.py:1 ones")
ROW = WhoRow("acts", "a list", 1 * GiB, 3, "acts[0]", "owner", "In[7] line 3")
FIX = Fix("cap", "raise the cap", 1 * GiB, None, "torch.cuda.x()", True, 512, ("acts",))
PM = PostMortem(
    device=0,
    requested=2 * GiB,
    free=1 * GiB,
    total=140 * GiB,
    cap=70 * GiB,
    reserved=69 * GiB,
    allocated=60 * GiB,
    cached_free=9 * GiB,
    releasable=1 * GiB,
    free_pieces=4,
    free_pieces_bytes=8 * GiB,
    largest_free_block=1 * GiB - 1,
    outside_torch=500 << 20,
    other_processes=(ProcessMemory(99, "other", 1 * GiB),),
    owners=(ROW,),
    lines=(WhoRow("In[7] line 3", "x = ...", GiB, 1, kind="site"),),
    fixes=(FIX,),
    execution_count=7,
    time=1700000001.5,
    need=3 * GiB,
    need_full=4 * GiB,
    room=2 * GiB,
    hint="`%%gpumem --scan batch=8,16`",
    expandable_segments=True,
)
FORECAST = Forecast(
    0, "rank 1 (pid 4242)", GiB, 3, 12.3456789, 70 * GiB, "cap", 60 * GiB, 5, 3, "In[7] line 3", 1.5
)


def cell() -> CellReport:
    before, after = measurement(), measurement()
    after.time += 2.0
    dev = DeviceCellReport(before.devices[0], after.devices[0], 5 * GiB, 6 * GiB, True)
    share = LineShare(3, "x = torch.ones(n)", GiB, 2, SITE)
    attribution = DeviceAttribution(0, GiB, (share, share, share, share), 5, 6)
    return CellReport(
        execution_count=7,
        first_line="x = torch.ones(n)",
        before=before,
        after=after,
        devices=(dev,),
        wall_time=1.5,
        failed=True,
        error="OutOfMemoryError",
        attribution=(attribution,),
        postmortems=(PM,),
        forecasts=(FORECAST,),
    )


BREAKDOWN = Breakdown(
    device=0,
    peak=5 * GiB,
    base=GiB,
    categories=(CategoryShare("parameters", GiB, 4), CategoryShare("activations", 4 * GiB, 9)),
    phase="forward",
    modules=(ModuleShare("model.fc1", 3 * GiB, 512), ModuleShare("model.fc2", GiB, 0)),
    reserved_at_peak=6 * GiB,
    outside_torch=500 << 20,
    exact=False,
    events=1234,
    peak_event=77,
    counter_peak=5 * GiB + 512,
    note="the trace wrapped",
)


def history_row() -> HistoryRow:
    own = DeviceRow(0, GiB, 5, 2 * GiB, 6, 3 * GiB, 7, 8, 9, "In[7] line 3")
    theirs = DeviceRow(1, GiB, 5, 2 * GiB, 6, 3 * GiB, 7, 8, 9, None, "rank 1 (pid 4242)", 2, "OOM")
    return HistoryRow(7, 1700000000.5, "x = f()", 1.25, False, 4096, (own, theirs))


def segment_map() -> SegmentMap:
    blocks = (
        BlockView(0, 1024, 1000, "allocated", "In[7] line 3 `x = ...`"),
        BlockView(1024, 512, 512, "piece", ""),
        BlockView(1536, 512, 500, "allocated", "In[7] line 3 `x = ...`"),
        BlockView(2048, 2048, 2000, "pending", "In[8] line 1 `y = ...`"),
    )
    seg = SegmentView(0x7F0000000000, 4096, "large", 0, False, blocks)
    space = FreeSpace(1, 4096, 3584, 0, 1, 512, 512, 512, False)
    return SegmentMap(0, space, (seg,), 2, 8192, True, "rank 1")


def who_report() -> WhoReport:
    return WhoReport(0, "variable", 2 * GiB, GiB, (ROW,), True, ("a note",), 10, 0.0123456789)


LET_GO = LetGo("opt", "delete", "the optimizer of model", 5 * GiB, "del opt")
KEPT = Holder("results", GiB, "results['model'].fc.weight", "also holds more", "del results")
FREED = DeviceFree(1, 9 * GiB, 14 * GiB, 12 * GiB, 512, 13 * GiB, 11 * GiB, 4096)
FREE_REPORT = FreeReport(
    names=("model", "Out[7]"),
    let_go=(LET_GO,),
    kept=(KEPT,),
    devices=(FREED,),
    done=True,
    still=(Holder("no Python object", 4096, "", "a C extension"),),
    notes=("a note",),
    elapsed=0.0123456789,
)


def samples() -> dict[str, Any]:
    """Named records: one of every registered type (a Measurement with and without its
    optional parts)."""
    return {
        "measurement": measurement(),
        "measurement_bare": measurement(2, full=False),
        "device_uninitialized": device(3, alloc=False),
        "limit": Limit(0.5, 70 * GiB),
        "replay": REPLAY,
        "replay_undated": Replay("Tesla T4", None),
        "worker": worker(),
        "cell": cell(),
        "forecast": FORECAST,
        "site": SITE,
        "line_share": LineShare(3, "x = 1", 10, 1, SITE),
        "who_row": ROW,
        "who_report": who_report(),
        "fix": FIX,
        "process_memory": ProcessMemory(1, "p", 2),
        "postmortem": PM,
        "history_row": history_row(),
        "segment_map": segment_map(),
        "free_report": FREE_REPORT,
        "free_let_go": LET_GO,
        "free_holder": KEPT,
        "free_device": FREED,
        "breakdown": BREAKDOWN,
    }
