"""A worker's OOM post-mortem (collectors/workers/oom.py): the worker's own OOM observer
takes its allocator snapshot at the failure and hands it to the kernel as a file in the
channel's private directory; the kernel reads it once, deletes it, and shows the same
post-mortem as for its own cells.

Real fork and spawn, the real channel, the counting test backend (segments and blocks of
exact sizes, its OOM observers called as PyTorch calls them).
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import socket
import time

import pytest

from jupyter_gpumem.collectors import Collector, workers
from jupyter_gpumem.collectors.workers import oom
from jupyter_gpumem.core.tracker import CellTracker
from jupyter_gpumem.reporters.html import cell_report_html
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


def _largest_free(raw: dict, device: int) -> int:
    """The largest free block of the worker's own snapshot: computed here, in the worker,
    from torch's dict shape (adjacent free blocks of a segment are one run)."""
    best = 0
    for s in raw["segments"]:
        if s["device"] != device:
            continue
        run = 0
        for b in s["blocks"]:
            run = run + b["size"] if b["state"] == "inactive" else 0
            best = max(best, run)
    return best


def fragmented_rank(r: int, conn) -> None:
    """Rank 1: 1.5 GiB live with a 512 MiB hole, then 3 GiB asked under a 4 GiB cap."""
    os.environ["RANK"], os.environ["WORLD_SIZE"] = "1", "2"
    if r:  # spawned: report as the docs say
        import jupyter_gpumem

        jupyter_gpumem.report_worker()
    counting.allocate(2 * GiB, device=0)
    counting.free(1 * GiB, device=0)  # one segment: 1 GiB live, 1 GiB free
    counting.allocate(512 * MiB, device=0)  # from the free block: 512 MiB hole left
    time.sleep(workers.INTERVAL * 3)  # the reporter's first reading attaches the observer
    seen = {}
    counting._mine().observers.append(
        lambda *a: seen.update(largest=_largest_free(counting.snapshot(), 0), event=a)
    )
    try:
        counting.allocate(3 * GiB, device=0, cap=4 * GiB)
    except MemoryError:
        pass
    conn.send(seen)
    conn.close()


