"""Ranks on other hosts: their figures travel through the job's torch.distributed store
(collectors/distributed.py). Processes on one host stand in for hosts: a real Gloo group
of three, the test process as rank 0 (the kernel), ranks 1 and 2 in their own
interpreters with the counting test backend."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from jupyter_gpumem.collectors import Collector, distributed, workers  # noqa: E402
from jupyter_gpumem.core.tracker import CellTracker  # noqa: E402
from jupyter_gpumem.reporters.text import cell_report_text  # noqa: E402
from jupyter_gpumem.testing import counting  # noqa: E402

MiB = 2**20
RANK = textwrap.dedent(
    """
    import sys, datetime, torch.distributed as dist
    import jupyter_gpumem
    from jupyter_gpumem.testing import counting
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    store = dist.TCPStore("127.0.0.1", port, 3, is_master=False,
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=3)
    jupyter_gpumem.report_to_store()
    counting.allocate((rank + 1) * 100 * 2**20, device=rank)   # keeps (r+1)*100 MiB
    counting.allocate(300 * 2**20, device=rank)
    counting.free(300 * 2**20, device=rank)                   # peaks at (r+4)*100 MiB
    dist.barrier()  # 1: allocated
    dist.barrier()  # 2: the kernel has looked
    dist.destroy_process_group()
    """
)


def wait_for(cond, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError("timed out")


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo")
def test_ranks_report_through_the_group_store():
    import datetime

    store = dist.TCPStore(
        "127.0.0.1",
        0,
        3,
        is_master=True,
        timeout=datetime.timedelta(seconds=60),
        wait_for_workers=False,
    )
    env = {**os.environ, "JUPYTER_GPUMEM_BACKEND": "jupyter_gpumem.testing.counting:backend"}
    procs = [
        subprocess.Popen([sys.executable, "-c", RANK, str(r), str(store.port)], env=env)
        for r in (1, 2)
    ]
    ch = workers.channel()
    tracker = CellTracker(Collector(counting.backend()), ch)
    try:
        dist.init_process_group("gloo", store=store, rank=0, world_size=3)
        watcher = distributed.watch_store()
        assert watcher.ranks == [1, 2]
        tracker.begin()
        dist.barrier()  # the ranks have allocated
        wait_for(lambda: len(ch.live()) == 2)
        report = tracker.end(execution_count=4)
        got = [
            (w.rank, w.via, w.status, d.index, d.allocated, d.peak_allocated)
            for w in report.workers
            for d in w.devices
        ]
        assert got == [
            (1, "store", "running", 1, 200 * MiB, 500 * MiB),
            (2, "store", "running", 2, 300 * MiB, 600 * MiB),
        ]
        assert all(w.world_size == 3 for w in report.workers)
        assert "rank 2 (pid" in cell_report_text(report)
        dist.barrier()  # the ranks exit: their last reports say so
        for p in procs:
            assert p.wait(60) == 0
        tracker.begin()
        wait_for(lambda: all(w.status == "exited" for w in ch.live()) and ch.live())
        report = tracker.end()
        assert [(w.rank, w.status) for w in report.workers] == [(1, "exited"), (2, "exited")]
    finally:
        distributed.stop_watching()
        tracker.cancel()
        ch.close()
        if dist.is_initialized():
            dist.destroy_process_group()
        for p in procs:
            p.kill()


def test_watch_without_a_group_says_what_to_do():
    with pytest.raises(RuntimeError, match="init_process_group first, or pass the job's store"):
        distributed.watch_store()
    with pytest.raises(RuntimeError, match="pass rank="):
        distributed.report_to_store(store=object())
