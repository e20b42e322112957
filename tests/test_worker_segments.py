"""A worker's segment map on request (``%gpumem segments --rank N``, the protocol's
``segments`` with ``rank``): the kernel asks the worker through a file in the channel's
private directory, the worker's reporter thread answers with its own allocator snapshot
as a file (collectors/workers/segment_requests.py, with oom.py's writer, reader and checks),
and the kernel draws it with the same analysis and views as its own map.

Real forked workers, the real channel, a real IPython shell, the counting test backend
(segments and blocks of exact sizes; each worker writes its own snapshot to a file, the
ground truth the kernel's map must equal).
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import threading
import time

import pytest

from jupyter_gpumem.collectors import workers
from jupyter_gpumem.collectors.workers import kernel_channel, oom, segment_requests
from jupyter_gpumem.errors import ActionRefused
from jupyter_gpumem.testing import counting
from jupyter_gpumem.units import format_bytes
from tests.conftest import run

GiB = 2**30
MiB = 2**20
COUNTING = "jupyter_gpumem.testing.counting:backend"
HOST = socket.gethostname()


def _wait(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return cond()


LIVE = GiB + 512 * MiB + 600 * MiB + 4096  # what keeps_segments leaves allocated


def keeps_segments(rank: int, truth: str, go, done) -> None:
    """A rank with three segments on cuda:1: 2 GiB holding 1.5 GiB live and a 512 MiB
    free piece, 600 MiB + 4 KiB all live, and 1.5 GiB cached free; writes its own
    snapshot, then waits."""
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), "2"
    counting.allocate(2 * GiB, device=1)
    counting.free(2 * GiB, device=1)
    counting.allocate(GiB, device=1)  # split: 1 GiB live, 1 GiB free in one segment
    counting.allocate(512 * MiB, device=1)  # from the free block: 512 MiB left free
    counting.allocate(600 * MiB + 4096, device=1)  # no free block holds it: a segment
    counting.allocate(1536 * MiB, device=1)
    counting.free(1536 * MiB, device=1)  # a wholly free segment: cached
    with open(truth, "w") as f:
        json.dump(counting.snapshot(), f)
    go.set()
    done.wait(30)


class Ranks:
    """Forked ranks that keep their memory until the test lets them go."""

    def __init__(self, tmp_path):
        self.ctx = mp.get_context("fork")
        self.done = self.ctx.Event()
        self.tmp = tmp_path
        self.procs: list = []

    def start(self, rank: int, target=keeps_segments) -> tuple[int, dict]:
        go = self.ctx.Event()
        truth = self.tmp / f"truth-{len(self.procs)}.json"
        p = self.ctx.Process(target=target, args=(rank, str(truth), go, self.done))
        p.start()
        self.procs.append(p)
        assert go.wait(20)
        return p.pid, json.loads(truth.read_text())

    def stop(self) -> None:
        self.done.set()
        for p in self.procs:
            with _suppress():
                os.kill(p.pid, signal.SIGCONT)
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is not None and issubclass(exc[0], OSError)


@pytest.fixture
def ranks(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_GPUMEM_BACKEND", COUNTING)
    r = Ranks(tmp_path)
    yield r
    r.stop()


def _in_cell(ip, ranks: Ranks, rank: int, target=keeps_segments) -> tuple[int, dict]:
    """Fork the rank inside a measured cell (a fork outside one does not report), and wait
    for its first report."""
    ip.user_ns["_start"] = lambda: ranks.start(rank, target)
    result, _, _ = run(ip, "%%gpumem -q\n_got = _start()")
    assert result.success, result.error_in_exec
    pid, truth = ip.user_ns["_got"]
    assert _wait(lambda: any(w.pid == pid for w in workers.live()))
    return pid, truth


def _segments(truth: dict, device: int) -> list[tuple[int, int]]:
    return sorted(
        (s["address"], s["total_size"]) for s in truth["segments"] if s["device"] == device
    )


def _channel_files() -> list[str]:
    d = os.path.dirname(workers.channel().address or "")
    return sorted(n for n in os.listdir(d) if n != "s")


# -- the magic, through a real shell ------------------------------------------------------
def test_a_ranks_map_equals_its_own_snapshot(ip, ranks):
    # GIVEN rank 1, forked in a measured cell, holding three segments on its cuda:1
    pid, truth = _in_cell(ip, ranks, 1)
    want = _segments(truth, 1)
    assert len(want) == 3
    # WHEN the kernel asks for its map
    t = time.monotonic()
    _, texts, cap = run(ip, "%gpumem segments --rank 1")
    took = time.monotonic() - t
    # THEN the map is rank 1's own allocator's, titled with it, to the byte
    assert took < 1.5, took  # the worker answers at its next tick (0.25 s)
    (text,) = texts
    assert text.startswith(f"rank 1 (pid {pid} on {HOST}) cuda:1: 3 segment(s) hold "), text
    reserved = sum(size for _, size in want)
    assert f"hold {format_bytes(reserved)}: allocated {format_bytes(LIVE)}" in text
    lines = [line.strip() for line in text.splitlines() if " @0x" in line]
    assert len(lines) == len(want)
    for address, size in want:
        start = f"large {format_bytes(size)} @{address:#x}:"
        assert any(line.startswith(start) for line in lines), (
            address,
            size,
            text,
        )
    assert "free pieces in segments with live blocks: 1 (512.00 MiB)" in text
    assert "largest free block 1.50 GiB" in text
    html = cap.outputs[0].data["text/html"]
    assert f"rank 1 (pid {pid} on {HOST}) cuda:1: 3 segment(s)" in html and "<svg" in html
    # nothing left behind: the request was taken, the answer read once and deleted
    assert _channel_files() == []
    # --device, --max and --all combine with it as with the kernel's own map
    _, texts, _ = run(ip, "%gpumem segments --rank 1 --device 1 --max 1")
    assert "2 smaller segment(s) not drawn" in texts[0]
    assert sum(" @0x" in line for line in texts[0].splitlines()) == 1
    _, texts, _ = run(ip, "%gpumem segments --rank 1 --max 1 --all")
    assert sum(" @0x" in line for line in texts[0].splitlines()) == 3
    _, texts, cap = run(ip, "%gpumem segments --rank 1 -d 0")
    assert texts == []
    assert cap.stdout.strip() == (
        f"gpumem: rank 1 (pid {pid}) has no device cuda:0 (it uses: cuda:1)"
    )
    _, texts, _ = run(ip, f"%gpumem segments --pid {pid}")
    assert texts[0].startswith(f"rank 1 (pid {pid} on {HOST}) cuda:1")


def test_the_protocols_segments_with_rank(ip, ranks):
    from jupyter_gpumem._ipython import current
    from jupyter_gpumem.protocol.handler import Handler
    from jupyter_gpumem.protocol.stream import SampleStream
    from tests.test_protocol import ListChannel, check

    pid, truth = _in_cell(ip, ranks, 1)
    session = current()
    stream = SampleStream(session.collector, ListChannel())
    h = Handler(session, stream)

    def req(**args):
        reply = h.handle({"protocol": 1, "action": "segments", "args": args})
        check(reply, "reply")
        if reply["status"] == "ok":
            check(reply["result"], "results/segments")
        return reply

    try:
        reply = req(rank=1)
        assert reply["status"] == "ok", reply
        result = reply["result"]
        assert result["worker"] == {
            "pid": pid,
            "rank": 1,
            "host": HOST,
            "label": f"rank 1 (pid {pid})",
            "note": "",
            "trimmed": False,
        }
        (m,) = result["devices"]
        assert m["device"] == 1
        got = sorted((s["address"], s["size"]) for s in m["segments"])
        assert got == _segments(truth, 1)
        # each block, to the byte, as the worker's own snapshot has it
        blocks = {
            s["address"]: [(s["address"] + b[0], b[1], b[2]) for b in s["blocks"]]
            for s in m["segments"]
        }
        for s in truth["segments"]:
            whole = all(b["state"] == "inactive" for b in s["blocks"])
            assert blocks[s["address"]] == [
                (
                    b["address"],
                    b["size"],
                    "allocated"
                    if b["state"] == "active_allocated"
                    else "cached"
                    if whole
                    else "piece",
                )
                for b in s["blocks"]
            ]
        assert req(rank=1, pid=pid)["status"] == "ok"
        refused = req(rank=7)
        assert refused["error"]["code"] == "refused"
        assert refused["error"]["message"] == (
            "no worker process with rank 7 has reported (ranks reporting: 1)"
        )
        assert req(rank=1, device=0)["error"]["message"].endswith(
            "has no device cuda:0 (it uses: cuda:1)"
        )
        assert req(rank=-1)["error"]["code"] == "bad_request"
        assert req(pid=0)["error"]["code"] == "bad_request"
    finally:
        stream.stop()


def test_a_stopped_worker_is_named_within_2_s(ip, ranks):
    pid, _ = _in_cell(ip, ranks, 1)
    os.kill(pid, signal.SIGSTOP)
    try:
        t = time.monotonic()
        _, texts, cap = run(ip, "%gpumem segments --rank 1")
        took = time.monotonic() - t
    finally:
        os.kill(pid, signal.SIGCONT)
    assert texts == []
    assert cap.stdout.strip() == f"gpumem: rank 1 (pid {pid}) did not answer within 2 s"
    assert 1.9 < took < 3.0, took
    assert _channel_files() == []  # the request nobody took is deleted
    # running again, it answers the next request
    _, texts, _ = run(ip, "%gpumem segments --rank 1")
    assert texts[0].startswith(f"rank 1 (pid {pid} on {HOST}) cuda:1")


def _report(pid: int, rank: int | None, via: str = "fork", host: str = HOST, final=False):
    return {
        "v": 1,
        "pid": pid,
        "host": host,
        "rank": rank,
        "world_size": 8,
        "started": time.time(),
        "time": time.time(),
        "final": final,
        "via": via,
        "devices": [
            {
                "index": 0,
                "name": "Counting GPU",
                "allocated": GiB,
                "reserved": GiB,
                "peak_allocated": GiB,
                "peak_reserved": GiB,
                "ooms": 0,
                "device_allocs": 1,
            }
        ],
        "ooms": [],
    }


def test_a_worker_that_never_ticks_is_named_within_2_s(ip):
    # GIVEN a live process that reported as rank 5 (a datagram) but has no reporter
    run(ip, "%%gpumem -q\npass")  # the channel is open
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.sendto(json.dumps(_report(sleeper.pid, 5)).encode(), workers.channel().address)
        assert _wait(lambda: any(w.pid == sleeper.pid for w in workers.live()))
        t = time.monotonic()
        _, texts, cap = run(ip, "%gpumem segments --rank 5")
        assert texts == []
        took = time.monotonic() - t
    finally:
        sleeper.kill()
        sleeper.wait()
    assert cap.stdout.strip() == f"gpumem: rank 5 (pid {sleeper.pid}) did not answer within 2 s"
    assert took < 3.0, took
    assert _channel_files() == []


def test_each_worker_that_cant_be_asked_gets_a_sentence(ip):
    run(ip, "%%gpumem -q\npass")
    ch = workers.channel()

    def said(line: str) -> str:
        _, texts, cap = run(ip, line)
        assert texts == []  # no map, no traceback: one sentence
        assert cap.stderr == ""
        (out,) = cap.stdout.strip().splitlines()
        return out

    assert said("%gpumem segments --rank 3") == (
        "gpumem: no worker process has reported: processes forked by a measured cell report "
        "by themselves, spawned ones after jupyter_gpumem.report_worker()"
    )
    me = os.getpid()  # a live pid: the worker's status is the report's, not its process's
    ch.take(_report(4_000_001, 2, final=True))
    ch.take(_report(4_000_002, 3, via="store", host="node-b"))
    ch.take(_report(4_000_003, 4, via="ray", host="node-c"))
    ch.take(_report(4_000_004, 6))  # no such process, no last report
    ch.take(_report(me, None))
    assert said("%gpumem segments --rank 9") == (
        "gpumem: no worker process with rank 9 has reported (ranks reporting: 2, 3, 4, 6)"
    )
    assert said("%gpumem segments --rank 2") == (
        "gpumem: rank 2 (pid 4000001) has exited: its allocator is gone"
    )
    assert said("%gpumem segments --rank 3") == (
        "gpumem: rank 3 (pid 4000002) on node-b reports through the torch.distributed store, "
        "which shares no directory with this kernel: its segments can't be asked for from here"
    )
    assert said("%gpumem segments --rank 4") == (
        "gpumem: ray rank 4 (pid 4000003 on node-c) is a Ray worker, which shares no "
        "directory with this kernel: its segments can't be asked for from here"
    )
    assert said("%gpumem segments --rank 6") == (
        "gpumem: rank 6 (pid 4000004) is gone: its process ended without a last report"
    )
    assert said("%gpumem segments --pid 4000009") == (
        "gpumem: no worker process with pid 4000009 has reported"
    )
    assert said("%gpumem segments --rank 3 --pid 4000001") == (
        "gpumem: pid 4000001 reports rank 2, not rank 3"
    )
    with pytest.raises(Exception, match="must not be negative"):
        ip.run_line_magic("gpumem", "segments --rank -1")


def test_two_jobs_with_one_rank_number(ip, ranks):
    """The most recently started live worker of the rank, said so; --pid picks another."""
    first, _ = _in_cell(ip, ranks, 1)
    second, _ = _in_cell(ip, ranks, 1)
    _, texts, cap = run(ip, "%gpumem segments --rank 1")
    assert cap.stdout.strip() == (
        f"gpumem: 2 live worker processes report rank 1 (pids {first}, {second}): this is "
        f"pid {second}, the most recently started (--pid picks another)"
    )
    assert texts[0].startswith(f"rank 1 (pid {second} on {HOST})")
    _, texts, cap = run(ip, f"%gpumem segments --pid {first}")
    assert cap.stdout == "" and texts[0].startswith(f"rank 1 (pid {first} on {HOST})")


def test_two_callers_share_one_request(ip, ranks):
    """The panel (control thread) and a magic (shell thread) asking at once: one request
    file per worker, so the second waits for the first's answer."""
    _, truth = _in_cell(ip, ranks, 1)
    got: list = []

    def ask():
        got.append(workers.segments_of(1))

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(5)
    assert len(got) == 3
    for found in got:
        mine = sorted((s["address"], s["total_size"]) for s in found.snapshot.segments)
        assert mine == _segments(truth, 1)


