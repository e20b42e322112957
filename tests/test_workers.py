"""Worker processes report their own allocators to the kernel (collectors/workers/).

Real processes, real fork and spawn, the real channel; the allocator is the counting test
backend, driven byte by byte by the workers (tests/gpu/test_workers.py checks the same
reports against PyTorch's allocator on two GPUs).
"""

from __future__ import annotations

import ast
import json
import multiprocessing as mp
import os
import signal
import socket
import time

import pytest

from jupyter_gpumem.collectors import Collector, workers
from jupyter_gpumem.core.tracker import CellTracker
from jupyter_gpumem.reporters._rows import compact_line
from jupyter_gpumem.reporters.text import cell_report_text
from jupyter_gpumem.testing import counting

GiB = 2**30
MiB = 2**20
COUNTING = "jupyter_gpumem.testing.counting:backend"


@pytest.fixture
def tracker(monkeypatch):
    monkeypatch.setenv("JUPYTER_GPUMEM_BACKEND", COUNTING)
    ch = workers.channel()
    t = CellTracker(Collector(counting.backend()), ch)
    yield t
    t.cancel()
    ch.close()


def rank_keeps_and_peaks(r: int) -> None:
    """Rank r keeps (r+1) GiB and peaks at (r+3) GiB on device r (the issue's case)."""
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(r), "2"
    counting.allocate((r + 1) * GiB, device=r)
    counting.allocate(2 * GiB, device=r)
    counting.free(2 * GiB, device=r)


# A notebook cell that forks two ranks (what notebook_launcher does): rank r keeps (r+1)
# GiB and peaks at (r+3) GiB on device r, with the counting test backend.
FORK_TWO_RANKS = """\
import os, multiprocessing as mp
from jupyter_gpumem.testing import counting
def rank(r):
    os.environ['RANK'] = str(r)
    counting.allocate((r + 1) * 2**30, device=r)
    counting.allocate(2 * 2**30, device=r)
    counting.free(2 * 2**30, device=r)
ps = [mp.get_context('fork').Process(target=rank, args=(r,)) for r in (0, 1)]
for p in ps: p.start()
for p in ps: p.join()
"""


