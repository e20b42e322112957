"""Hostile input: a worker's report is read, never trusted, and scan arguments fail fast.

Any process of this user can send anything to the kernel's worker channel; each case here
is one a probe found to break the channel's thread or everything that shows workers
(``%gpumem workers``, ``%gpumem``, a cell's report, the history, the protocol's
``sample``/``hello`` replies). Each test sends the bad report, then a valid one, and checks
that the valid one arrives through the channel's own thread and that every consumer
still renders. The scan and device cases check that a bad argument is a short UsageError.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import threading
import time

import pytest
from IPython.core.error import UsageError

from jupyter_gpumem.collectors import workers
from jupyter_gpumem.collectors.workers import kernel_channel
from tests.conftest import run
from tests.test_workers import good_message

BIG = 10**400  # an int no byte figure can be (and no float can hold)


# -- helpers -------------------------------------------------------------------------------
@pytest.fixture
def channel(ip):
    """The kernel's worker channel, open, in a shell with the extension loaded (unloading
    it closes the channel)."""
    ch = workers.channel()
    assert ch.open() is not None
    return ch


def send(address: str, *datagrams: bytes) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        for d in datagrams:
            s.sendto(d, address)
    finally:
        s.close()


def encoded(msg: dict) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode()


def alive_report(**kw) -> bytes:
    """A valid, running worker's report: this process stands in for the worker (alive,
    on this host), so it is listed in every view until the channel closes."""
    return encoded(good_message(pid=os.getpid(), final=False, rank=3, **kw))


def wait_listed(ch: workers.WorkerChannel, pid: int, timeout: float = 10.0) -> None:
    """Wait until the channel's *thread* took a report of ``pid``: ``live`` reads what it
    kept and drains nothing, so only a living receiving thread gets it there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(w.pid == pid for w in ch.live()):
            return
        time.sleep(0.01)
    raise AssertionError(f"no report of pid {pid} arrived: is the channel's thread alive?")


def receiving_thread_alive() -> bool:
    return any(t.name == "gpumem-workers" and t.is_alive() for t in threading.enumerate())


def protocol_replies_encode(pid: int) -> None:
    """``sample`` and ``hello`` answer ok, list the worker, and encode as the kernel's
    session sends them (jupyter_client's packer: UTF-8, no NaN)."""
    from jupyter_client.session import json_packer

    from jupyter_gpumem._ipython import current
    from jupyter_gpumem.protocol.handler import Handler
    from jupyter_gpumem.protocol.stream import SampleStream
    from tests.test_protocol import ListChannel

    session = current()
    stream = SampleStream(session.collector, ListChannel())
    try:
        handler = Handler(session, stream)
        for action in ("sample", "hello"):
            reply = handler.handle({"protocol": 1, "action": action, "args": {}})
            assert reply["status"] == "ok", reply
            json_packer(reply)  # raises where the kernel's send would
            listed = reply["result"]["sample"].get("workers", [])
            assert pid in [w["pid"] for w in listed]
    finally:
        stream.stop()


def everything_renders(ip, pid: int) -> None:
    """Every view of workers works and lists the valid worker ``pid``."""
    label = f"rank 3 (pid {pid})"
    res, texts, _ = run(ip, "%gpumem workers")
    assert res.success and label in texts[0]
    res, texts, _ = run(ip, "%gpumem")
    assert res.success and label in texts[0]
    protocol_replies_encode(pid)
    res, texts, cap = run(ip, "%%gpumem\npass\n")
    assert res.success and "warning" not in cap.stderr
    assert "worker processes (1)" in texts[0] and label in texts[0]
    res, texts, cap = run(ip, "%gpumem history")
    assert res.success and "warning" not in cap.stderr
    assert label in texts[0]


def bad_device(**kw) -> dict:
    return {**good_message()["devices"][0], **kw}


# -- the worker channel ----------------------------------------------------------------------
def test_a_deeply_nested_datagram_does_not_kill_the_receiving_thread(ip, channel):
    send(channel.address, b"[" * 4000 + b"]" * 4000, b'{"a":' * 3000 + b"1" + b"}" * 3000)
    send(channel.address, alive_report())
    wait_listed(channel, os.getpid())
    assert receiving_thread_alive()
    assert [w.pid for w in channel.live()] == [os.getpid()]
    everything_renders(ip, os.getpid())


def test_a_pid_beyond_any_os_is_dropped_and_liveness_never_raises(ip, channel):
    bad = encoded(good_message(pid=2**70, final=False))
    send(channel.address, bad, alive_report())
    wait_listed(channel, os.getpid())
    assert [w.pid for w in channel.live()] == [os.getpid()]
    everything_renders(ip, os.getpid())
    # the liveness check itself, should such a pid ever reach it
    host = socket.gethostname()
    assert kernel_channel._alive(2**70, host) is False
    assert kernel_channel._alive(-(2**70), host) is False