# -- hostile files -------------------------------------------------------------------------
NONCE = "0123456789abcdef" * 2


class FakeBackend:
    def __init__(self, raw):
        self.raw = raw

    def cuda_ready(self):
        return self.raw is not None

    def raw_snapshot(self):
        return self.raw


def _raw() -> dict:
    base = 1 << 44
    return {
        "segments": [
            {
                "device": 2,
                "address": base,
                "total_size": 8 * MiB,
                "stream": 7,
                "segment_type": "large",
                "blocks": [
                    {
                        "address": base,
                        "size": 3 * MiB,
                        "requested_size": 3 * MiB - 5,
                        "state": "active_allocated",
                    },
                    {
                        "address": base + 3 * MiB,
                        "size": 5 * MiB,
                        "requested_size": 0,
                        "state": "inactive",
                    },
                ],
            }
        ]
    }


def _answer_file(d, pid, nonce=NONCE):
    return os.path.join(d, segment_requests.answer_name(pid, nonce))


def test_hostile_answer_files_are_dropped(tmp_path, monkeypatch, caplog):
    """A same-user process plants files where the kernel looks for the answer: each is
    read once (or refused unread), deleted, never shown, and the real answer that comes
    after them is."""
    caplog.set_level(logging.DEBUG, logger="jupyter_gpumem")
    monkeypatch.setattr(segment_requests, "_nonce", lambda: NONCE)
    d, pid = str(tmp_path), 4321
    (tmp_path / "target.json").write_text("{}")
    real = segment_requests.segments_answer(_raw(), NONCE, pid)
    hostile = [
        ("symlink", None),
        ("oversize", b" " * (oom.SNAPSHOT_LIMIT + 1)),
        ("bad JSON", b"{not json"),
        ("stale nonce", segment_requests.segments_answer(_raw(), "f" * 32, pid)),
        ("another pid", segment_requests.segments_answer(_raw(), NONCE, pid + 1)),
        (
            "block outside",
            json.dumps(
                {
                    "v": 1,
                    "nonce": NONCE,
                    "pid": pid,
                    "trimmed": False,
                    "devices": [[0, [[0, 1, False, "l", [[5, 9, "a"]]]]]],
                }
            ).encode(),
        ),
        ("unknown error", json.dumps({"v": 1, "nonce": NONCE, "pid": pid, "error": "x"}).encode()),
    ]
    # files of earlier requests and of other names: deleted unread, or never read
    stale = os.path.join(d, segment_requests.answer_name(pid, "e" * 32))
    with open(stale, "wb") as f:
        f.write(segment_requests.segments_answer(_raw(), "e" * 32, pid))
    other = os.path.join(d, segment_requests.answer_name(pid + 1, NONCE))
    with open(other, "wb") as f:
        f.write(b"not ours")
    seen: list[str] = []

    def worker():  # plants each hostile file, waits until the kernel took it, then answers
        req = os.path.join(d, segment_requests.request_name(pid))
        assert _wait(lambda: os.path.exists(req), 2)
        os.unlink(req)
        path = _answer_file(d, pid)
        for what, data in hostile:
            if data is None:
                os.symlink(tmp_path / "target.json", path)
            else:
                with open(path + ".tmp", "wb") as f:
                    f.write(data)
                os.rename(path + ".tmp", path)
            assert _wait(lambda: not os.path.lexists(path), 1), what
            seen.append(what)
        oom.write_file(d, os.path.basename(path), real)

    th = threading.Thread(target=worker)
    th.start()
    answer = segment_requests.ask_segments(d, pid)
    th.join()
    assert seen == [w for w, _ in hostile]
    assert answer is not None and answer.error is None and not answer.trimmed
    snap = answer.snapshot
    assert snap is not None
    (seg,) = snap.segments
    assert (seg["device"], seg["address"], seg["total_size"], seg["stream"]) == (
        2,
        1 << 44,
        8 * MiB,
        7,
    )
    assert [(b["size"], b["requested_size"], b["state"]) for b in seg["blocks"]] == [
        (3 * MiB, 3 * MiB - 5, "active_allocated"),
        (5 * MiB, 0, "inactive"),
    ]
    assert sorted(os.listdir(d)) == sorted(["target.json", os.path.basename(other)])
    for why in (
        "bytes long",
        "not JSON",
        "another request",
        "another process",
        "outside its segment",
        "bad error",
    ):
        assert why in caplog.text, why
    assert "segments answer" in caplog.text and "refused" in caplog.text