def fork_ranks(target=rank_keeps_and_peaks, n: int = 2) -> list[int]:
    ctx = mp.get_context("fork")
    ps = [ctx.Process(target=target, args=(r,)) for r in range(n)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(10)
    assert [p.exitcode for p in ps] == [0] * n
    return [p.pid for p in ps]


def test_two_forked_ranks_exact(tracker):
    tracker.begin()
    pids = fork_ranks()
    report = tracker.end(execution_count=7)
    assert [(w.rank, w.pid, w.status, w.started_in_cell) for w in report.workers] == [
        (0, pids[0], "exited", True),
        (1, pids[1], "exited", True),
    ]
    for r, w in enumerate(report.workers):
        assert w.world_size == 2 and w.via == "fork" and w.host == socket.gethostname()
        (d,) = w.devices
        assert d.index == r
        assert d.allocated == (r + 1) * GiB and d.allocated_before == 0
        assert d.peak_allocated == (r + 3) * GiB and d.peak_exact
        assert d.reserved == (r + 3) * GiB
        assert d.device_allocs == 2 and d.ooms == 0
    text = cell_report_text(report)
    assert f"rank 1 (pid {pids[1]}) cuda:1  allocated 2.00 GiB (+2.00 GiB), peak 4.00 GiB" in text
    assert compact_line(report).startswith(
        "gpumem [7] workers: rank 0 peak 3.00 GiB, rank 1 peak 4.00 GiB |"
    )
    # reported once: the next cell does not list workers that ended before it
    tracker.begin()
    assert tracker.end().workers == ()


def test_fork_outside_a_measured_cell_does_not_report(tracker):
    tracker.begin()
    tracker.end()  # the channel is open
    fork_ranks()
    tracker.begin()
    assert tracker.end().workers == ()


def oom_worker(r: int) -> None:
    counting.allocate(3 * GiB, device=0, cap=4 * GiB)
    try:
        counting.allocate(2 * GiB, device=0, cap=4 * GiB)
    except MemoryError:
        pass


def test_worker_oom_counted(tracker):
    tracker.begin()
    fork_ranks(oom_worker, 1)
    (w,) = tracker.end().workers
    # before the worker's first reading its OOM observer is not attached: the count is
    assert w.rank is None and w.devices[0].ooms == 1
    assert "1 OOM" in cell_report_text(_last(tracker, w))
    # the history keeps the worker's count on its device row, and the panel gets it
    from jupyter_gpumem.core.history import row_from_report
    from jupyter_gpumem.protocol.convert import to_protocol

    (d,) = [d for d in row_from_report(_last(tracker, w)).devices if d.worker]
    assert (d.worker, d.device, d.ooms) == (w.label, 0, 1)
    (p,) = [p for p in to_protocol(row_from_report(_last(tracker, w)))["devices"] if "worker" in p]
    assert p["ooms"] == 1


def _last(tracker, w):
    from dataclasses import replace

    tracker.begin()
    return replace(tracker.end(), workers=(w,))


def _oom_after_first_report(r: int) -> None:
    counting.allocate(3 * GiB, device=0, cap=4 * GiB)
    time.sleep(workers.INTERVAL * 3)  # the reporter's first reading attaches the observer
    try:
        counting.allocate(2 * GiB, device=0, cap=4 * GiB)
    except MemoryError:
        pass


def test_worker_oom_event_reported(tracker):
    tracker.begin()
    fork_ranks(_oom_after_first_report, 1)
    report = tracker.end()
    (e,) = report.workers[0].ooms
    assert (e.device, e.requested, e.allowed, e.free) == (0, 2 * GiB, 4 * GiB, 1 * GiB)
    assert "out of memory on cuda:0: asked 2.00 GiB with 1.00 GiB free of 4.00 GiB" in (
        cell_report_text(report)
    )


def sleeper(r: int) -> None:
    os.environ["RANK"] = str(r)
    counting.allocate(5 * MiB, device=0)
    time.sleep(60)


def test_hung_worker_never_blocks_and_turns_silent_when_killed(tracker):
    tracker.begin()
    p = mp.get_context("fork").Process(target=sleeper, args=(3,))
    p.start()
    time.sleep(workers.INTERVAL * 4)  # its first periodic report
    t0 = time.perf_counter()
    report = tracker.end()
    assert time.perf_counter() - t0 < 1.0  # nothing waits for the worker (alive for 60 s)
    (w,) = report.workers
    assert (w.rank, w.status, w.devices[0].allocated) == (3, "running", 5 * MiB)
    assert "still running at the cell's end" in cell_report_text(report)
    # the next cell: the worker is from before it, and still there
    tracker.begin()
    time.sleep(0.05)
    (w,) = tracker.end().workers
    assert w.status == "running" and not w.started_in_cell
    assert w.devices[0].allocated_before == 5 * MiB and not w.devices[0].peak_exact
    # killed: no last report, and the process is gone
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    tracker.begin()
    (w,) = tracker.end().workers
    assert w.status == "silent"
    assert "stopped reporting without a last report" in cell_report_text(_last(tracker, w))
    tracker.begin()
    assert tracker.end().workers == ()  # said once


def grandchild(r: int) -> None:
    counting.allocate(1 * GiB, device=0)
    q = mp.get_context("fork").Process(target=counting.allocate, args=(7 * GiB,))
    q.start()
    q.join(10)


def test_worker_of_a_worker_does_not_report(tracker):
    tracker.begin()
    pids = fork_ranks(grandchild, 1)
    report = tracker.end()
    assert [w.pid for w in report.workers] == pids
    assert report.workers[0].devices[0].peak_allocated == 1 * GiB


def spawned(r: int) -> None:
    import jupyter_gpumem

    assert jupyter_gpumem.report_worker()
    os.environ["RANK"] = str(r)
    counting.allocate((r + 1) * 3 * MiB, device=r)


def test_spawned_worker_reports_when_it_asks(tracker):
    tracker.begin()
    assert os.environ[workers.WORKERS_ENV] == tracker.workers.address
    ctx = mp.get_context("spawn")
    ps = [ctx.Process(target=spawned, args=(r,)) for r in range(2)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(60)
    assert [p.exitcode for p in ps] == [0, 0]
    report = tracker.end()
    got = [(w.rank, w.via, w.devices[0].index, w.devices[0].allocated) for w in report.workers]
    assert got == [(0, "spawn", 0, 3 * MiB), (1, "spawn", 1, 6 * MiB)]


def spawned_by_torch(i: int, base: int) -> None:
    """A worker of torch.multiprocessing.spawn: its index is its first argument, and no
    launcher set RANK."""
    import jupyter_gpumem

    os.environ.pop("RANK", None)
    os.environ.pop("LOCAL_RANK", None)
    assert jupyter_gpumem.report_worker()
    counting.allocate(base * (i + 1), device=i)


def test_a_torch_spawn_worker_shows_its_index_as_its_rank(tracker):
    torch_mp = pytest.importorskip("torch.multiprocessing")
    tracker.begin()
    torch_mp.spawn(spawned_by_torch, args=(5 * MiB,), nprocs=2, join=True)
    report = tracker.end()
    got = sorted((w.rank, w.devices[0].index, w.devices[0].allocated) for w in report.workers)
    assert got == [(0, 0, 5 * MiB), (1, 1, 10 * MiB)]


def test_report_worker_without_a_kernel_says_no(monkeypatch):
    monkeypatch.delenv(workers.WORKERS_ENV, raising=False)
    assert workers.report_from_worker() is False


def good_message(**kw):
    m = {
        "v": 1,
        "pid": 4242,
        "host": socket.gethostname(),
        "rank": 0,
        "world_size": 1,
        "started": time.time(),
        "time": time.time(),
        "final": True,
        "via": "fork",
        "devices": [
            {
                "index": 0,
                "name": "G",
                "allocated": 1,
                "reserved": 2,
                "peak_allocated": 3,
                "peak_reserved": 4,
                "ooms": 0,
                "device_allocs": 1,
            }
        ],
        "ooms": [],
    }
    m.update(kw)
    return m


@pytest.mark.parametrize(
    "bad",
    [
        b"not json",
        b"\xff\xfe",
        b"[]",
        json.dumps(good_message(v=2)).encode(),
        json.dumps(good_message(pid=True)).encode(),
        json.dumps(good_message(pid="1")).encode(),
        json.dumps(good_message(via="ssh")).encode(),
        json.dumps(good_message(rank=1.5)).encode(),
        json.dumps(good_message(final=1)).encode(),
        json.dumps(good_message(devices=[{"index": 0}])).encode(),
        json.dumps(
            good_message(devices=[{**good_message()["devices"][0], "allocated": -1}])
        ).encode(),
        json.dumps(good_message(devices=good_message()["devices"] * 17)).encode(),
        json.dumps(good_message(ooms=[[0, 1, 2]])).encode(),
        json.dumps({k: v for k, v in good_message().items() if k != "host"}).encode(),
    ],
)
def test_malformed_reports_are_ignored(bad):
    assert workers.parse_message(bad) is None


def test_garbage_on_the_socket_is_dropped_and_reports_still_arrive(tracker):
    tracker.begin()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    for junk in (b"", b"x" * 100, b'{"v":1}', json.dumps(good_message(pid=-5, via="x")).encode()):
        s.sendto(junk, tracker.workers.address)
    s.sendto(json.dumps(good_message()).encode(), tracker.workers.address)
    deadline = time.monotonic() + 10  # the channel's thread takes it (no fork to wait for)
    while not tracker.workers.live() and time.monotonic() < deadline:
        time.sleep(0.01)
    (w,) = tracker.end().workers
    assert (w.pid, w.devices[0].peak_allocated) == (4242, 3)


def test_the_channel_is_private_and_removed(tracker):
    tracker.begin()
    tracker.end()
    path = tracker.workers.address
    assert os.stat(os.path.dirname(path)).st_mode & 0o077 == 0
    tracker.workers.close()
    assert not os.path.exists(os.path.dirname(path))
    assert workers.WORKERS_ENV not in os.environ
    tracker.begin()  # opens again
    assert os.path.exists(tracker.workers.address)
    tracker.end()


@pytest.mark.kernel
def test_through_a_real_kernel_with_fork_launch():
    """A notebook's cell forks two ranks (as notebook_launcher does); its report, its
    auto-mode line and the history show both ranks' own figures, exactly."""
    from jupyter_client.manager import start_new_kernel

    from tests.test_kernel_e2e import execute, of_type

    env = {**os.environ, "JUPYTER_GPUMEM_BACKEND": COUNTING}
    km, kc = start_new_kernel(kernel_name="python3", env=env)
    try:
        execute(kc, "%load_ext gpumem")
        code = "%%gpumem -o rep\n" + FORK_TWO_RANKS
        reply, msgs = execute(kc, code)
        assert reply["status"] == "ok"
        (shown,) = of_type(msgs, "display_data")
        text = shown["data"]["text/plain"]
        assert "worker processes (2): their own allocators" in text
        assert "peak 4.00 GiB" in shown["data"]["text/html"]
        reply, msgs = execute(
            kc,
            "[(w.rank, w.status, d.index, d.allocated, d.peak_allocated, d.reserved)"
            " for w in rep.workers for d in w.devices]",
        )
        got = of_type(msgs, "execute_result")[0]["data"]["text/plain"]
        G = 2**30
        assert ast.literal_eval(got) == [
            (0, "exited", 0, G, 3 * G, 3 * G),
            (1, "exited", 1, 2 * G, 4 * G, 4 * G),
        ]
        # auto mode: the one line names each rank's peak
        execute(kc, "%gpumem auto on")
        reply, msgs = execute(
            kc,
            "p = mp.get_context('fork').Process(target=rank, args=(1,))\np.start()\np.join()",
        )
        (line,) = [d["data"]["text/plain"] for d in of_type(msgs, "display_data")]
        assert "workers: rank 1 peak 4.00 GiB" in line
        # the history keeps each worker's device as a row of its own
        execute(kc, "%gpumem auto off")
        reply, msgs = execute(
            kc,
            "import jupyter_gpumem as g\n"
            "[(r['worker'], r['device'], r['peak_allocated']) for r in"
            " g._ipython.current().history.records() if r['worker']]",
        )
        got = ast.literal_eval(of_type(msgs, "execute_result")[0]["data"]["text/plain"])
        label = [w for w, _, _ in got]
        assert [(d, p) for _, d, p in got] == [(0, 3 * G), (1, 4 * G), (1, 4 * G)]
        assert label[0].startswith("rank 0 (pid ") and label[2].startswith("rank 1 (pid ")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_magic_lists_workers_and_checks_its_arguments(ip, monkeypatch):
    from IPython.core.error import UsageError

    from tests.conftest import run

    monkeypatch.setenv("JUPYTER_GPUMEM_BACKEND", COUNTING)
    _, texts, cap = run(ip, "%gpumem workers")
    assert "no worker process has reported" in cap.stdout
    ip.user_ns["sleeper"] = sleeper
    run(
        ip,
        "%%gpumem -q\nimport multiprocessing as mp\n"
        "p = mp.get_context('fork').Process(target=sleeper, args=(5,))\np.start()",
    )
    p = ip.user_ns["p"]
    try:
        deadline = time.monotonic() + 10
        while not workers.live() and time.monotonic() < deadline:
            time.sleep(0.02)
        _, texts, _ = run(ip, "%gpumem workers")
        assert f"rank 5 (pid {p.pid}) cuda:0  allocated 5.00 MiB" in texts[0]
        _, texts, _ = run(ip, "%gpumem")  # the table of now lists them too
        assert f"rank 5 (pid {p.pid})" in texts[0]
    finally:
        p.kill()
        p.join()
    for bad, said in (
        ("%gpumem workers --ranks 1,x", "--ranks: expected ranks like 1,2,3"),
        ("%gpumem workers watch", "init_process_group first"),
        ("%gpumem workers nope", "invalid choice"),
    ):
        with pytest.raises(UsageError, match=said):
            ip.run_line_magic("gpumem", bad.split(" ", 1)[1])


def ranked(r: int) -> None:
    """As notebook_launcher's ranks: the rank from the launcher's argument."""
    os.environ["RANK"] = str(r)
    counting.allocate((r + 1) * GiB, device=r)
    counting.allocate(2 * GiB, device=r)
    counting.free(2 * GiB, device=r)
    if r == 1:
        raise RuntimeError("rank 1 fails after its allocations")


def test_torch_start_processes_fork_and_a_failing_rank(tracker):
    """torch.multiprocessing.start_processes(..., start_method="fork"), the launcher that
    accelerate's notebook_launcher uses: both ranks report, the one that raised too (its
    last report comes from multiprocessing's finalizers)."""
    tmp = pytest.importorskip("torch.multiprocessing")
    tracker.begin()
    with pytest.raises(Exception, match="rank 1 fails"):
        tmp.start_processes(ranked, nprocs=2, start_method="fork")
    report = tracker.end()
    got = [
        (w.rank, w.status, d.index, d.allocated, d.peak_allocated)
        for w in report.workers
        for d in w.devices
    ]
    assert got == [(0, "exited", 0, GiB, 3 * GiB), (1, "exited", 1, 2 * GiB, 4 * GiB)]