@pytest.mark.parametrize(
    "bad",
    [
        good_message(final=False, devices=[bad_device(allocated=BIG)]),
        good_message(final=False, devices=[bad_device(peak_allocated=2**64)]),
        good_message(final=False, devices=[bad_device(device_allocs=BIG)]),
        good_message(final=False, ooms=[[0, BIG, 2**30, 2**20]]),
    ],
    ids=["allocated", "peak-2**64", "count", "oom-request"],
)
def test_a_byte_figure_beyond_any_device_is_dropped(ip, channel, bad):
    send(channel.address, encoded(bad), alive_report())
    wait_listed(channel, os.getpid())
    assert [w.pid for w in channel.live()] == [os.getpid()]
    everything_renders(ip, os.getpid())
    run(ip, "%%gpumem\npass\n")
    res, texts, _ = run(ip, "%gpumem history")  # still renders: nothing to --clear
    assert res.success and texts


def test_a_byte_figure_that_reached_the_history_still_renders():
    """A consumer's own defence: a size no float holds still formats."""
    from jupyter_gpumem.units import format_bytes, format_delta

    assert format_bytes(BIG).endswith(" B") and format_delta(-BIG).startswith("-")
    assert len(format_bytes(BIG)) < 80


@pytest.mark.parametrize("where", ["host", "name"])
def test_a_lone_surrogate_in_a_name_is_replaced_and_replies_encode(ip, channel, where):
    if where == "host":
        report = alive_report(host="gpu\ud800node")
    else:
        report = alive_report(devices=[bad_device(name="H100\udfff")])
    send(channel.address, report)
    wait_listed(channel, os.getpid())
    (w,) = channel.live()
    (w.host + w.devices[0].name).encode("utf-8")  # encodable: the surrogate is replaced
    assert "\ufffd" in w.host + w.devices[0].name
    everything_renders(ip, os.getpid())


@pytest.mark.parametrize(
    "bad",
    [
        b"[" * 100_000,
        b"{" * 8000,
        b'"' + b"\\ud800" * 1000 + b'"',
        encoded(good_message(host="h" * 10_000)),
        encoded(good_message(host=7)),
        encoded(good_message(v=True)),
        encoded(good_message(pid=0)),
        encoded(good_message(pid=2**22)),
        encoded(good_message(pid=-1)),
        encoded(good_message(rank=2**70)),
        encoded(good_message(world_size=-1)),
        json.dumps(good_message(started=float("nan"))).encode(),
        json.dumps(good_message(time=float("inf"))).encode(),
        b'{"v":1,"started":1e400}',
        encoded(good_message(started=BIG)),
        encoded(good_message(devices=[bad_device(index=2**70)])),
        encoded(good_message(devices=[bad_device(name=["x"])])),
        encoded(good_message(devices=[bad_device(reserved=1.5)])),
        encoded(good_message(devices=[bad_device(ooms=True)])),
        encoded(good_message(devices=[{"index": 0}])),
        encoded(good_message(devices={"0": 1})),
        encoded(good_message(ooms=[[0, 1, 2, -3]])),
        encoded(good_message(ooms=[[0, 1, 2, 3]] * 9)),
        encoded(good_message(ooms=[["0", 1, 2, 3]])),
        b'{"v":1' + b" " * 9000 + b"}",
    ],
)
def test_each_field_is_checked_where_it_arrives(bad):
    assert workers.parse_message(bad) is None


def test_a_valid_report_comes_back_clean():
    m = good_message(host="a\ud800b", extra="ignored", rank=None, world_size=None)
    got = workers.parse_message(encoded(m))
    assert got is not None and "extra" not in got
    assert got["host"] == "a\ufffdb" and got["rank"] is None
    assert got["devices"] == good_message()["devices"]
    assert isinstance(got["started"], float)


def test_every_datagram_failure_is_survived(ip, channel, monkeypatch):
    """Whatever a datagram raises while it is checked, the thread goes on."""
    calls = []
    real = workers.parse_message

    def flaky(data):
        calls.append(data)
        if len(calls) == 1:
            raise MemoryError("a failure nobody foresaw")
        return real(data)

    monkeypatch.setattr(kernel_channel, "parse_message", flaky)
    send(channel.address, b"first", alive_report())
    wait_listed(channel, os.getpid())
    assert receiving_thread_alive()