def test_hostile_requests_get_no_answer(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="jupyter_gpumem")
    d, pid = str(tmp_path), 4321
    watch = segment_requests.RequestWatch(d, pid, FakeBackend(_raw()))
    req = os.path.join(d, segment_requests.request_name(pid))
    assert watch.poll() is False  # nothing asked: one access() call
    (tmp_path / "target.json").write_text(json.dumps({"v": 1, "nonce": NONCE}))
    bad = {
        "symlink": None,
        "oversize": json.dumps({"v": 1, "nonce": NONCE, "pad": "x" * 300}).encode(),
        "bad JSON": b"{",
        "bad nonce": json.dumps({"v": 1, "nonce": "../../x"}).encode(),
        "old version": json.dumps({"v": 2, "nonce": NONCE}).encode(),
    }
    for what, data in bad.items():
        if data is None:
            os.symlink(tmp_path / "target.json", req)
        else:
            with open(req, "wb") as f:
                f.write(data)
        assert watch.poll() is False, what
        assert not os.path.lexists(req), what  # read once, deleted
    assert sorted(os.listdir(d)) == ["target.json"]  # no answer written; the target kept
    oom.write_file(
        d, segment_requests.request_name(pid), json.dumps({"v": 1, "nonce": NONCE}).encode()
    )
    assert watch.poll() is True
    assert sorted(os.listdir(d)) == [segment_requests.answer_name(pid, NONCE), "target.json"]
    assert os.stat(_answer_file(d, pid)).st_mode & 0o777 == 0o600


