"""The panel protocol through a real ipykernel (jupyter_client), while a cell runs.

The kernel replays allocator readings recorded on an H200 (JUPYTER_GPUMEM_REPLAY, a
test-only switch); on a GPU machine tests/gpu/test_gpu_protocol.py does the same with real
allocations.
"""

from __future__ import annotations

import os
import queue
import threading
import time

import pytest

from jupyter_gpumem.testing.replay import env as replay_env
from tests.fakes import FIXTURES

pytestmark = pytest.mark.kernel


def start_kernel(extra_env):
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="python3")
    km.start_kernel(env={**os.environ, **extra_env})
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    return km, kc


class Listener:
    """Collects IOPub and control messages with their arrival times, on threads."""

    def __init__(self, kc):
        self.kc = kc
        self.iopub: list[tuple[float, dict]] = []
        self.control: queue.Queue = queue.Queue()
        self.kept: list[tuple[float, dict]] = []  # replies read while waiting for another
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._pump, args=(ch, sink), daemon=True)
            for ch, sink in (
                (kc.iopub_channel, self.iopub.append),
                (kc.control_channel, self.control.put),
            )
        ]
        for t in self.threads:
            t.start()

    def _pump(self, channel, sink):
        while not self.stop.is_set():
            try:
                msg = channel.get_msg(timeout=0.1)
            except queue.Empty:
                continue
            sink((time.monotonic(), msg))

    def send(self, action, **args):
        """Send a request without waiting: (msg_id, time sent)."""
        msg = self.kc.session.msg("gpumem_request", {"protocol": 1, "action": action, "args": args})
        t0 = time.monotonic()
        self.kc.control_channel.send(msg)
        return msg["header"]["msg_id"], t0

    def wait(self, msg_id, t0, timeout=5.0):
        """The reply to one request (replies to others are kept for their own wait)."""
        deadline = t0 + timeout
        while True:
            for i, (t, reply) in enumerate(self.kept):
                if reply["parent_header"].get("msg_id") == msg_id:
                    del self.kept[i]
                    return reply["msg_type"], reply["content"], t - t0, t
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None, None, None, None
            try:
                self.kept.append(self.control.get(timeout=remaining))
            except queue.Empty:
                return None, None, None, None

    def request(self, action, timeout=5.0, **args):
        msg_id, t0 = self.send(action, **args)
        return self.wait(msg_id, t0, timeout)


def stop_kernel(km, kc, listener):
    listener.stop.set()
    for t in listener.threads:
        t.join(timeout=2)
    kc.stop_channels()
    km.shutdown_kernel(now=True)


@pytest.fixture(scope="module")
def kernel():
    km, kc = start_kernel(replay_env(str(FIXTURES)))
    listener = Listener(kc)
    yield kc, listener
    stop_kernel(km, kc, listener)


def wait_execute(kc, code, timeout=30):
    """Run code and return its execute_reply (skipping leftover replies, e.g. to the
    kernel_info requests of wait_for_ready)."""
    msg_id = kc.execute(code)
    deadline = time.monotonic() + timeout
    while True:
        reply = kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply


def test_no_reply_before_the_extension_is_loaded(kernel):
    kc, listener = kernel
    kind, content, _, _ = listener.request("hello", timeout=1.5)
    assert kind is None  # a frontend reads this as "not loaded"
    assert wait_execute(kc, "%load_ext jupyter_gpumem")["content"]["status"] == "ok"
    kind, content, _, _ = listener.request("hello")
    assert kind == "gpumem_reply" and content["status"] == "ok"
    assert content["result"]["sample"]["devices"][0]["name"] == "NVIDIA H200"


def test_actions_and_samples_while_a_cell_runs(kernel):
    kc, listener = kernel
    kind, content, _, _ = listener.request("subscribe", interval_ms=100, client="t1")
    comm_id = content["result"]["stream"]["comm_id"]
    assert content["result"]["stream"]["active"] and comm_id
    assert not [m for _, m in listener.iopub if m["msg_type"] == "comm_open"]  # never sent
    msg_id = kc.execute("import time; time.sleep(3)")
    time.sleep(0.5)
    t_start = time.monotonic()
    kind, content, rtt, _ = listener.request("empty_cache")
    assert kind == "gpumem_reply" and content["status"] == "ok"
    assert content["result"]["released"]["0"] >= 0
    assert rtt < 1.0
    kind, content, _, _ = listener.request("set_caching", enabled=1)  # bad request
    assert content["status"] == "error" and content["error"]["code"] == "bad_request"
    kind, content, _, _ = listener.request("no_such_action")
    assert content["error"]["code"] == "unknown_action"
    reply = kc.get_shell_msg(timeout=10)
    t_reply = time.monotonic()
    assert reply["parent_header"]["msg_id"] == msg_id and reply["content"]["status"] == "ok"
    pushed = [
        (t, m)
        for t, m in listener.iopub
        if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == comm_id
    ]
    during = [m for t, m in pushed if t_start - 0.5 <= t < t_reply]
    kinds = [m["content"]["data"]["type"] for m in during]
    assert kinds.count("sample") >= 2, kinds  # live while busy
    # the kernel keeps working after the bad requests
    kind, content, _, _ = listener.request("sample")
    assert content["status"] == "ok"
    assert wait_execute(kc, "1 + 1")["content"]["status"] == "ok"