# -- scan arguments --------------------------------------------------------------------------
def usage_error(ip, line: str, body: str = "ran = True\n") -> str:
    """The cell's error: a UsageError, the body not run; its text."""
    ip.user_ns.pop("ran", None)
    res, _, cap = run(ip, f"{line}\n{body}")
    said = str(res.error_in_exec or "") + cap.stderr + cap.stdout
    assert type(res.error_in_exec).__name__ == "UsageError" or "UsageError" in cap.stderr, said
    assert "Traceback" not in said and "ran" not in ip.user_ns
    return said


def test_a_scan_value_that_overflows_a_float_is_a_usage_error(ip):
    said = usage_error(ip, "%%gpumem --scan batch=1,2," + "9" * 400)
    assert "is too long" in said and "…" in said
    assert len(said) < 300


def test_a_scan_value_of_thousands_of_digits_is_not_echoed_whole(ip):
    for digits in (5000, 4300, 25):
        said = usage_error(ip, "%%gpumem --scan batch=1,2," + "7" * digits)
        assert "is too long" in said and "'7777777777777777777…'" in said
        assert len(said) < 300
    said = usage_error(ip, "%%gpumem --scan batch=1,2,1e999")
    assert "not a finite number" in said


@pytest.mark.parametrize("n", [5000, 20_000, 100_000])
def test_a_long_scan_list_is_refused_by_its_count(ip, n):
    """The count cap comes before any work per value, and nothing on the way is quadratic
    in the line's length: IPython's expansion of $name/{expr} and shlex's splitting were
    (20,000 values took about a minute). Timed outside the tests, not asserted here."""
    values = ",".join(str(i + 1) for i in range(n))
    said = usage_error(ip, f"%%gpumem --scan batch={values}")
    assert f"at most 8 values, got {n}" in said
    assert len(said) < 300


def test_the_scan_function_has_the_same_rules():
    import jupyter_gpumem
    from jupyter_gpumem.core.scan_values import scan_values

    def refused(values) -> str:
        with pytest.raises(ValueError) as e:
            jupyter_gpumem.scan(lambda v: None, values)
        with pytest.raises(ValueError) as same:
            scan_values(values if isinstance(values, list) else [])
        if isinstance(values, list):
            assert str(e.value) == str(same.value)  # one rule, one text
        return str(e.value)

    assert "too large" in refused([1, 2, BIG])
    assert "too large" in refused([1, 2, 10**4400])  # beyond int's own digit limit
    assert "not a finite number" in refused([1, 2, float("inf")])
    assert "is too long" in refused([1, 2, "7" * 5000])
    assert "at most 8 values, got 20000" in refused(list(range(1, 20_001)))
    assert "at most 8 values, got more" in refused(itertools.count(1))  # never listed
    assert "is not a number" in refused([1, 2, [3]])
    assert len(refused([1, 2, "x" * 10**6])) < 200


def test_scan_values_parse_as_typed():
    from jupyter_gpumem.core.scan_values import scan_values

    assert scan_values(["16", " 32 ", "64"]) == ((16.0, 32.0, 64.0), True)
    assert scan_values(["0.5", "1e3"]) == ((0.5, 1000.0), False)
    assert scan_values([8, 16.0]) == ((8.0, 16.0), False)
    assert scan_values([2**53, 3]) == ((float(2**53), 3.0), True)
    with pytest.raises(ValueError, match="too large"):
        scan_values([2**53 + 1, 3])


# -- device indexes --------------------------------------------------------------------------
@pytest.mark.parametrize("line", ["%gpumem -d {n}", "%gpumem segments -d {n}"])
def test_an_out_of_range_device_is_not_echoed_whole(ip, line):
    big = "9" * 4300
    with pytest.raises(UsageError) as e:
        ip.run_line_magic("gpumem", line.format(n=big).split(" ", 1)[1])
    assert str(e.value).startswith("no device 99999") and "…" in str(e.value)
    assert len(str(e.value)) < 200
    said = usage_error(ip, f"%%gpumem -d {big}")
    assert "no device" in said and len(said) < 300
    for digits in (5000, 20_000):  # beyond int's digit limit; beyond what shlex splits
        with pytest.raises(UsageError) as e:
            ip.run_line_magic("gpumem", "-d " + "9" * digits)
        assert len(str(e.value)) < 200 and "99999…" in str(e.value)