def test_an_answer_too_large_is_trimmed_then_refused(monkeypatch):
    raw = _raw()
    base = 1 << 44
    blocks = [
        {
            "address": base + i * 4096,
            "size": 4096,
            "requested_size": 4096,
            "state": "active_allocated",
        }
        for i in range(2048)
    ]
    raw["segments"][0]["blocks"] = blocks
    full = segment_requests.segments_answer(raw, NONCE, 1)
    monkeypatch.setattr(segment_requests, "SNAPSHOT_LIMIT", len(full) - 1)
    trimmed = segment_requests.parse_answer(
        segment_requests.segments_answer(raw, NONCE, 1), NONCE, 1
    )
    assert trimmed is not None and trimmed.trimmed and trimmed.snapshot is not None
    (seg,) = trimmed.snapshot.segments
    assert [(b["size"], b["state"]) for b in seg["blocks"]] == [(2048 * 4096, "active_allocated")]
    monkeypatch.setattr(segment_requests, "SNAPSHOT_LIMIT", 100)
    too_large = segment_requests.parse_answer(
        segment_requests.segments_answer(raw, NONCE, 1), NONCE, 1
    )
    assert too_large is not None and too_large.error == "too_large"
    no_cuda = segment_requests.parse_answer(
        segment_requests.segments_answer(None, NONCE, 1), NONCE, 1
    )
    assert no_cuda is not None and no_cuda.error == "no_cuda"