def _run(method: str) -> tuple[int, dict]:
    ctx = mp.get_context(method)
    here, there = ctx.Pipe()
    p = ctx.Process(target=fragmented_rank, args=(int(method == "spawn"), there))
    p.start()
    seen = here.recv() if here.poll(60) else {}
    p.join(30)
    assert p.exitcode == 0
    return p.pid, seen


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_ranks_oom_post_mortem(tracker, method):
    tracker.begin()  # opens the channel: a spawned worker finds it in the environment
    pid, seen = _run(method)
    report = tracker.end(execution_count=3)
    (w,) = report.workers
    assert (w.pid, w.rank) == (pid, 1)
    pm = w.postmortem
    assert pm is not None and pm.execution_count == 3
    assert seen["event"][:3] == (0, 3 * GiB, 4 * GiB)
    assert seen["largest"] == 512 * MiB  # the worker's own snapshot, at the failure
    assert (pm.requested, pm.largest_free_block, pm.cap) == (3 * GiB, seen["largest"], 4 * GiB)
    assert (pm.allocated, pm.reserved, pm.free_pieces_bytes) == (3 * GiB // 2, 2 * GiB, 512 * MiB)
    assert pm.free == counting.TOTAL - 2 * GiB  # cudaMemGetInfo's, in the worker
    assert pm.outside_torch == 0
    assert pm.need == 3 * GiB // 2 + 3 * GiB  # all it held, with the request
    assert pm.room == 4 * GiB  # the cap: restarted, nothing of it is kept
    kinds = [f.kind for f in pm.fixes]
    assert "empty_cache" not in kinds and "cap" in kinds and "fragmentation" not in kinds
    (cap_fix,) = [f for f in pm.fixes if f.kind == "cap"]
    assert cap_fix.fits is None and "set_per_process_memory_fraction" in cap_fix.text
    text = cell_report_text(report)
    assert f"out of memory on rank 1 (pid {pid}) cuda:0: what filled it" in text
    assert "largest free block 512.00 MiB" in text and "the rank needed" in text
    assert f"rank 1 (pid {pid}) cuda:0" in cell_report_html(report)
    # read once, deleted: nothing left in the channel's directory, and the next cell
    # shows no post-mortem again
    d = os.path.dirname(tracker.workers.address)
    assert [n for n in os.listdir(d) if n != "s"] == []
    assert oom.read_snapshot(d, f"oom-{pid}-1.json", pid) is None
    tracker.begin()
    assert all(w.postmortem is None for w in tracker.end().workers)


def test_fragmentation_fix_judged_against_what_the_rank_needed(tracker):
    """A request that the free pieces would hold but no single block does."""
    snap = oom.parse_snapshot(
        json.dumps(
            {
                "v": 1,
                "device": 0,
                "requested": 600 * MiB,
                "allowed": 2 * GiB,
                "free": 0,
                "total": 8 * GiB,
                "device_used": 8 * GiB,
                "process_used": None,
                "segments": [
                    [
                        1 << 40,
                        2 * GiB,
                        False,
                        "l",
                        [
                            [1 << 40, 512 * MiB, "a"],
                            [(1 << 40) + 512 * MiB, 512 * MiB, "i"],
                            [(1 << 40) + GiB, 512 * MiB, "a"],
                            [(1 << 40) + 3 * GiB // 2, 512 * MiB, "i"],
                        ],
                    ]
                ],
                "lines": [["train.py:12 step", GiB, 2]],
                "tracking": True,
                "expandable": False,
                "trimmed": False,
            }
        ).encode()
    )
    from jupyter_gpumem.analysis.postmortem import worker_postmortem
    from jupyter_gpumem.model import WorkerReport

    w = WorkerReport(1, 0, 2, "h", "exited", True, 0.0, (), oom_snapshot=snap)
    pm = worker_postmortem(w)
    assert pm is not None
    assert (pm.largest_free_block, pm.free_pieces, pm.free_pieces_bytes) == (512 * MiB, 2, GiB)
    (frag,) = [f for f in pm.fixes if f.kind == "fragmentation"]
    # the rank needs 1 GiB + 600 MiB; restarted it has the 2 GiB cap: covered, "maybe"
    assert frag.fits is None and "expandable_segments" in frag.text
    assert "rank 0 needed" in frag.text
    assert [(r.key, r.bytes) for r in pm.lines] == [("train.py:12 step", GiB)]


def test_trimmed_snapshot_keeps_free_runs_and_allocated():
    raw = counting_raw_with_many_blocks(2000)
    doc = oom.reduce_snapshot(raw, 0, 1, 2, 3)
    merged = [oom._merged(s) for s in doc["segments"]]
    before = oom.parse_snapshot(
        json.dumps({**doc, "total": None, "device_used": None, "process_used": None}).encode()
    )
    after = oom.parse_snapshot(
        json.dumps(
            {
                **doc,
                "segments": merged,
                "total": None,
                "device_used": None,
                "process_used": None,
                "trimmed": True,
            }
        ).encode()
    )
    from jupyter_gpumem.analysis.fragmentation import free_space

    a, b = free_space(before.segments), free_space(after.segments)
    assert (a.allocated, a.largest_free_block, a.pieces_bytes) == (
        b.allocated,
        b.largest_free_block,
        b.pieces_bytes,
    )
    assert sum(len(s["blocks"]) for s in after.segments) < sum(
        len(s["blocks"]) for s in before.segments
    )


def counting_raw_with_many_blocks(n: int) -> dict:
    base = 1 << 40
    blocks = []
    for i in range(n):  # two live blocks, then a free one
        state = "inactive" if i % 3 == 2 else "active_allocated"
        blocks.append({"address": base + i * MiB, "size": MiB, "state": state, "frames": []})
    seg = {"device": 0, "address": base, "total_size": n * MiB, "blocks": blocks}
    return {"segments": [seg]}


# -- hostile files ------------------------------------------------------------------------
def _wait(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return cond()


def _report(pid: int, names: list[str]) -> bytes:
    m = {
        "v": 1,
        "pid": pid,
        "host": socket.gethostname(),
        "rank": 0,
        "world_size": 1,
        "started": time.time(),
        "time": time.time(),
        "final": True,
        "via": "fork",
        "devices": [],
        "ooms": [],
        "snapshots": names,
    }
    return json.dumps(m).encode()


def test_hostile_snapshot_files_are_refused(tracker, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="jupyter_gpumem")
    tracker.begin()
    d = os.path.dirname(tracker.workers.address)
    pid = 4243
    good = oom.reduce_snapshot({"segments": []}, 0, 1, 2, 3)
    good.update(total=None, device_used=None, process_used=None)
    (tmp_path / "target.json").write_text(json.dumps(good))
    files = {
        f"oom-{pid}-1.json": b"x" * (oom.SNAPSHOT_LIMIT + 1),  # too large
        f"oom-{pid}-2.json": b"{not json",
        f"oom-{pid}-3.json": json.dumps({**good, "requested": -1}).encode(),
        f"oom-{pid}-4.json": json.dumps(
            {**good, "segments": [[0, 1, False, "l", [[5, 9, "a"]]]]}
        ).encode(),
    }
    for name, data in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    os.symlink(tmp_path / "target.json", os.path.join(d, f"oom-{pid}-5.json"))
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.sendto(_report(pid, [f"oom-{pid}-{i}.json" for i in (1, 2, 3, 4)]), tracker.workers.address)
    s.sendto(_report(pid + 1, [f"oom-{pid}-5.json"]), tracker.workers.address)  # another pid's
    s.sendto(_report(pid + 2, ["../target.json"]), tracker.workers.address)
    s.sendto(_report(pid + 3, [f"oom-{pid + 3}-5.json"]), tracker.workers.address)  # no such file
    assert _wait(lambda: len(tracker.workers.live()) == 2)
    os.rename(os.path.join(d, f"oom-{pid}-5.json"), os.path.join(d, f"oom-{pid + 4}-5.json"))
    s.sendto(_report(pid + 4, [f"oom-{pid + 4}-5.json"]), tracker.workers.address)  # symlink
    assert _wait(lambda: len(tracker.workers.live()) == 3)
    report = tracker.end()
    assert sorted(w.pid for w in report.workers) == [pid, pid + 3, pid + 4]
    assert all(w.postmortem is None for w in report.workers)
    assert sorted(os.listdir(d)) == ["s"]  # each refused file deleted, the symlink's target kept
    assert (tmp_path / "target.json").exists()
    logged = caplog.text
    for why in ("bytes long", "not JSON", "bad requested", "outside its segment", "bad snapshot"):
        assert why in logged
    assert "worker OOM snapshot" in logged and "refused" in logged
    cell_report_text(report)  # and every view still renders
    assert workers.parse_message(_report(pid, ["oom-4243-1.json/../x"])) is None
    assert workers.parse_message(_report(pid, ["a" * 300])) is None
    assert workers.parse_message(_report(pid, [f"oom-{pid}-1.json"] * 5)) is None


def test_snapshot_write_cost_is_bounded(tmp_path):
    """A realistic snapshot (20,000 blocks in 2,000 segments) fits the cap untrimmed."""
    raw = counting_raw_with_many_blocks(20_000)

    class B:
        def raw_snapshot(self):
            return raw

        def read(self, *a):
            class R:
                devices = ()

            return R()

    name = oom.write_snapshot(B(), str(tmp_path), 0, GiB, 2 * GiB, 0, 1)
    assert name == f"oom-{os.getpid()}-1.json"
    path = tmp_path / name
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert path.stat().st_size < oom.SNAPSHOT_LIMIT
    snap = oom.read_snapshot(str(tmp_path), name, os.getpid())
    assert snap is not None and not snap.trimmed and not path.exists()


def test_history_protocol_and_run_report_carry_the_short_form(tracker):
    from dataclasses import replace

    from jupyter_gpumem.core.history import row_from_report
    from jupyter_gpumem.protocol.convert import to_protocol
    from jupyter_gpumem.run.report import html_report, json_document
    from jupyter_gpumem.run.verdict import judge
    from tests.test_run_report import cell, dev, result, validate

    tracker.begin()
    _run("fork")
    report = tracker.end(execution_count=4)
    (w,) = report.workers
    line = (
        "asked 3.00 GiB, largest free block 512.00 MiB, free 78.00 GiB, cap 4.00 GiB; "
        "best fix: cap (maybe)"
    )
    (d,) = [d for d in row_from_report(report).devices if d.worker]
    assert (d.worker, d.oom) == (w.label, line)
    (p,) = [p for p in to_protocol(row_from_report(report))["devices"] if "worker" in p]
    assert p["oom"] == line
    from jupyter_gpumem.protocol import _validator, schema

    history_cell = schema()["$defs"]["history_cell"]
    _validator("key").check(to_protocol(row_from_report(report)), history_cell)
    worker_dev = {**dev(0), "worker": w.label, "ooms": 1, "oom": line}
    r = result(cell(0, "launch()", [dev(0), worker_dev], status="ok"))
    v = judge(r, [], None)
    doc = json_document(r, v, "nb.ipynb", [], None)
    validate(doc)
    assert doc["cells"][0]["devices"][1]["oom"] == line
    page = html_report(r, v, doc)
    assert "Out of memory in worker processes" in page
    assert f"{w.label} cuda:0: {line}" in page
    assert "oom" not in doc["cells"][0]["devices"][0]
    assert replace(w, postmortem=None).postmortem is None


def test_auto_mode_shows_the_ranks_post_mortem_in_a_real_shell(ip, monkeypatch):
    from tests.conftest import run

    monkeypatch.setenv("JUPYTER_GPUMEM_BACKEND", COUNTING)
    ip.user_ns["_run"] = _run
    run(ip, "%gpumem auto on")
    try:
        result, texts, _ = run(ip, "pid, seen = _run('fork')")
    finally:
        run(ip, "%gpumem auto off")
    assert result.success, result.error_in_exec
    pid = ip.user_ns["pid"]
    (text,) = [t for t in texts if "worker processes" in t]  # the full report, not the line
    assert f"out of memory on rank 1 (pid {pid}) cuda:0: what filled it" in text
    assert f"out of memory on rank 1 (pid {pid}) cuda:0: fixes, best first" in text
    from jupyter_gpumem._ipython import current

    session = current()
    assert session is not None
    rows = [d for r in session.history.last(1) for d in r.devices if d.worker]
    line = (
        "asked 3.00 GiB, largest free block 512.00 MiB, free 78.00 GiB, cap 4.00 GiB; "
        "best fix: cap (maybe)"
    )
    assert [d.oom for d in rows] == [line]
    _, _, cap = run(ip, "%gpumem history")
    assert f"cuda:0 rank 1 (pid {pid}): out of memory: {line}" in cap.stdout, cap.stdout