def test_variables_still_expand_in_a_gpumem_line(ip):
    """The magic expands $name and {expr} itself (IPython's expansion is quadratic in the
    line's length): as before, from the user's namespace and a caller's locals."""
    ip.user_ns["dev"] = 97
    for line in ("-d $dev", "-d {dev}", "-d {dev + 0}"):
        with pytest.raises(UsageError, match=r"^no device 97:"):
            ip.run_line_magic("gpumem", line)

    def inside() -> None:
        dev = 98  # noqa: F841  (read by the expansion)
        ip.run_line_magic("gpumem", "-d $dev")

    with pytest.raises(UsageError, match=r"^no device 98:"):
        inside()
    ip.user_ns.pop("dev")


def test_a_dropped_report_leaves_a_debug_line(caplog):
    import logging

    with caplog.at_level(logging.DEBUG, logger="jupyter_gpumem"):
        assert workers.parse_message(encoded(good_message(pid=2**70))) is None
        assert workers.parse_message(b"[" * 4000 + b"]" * 4000) is None
    said = [r.getMessage() for r in caplog.records]
    assert said == ["worker report dropped: bad pid", "worker report dropped: 4000 brackets"]


# -- numbers typed too long, sizes typed negative --------------------------------------------
def test_a_world_size_of_thousands_of_digits_is_one_short_line(ip):
    for digits in (5001, 400):  # beyond int's digit limit; within it
        said = usage_error(ip, "%%gpumem --dry-run --world-size " + "9" * digits)
        assert said.rstrip().endswith(
            "UsageError: --world-size: world size must be a whole number from 1 to 65536 "
            f"(the processes of the job), got '{'9' * 58}…"
        ), said
    import jupyter_gpumem
    from jupyter_gpumem.collectors.dry_run import check_world_size

    with pytest.raises(jupyter_gpumem.GpuMemError) as e:
        check_world_size("9" * 5001)
    assert str(e.value).endswith(f"got '{'9' * 58}…")
    with pytest.raises(jupyter_gpumem.GpuMemError) as e:
        check_world_size(10**5000)  # an int whose repr Python refuses
    assert str(e.value).endswith("got an integer of 16610 bits")


def test_ranks_of_hundreds_of_digits_are_one_short_line(ip):
    with pytest.raises(UsageError) as e:
        ip.run_line_magic("gpumem", "workers watch --ranks " + "1" * 400)
    assert str(e.value) == (
        "--ranks: expected ranks like 1,2,3 (each 0 to 65535), got " + f"'{'1' * 58}…"
    )
    with pytest.raises(UsageError) as e:
        ip.run_line_magic("gpumem", "workers watch --ranks 1,70000")
    assert str(e.value) == "--ranks: expected ranks like 1,2,3 (each 0 to 65535), got '1,70000'"


@pytest.mark.parametrize("line", ["--dry-run --fit-in -1GiB", "--scan b=1,2 --fit-in -1GiB"])
def test_a_negative_fit_in_says_a_size_cant_be_negative(ip, line):
    for typed in (line, line.replace(" -1GiB", "=-1GiB"), line.replace("-1GiB", "'-1GiB'")):
        said = usage_error(ip, f"%%gpumem {typed}")
        assert said.rstrip().endswith("UsageError: --fit-in: a size can't be negative: '-1GiB'")
    from jupyter_gpumem.analysis.targets import parse_target

    with pytest.raises(ValueError) as e:
        parse_target(-5, "fit_in")
    assert str(e.value) == "fit_in: a size can't be negative: -5"


BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"  # overrides and isolates


@pytest.mark.parametrize("where", ["host", "name"])
def test_bidi_overrides_in_a_name_are_replaced(ip, channel, where):
    """U+202E in a host name shows "gpu0\u202eevil" as "gpu0live": replaced, as control
    characters are, so that what is shown is what was sent."""
    if where == "host":
        report = alive_report(host="gpu\u202enode" + BIDI)
    else:
        report = alive_report(devices=[bad_device(name="H100\u2066x\u2069" + BIDI)])
    send(channel.address, report)
    wait_listed(channel, os.getpid())
    (w,) = channel.live()
    if where == "host":
        assert w.host == "gpu\ufffdnode" + "\ufffd" * len(BIDI)
    else:
        assert w.devices[0].name == "H100\ufffdx\ufffd" + "\ufffd" * len(BIDI)
    everything_renders(ip, os.getpid())


def test_bidi_overrides_in_a_workers_oom_site_are_replaced():
    from jupyter_gpumem.collectors.workers import oom

    doc = {
        "v": 1,
        "device": 0,
        "requested": 1,
        "allowed": 1,
        "free": 0,
        "segments": [],
        "lines": [["train.py:12 \u202estep", 1, 1]],
        "tracking": True,
        "trimmed": False,
    }
    snap = oom.parse_snapshot(encoded(doc))
    assert snap.lines == (("train.py:12 \ufffdstep", 1, 1),)