def test_cell_marker_pushed(kernel):
    kc, listener = kernel
    _kind, content, _, _ = listener.request("subscribe", interval_ms=1000, client="t1")
    comm_id = content["result"]["stream"]["comm_id"]
    wait_execute(kc, "%%gpumem -q\nq = 1")
    time.sleep(0.3)
    cells = [
        m["content"]["data"]["cell"]
        for _, m in listener.iopub
        if m["msg_type"] == "comm_msg"
        and m["content"]["comm_id"] == comm_id
        and m["content"]["data"]["type"] == "cell"
    ]
    assert cells and cells[-1]["first_line"] == "q = 1"
    _, content, _, _ = listener.request("unsubscribe", client="t1")
    assert content["result"]["stream"]["active"] is False


def test_unload_removes_the_handler(kernel):
    kc, listener = kernel
    wait_execute(kc, "%unload_ext jupyter_gpumem")
    kind, _, _, _ = listener.request("hello", timeout=1.5)
    assert kind is None
    wait_execute(kc, "%load_ext jupyter_gpumem")
    assert listener.request("hello")[0] == "gpumem_reply"


def test_namespace_requests_wait_for_the_cell_and_run_between_cells(kernel):
    """`who` and `release_traceback` read the namespace: while a cell runs they answer
    `busy` at once; between cells they run on the shell thread (here the replay kernel
    answers `who` from attribution.json, recorded on a GPU; release_traceback clears the
    failed cell's frames)."""
    kc, listener = kernel
    msg_id = kc.execute("import time; time.sleep(2)")
    time.sleep(0.5)
    _, content, rtt, _ = listener.request("who")
    assert content["status"] == "error" and content["error"]["code"] == "busy"
    assert content["error"]["message"] == "busy: available when the cell ends"
    assert rtt < 1.0
    _, content, _, _ = listener.request("release_traceback")
    assert content["error"]["code"] == "busy"
    reply = kc.get_shell_msg(timeout=10)
    assert reply["parent_header"]["msg_id"] == msg_id
    import json

    from tests.fakes import FIXTURES

    truth = json.loads((FIXTURES.parent / "attribution.json").read_text())["cells"]["truth"]
    _, content, _, _ = listener.request("track", enabled=True)
    assert content["result"] == {
        "tracking": {"active": True, "wanted": True},
        "message": "allocation tracking is on (recorded data)",
    }
    _, content, _, _ = listener.request("who", n=50)
    assert content["status"] == "ok", content
    result = content["result"]
    rows = {r["key"]: r["bytes"] for r in result["devices"][0]["by_variable"]["rows"]}
    assert rows["a"] == truth["owners"]["a|tensor"] and rows["base"] == 64 << 20
    by_line = result["devices"][0]["by_line"]
    assert sum(r["bytes"] for r in by_line["rows"]) == by_line["allocated"]
    assert result["postmortems"][0]["fixes"][0]["kind"] == "fragmentation"
    _, content, _, _ = listener.request("segments", max_segments=2)
    seg = content["result"]["devices"][0]
    assert seg["segments"][0]["size"] == 1 << 30
    assert seg["omitted"] == seg["summary"]["segments"] - 2
    assert sum(1 for b in seg["segments"][0]["blocks"] if b[2] == "piece") == 8
    wait_execute(kc, "%%gpumem -q\nhistory_probe = 1")
    _, content, _, _ = listener.request("history", n=1)
    assert [c["first_line"] for c in content["result"]["cells"]] == ["history_probe = 1"]
    _, content, _, _ = listener.request("who", n=0)
    assert content["error"]["code"] == "bad_request"
    failed = wait_execute(kc, "def g():\n    big = list(range(10))\n    raise ValueError\ng()")
    assert failed["content"]["status"] == "error"
    _, content, _, _ = listener.request("release_traceback")
    assert content["status"] == "ok" and content["result"]["frames"] == 1
    assert (
        wait_execute(kc, "import sys; assert not hasattr(sys, 'last_traceback')")["content"][
            "status"
        ]
        == "ok"
    )
    _, content, _, _ = listener.request("track", enabled=False)
    assert content["result"]["tracking"] == {"active": False, "wanted": False}
    _, content, _, _ = listener.request("who")
    assert content["result"]["devices"][0]["by_line"] is None  # no sites without tracking