def test_the_refusals_of_an_answer_in_words(monkeypatch):
    ch = workers.WorkerChannel()
    ch.open()
    try:
        ch.take(_report(os.getpid(), 1))
        for error, words in (
            ("no_cuda", "has not initialised CUDA: its allocator holds no segment"),
            ("too_large", "snapshot is too large to hand over (over 4 MiB even with its live"),
        ):
            monkeypatch.setattr(
                kernel_channel,
                "ask_segments",
                lambda *a, e=error: segment_requests.Answer(None, error=e),
            )
            with pytest.raises(ActionRefused, match=r"^rank 1 \(pid \d+\)('s)? " + words[:20]):
                ch.segments_of(1)
    finally:
        ch.close()


def test_no_request_costs_a_worker_one_syscall(tmp_path):
    """What a worker's tick pays when nobody asks: one access() call (~1 µs here)."""
    watch = segment_requests.RequestWatch(str(tmp_path), 4321, FakeBackend(None))
    n = 20_000
    t = time.perf_counter()
    for _ in range(n):
        watch.poll()
    per = (time.perf_counter() - t) / n
    assert per < 50e-6, per  # loose: shared CI machines; measured ~1 µs


def test_a_worker_collector_answers_from_its_reporter(tmp_path, monkeypatch):
    """The reporter thread of a real WorkerReporter answers (no fork: the sender is a
    stand-in with the channel's directory)."""
    monkeypatch.setenv("JUPYTER_GPUMEM_BACKEND", COUNTING)
    monkeypatch.setattr(counting, "_state", counting._State())  # this test's allocator

    class Sender:
        directory = str(tmp_path)

        def __call__(self, msg, final):
            return True

    counting.allocate(3 * MiB, device=3)
    reporter = workers.WorkerReporter(Sender(), "spawn")
    try:
        answer = segment_requests.ask_segments(str(tmp_path), os.getpid())
    finally:
        reporter.final()
    assert answer is not None and answer.snapshot is not None
    mine = [(s["address"], s["total_size"]) for s in counting.snapshot()["segments"]]
    assert [(s["address"], s["total_size"]) for s in answer.snapshot.segments] == mine
    assert [s["device"] for s in answer.snapshot.segments] == [3]