def test_a_slow_namespace_walk_does_not_hold_samples(kernel):
    """ipykernel handles one control message at a time: a `who` that waited there for its
    walk would hold a `sample` sent meanwhile. The walk runs on the shell thread and the
    control thread answers the sample at once."""
    kc, listener = kernel
    slow = (
        "import time as _t\n"
        "from jupyter_gpumem._ipython import current as _c\n"
        "_a = _c().who\n"
        "_orig_read = _a.read\n"
        "def _slow_read(*a, **k):\n"
        "    _t.sleep(2)\n"
        "    return _orig_read(*a, **k)\n"
        "_a.read = _slow_read\n"
    )
    assert wait_execute(kc, slow)["content"]["status"] == "ok"
    try:
        who_id, who_t0 = listener.send("who")
        time.sleep(0.2)  # the walk has started on the shell thread
        kind, content, rtt, t_sample = listener.request("sample", timeout=5)
        assert kind == "gpumem_reply" and content["status"] == "ok"
        assert rtt < 0.5, f"the sample waited {rtt:.2f} s behind the walk"
        kind, content, rtt_who, t_who = listener.wait(who_id, who_t0, timeout=15)
        assert content["status"] == "ok", content
        assert 2.0 <= rtt_who < 10 and t_sample < t_who  # answered when the walk ended
    finally:
        assert wait_execute(kc, "_a.read = _orig_read")["content"]["status"] == "ok"


# A process that reported as rank 5 (one datagram, like a worker's first report) but has
# no reporter thread: it never answers a request for its segments.
SILENT_RANK = """\
import json as _j, socket as _so, subprocess as _sp, time as _t
from jupyter_gpumem.collectors import workers as _w
_sleeper = _sp.Popen(["sleep", "60"])
_G = 1 << 30
_r = {"v": 1, "pid": _sleeper.pid, "host": _so.gethostname(), "rank": 5, "world_size": 8,
      "started": _t.time(), "time": _t.time(), "final": False, "via": "fork",
      "devices": [{"index": 0, "name": "Counting GPU", "allocated": _G, "reserved": _G,
                   "peak_allocated": _G, "peak_reserved": _G, "ooms": 0,
                   "device_allocs": 1}], "ooms": []}
_s = _so.socket(_so.AF_UNIX, _so.SOCK_DGRAM)
_s.sendto(_j.dumps(_r).encode(), _w.channel().address)
_d = _t.monotonic() + 10
while not any(w.pid == _sleeper.pid for w in _w.live()) and _t.monotonic() < _d:
    _t.sleep(0.01)
assert any(w.pid == _sleeper.pid for w in _w.live())
"""


def test_a_segments_request_to_a_silent_worker_does_not_hold_samples(kernel):
    """A worker's segments wait up to 2 s for its answer: off the control thread, so a
    `sample` sent behind three such requests is answered at once, and each request is
    answered when the wait ends (the three share one ask of the worker)."""
    kc, listener = kernel
    assert wait_execute(kc, "%load_ext jupyter_gpumem")["content"]["status"] == "ok"
    assert wait_execute(kc, "%%gpumem -q\npass")["content"]["status"] == "ok"  # the channel
    assert wait_execute(kc, SILENT_RANK)["content"]["status"] == "ok"
    try:
        pid = _user_value(kc, "_sleeper.pid")
        asked = [listener.send("segments", rank=5) for _ in range(3)]
        time.sleep(0.2)
        kind, content, rtt, t_sample = listener.request("sample", timeout=10)
        assert kind == "gpumem_reply" and content["status"] == "ok"
        assert rtt < 0.5, f"the sample waited {rtt:.2f} s behind the segments requests"
        for i, (msg_id, t0) in enumerate(asked):
            kind, content, waited, t_answer = listener.wait(msg_id, t0, timeout=15)
            assert kind == "gpumem_reply", i
            assert content["error"] == {
                "code": "refused",
                "message": f"rank 5 (pid {pid}) did not answer within 2 s",
            }
            assert 1.9 < waited < 3.5 and t_sample < t_answer
    finally:
        assert wait_execute(kc, "_sleeper.kill(); _sleeper.wait()")["content"]["status"] == "ok"


def _user_value(kc, expression: str):
    msg_id = kc.execute("", user_expressions={"v": expression})
    while True:
        reply = kc.get_shell_msg(timeout=10)
        if reply["parent_header"].get("msg_id") == msg_id:
            return int(reply["content"]["user_expressions"]["v"]["data"]["text/plain"])