def _forged(size: int, blocks: list[tuple[int, int]]) -> dict:
    """A raw snapshot of one segment at 2**44 of ``size`` bytes with free blocks at
    (offset, size)."""
    base = 1 << 44
    return {
        "segments": [
            {
                "device": 0,
                "address": base,
                "total_size": size,
                "segment_type": "large",
                "blocks": [
                    {"address": base + at, "size": n, "requested_size": 0, "state": "inactive"}
                    for at, n in blocks
                ],
            }
        ]
    }


@pytest.mark.parametrize(
    ("size", "blocks", "why"),
    [
        # a segment of 1 TiB with one block of 1 B: drawn once as "free 1.00 TiB, largest
        # free block 1 B"
        (1 << 40, [(0, 1)], "its blocks cover 1 B of a segment of 1.00 TiB"),
        (3 * MiB, [(0, MiB), (2 * MiB, MiB)], "its blocks cover 2.00 MiB of a segment of 3.00 MiB"),
        (MiB, [(0, MiB), (MiB, 0)], "a block of 0 B"),
        (0, [], "a segment of 0 B"),
    ],
)
def test_a_snapshot_whose_blocks_do_not_cover_its_segment_is_refused_in_words(size, blocks, why):
    segs = oom.reduce_segments(_forged(size, blocks), 0, detail=True)
    with pytest.raises(oom.BadFile) as bad:
        oom.parse_segments(segs, 0, [0])
    assert str(bad.value) == why
    # the worker answers with it: the kernel refuses it and says why, in one sentence
    ch = workers.WorkerChannel()
    ch.open()
    assert ch.address is not None
    pid = os.getpid()
    watch = segment_requests.RequestWatch(
        os.path.dirname(ch.address), pid, FakeBackend(_forged(size, blocks))
    )
    stop = threading.Event()

    def answer():
        while not stop.is_set():
            watch.poll()
            time.sleep(0.01)

    th = threading.Thread(target=answer)
    th.start()
    try:
        ch.take(_report(pid, 1))
        with pytest.raises(ActionRefused) as refused:
            ch.segments_of(1, wait=0.5)
        assert str(refused.value) == f"rank 1 (pid {pid})'s answer was refused: {why}"
    finally:
        stop.set()
        th.join()
        ch.close()
