"""Ray workers report to the kernel through Ray itself (collectors/ray_workers.py).

A real local Ray cluster, ``ray.init(num_gpus=2)``: two logical GPUs (no real ones), whose
workers run the counting test backend (``JUPYTER_GPUMEM_BACKEND`` in the job's
``runtime_env``) and allocate exact byte counts; the test process is the notebook's kernel
(the Ray driver). The GPU side of a worker's reading is tests/gpu/test_workers.py's.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from jupyter_gpumem.collectors import Collector, ray_workers, worker_sources, workers
from jupyter_gpumem.collectors.workers import kernel_channel
from jupyter_gpumem.core.tracker import CellTracker
from jupyter_gpumem.reporters.text import cell_report_text
from jupyter_gpumem.testing import counting

MiB = 2**20
COUNTING = "jupyter_gpumem.testing.counting:backend"
# Each worker keeps its own exact count and peaks a temporary above it.
KEEP = (3 * MiB + 123, 5 * MiB + 4567)
TEMP = (1 * MiB + 1, 2 * MiB + 2)

needs_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="ray is not installed: pip install 'jupyter-gpumem[ray]' (make test installs it)",
)


@pytest.fixture(scope="module")
def ray_cluster():
    """A local cluster for this module's tests: 2 CPUs, 2 logical GPUs, no dashboard."""
    import ray

    ray.init(
        num_cpus=2,
        num_gpus=2,
        include_dashboard=False,
        log_to_driver=False,
        logging_level="WARNING",
        runtime_env={
            # no fallback to the kernel's datagram channel (a local cluster's workers
            # inherit the driver's environment): these workers report through Ray or not
            "env_vars": {"JUPYTER_GPUMEM_BACKEND": COUNTING, "JUPYTER_GPUMEM_WORKERS": ""}
        },
    )
    try:
        yield ray
    finally:
        ray.shutdown()
        ray_workers.stop()


def remotes(ray):
    """The workers' code, defined here so that Ray ships it by value."""

    @ray.remote(num_gpus=1)
    class GpuActor:
        def allocate(self, keep: int, temp: int):
            import jupyter_gpumem
            from jupyter_gpumem.testing import counting

            found = jupyter_gpumem.report_worker()
            counting.allocate(keep)
            counting.allocate(temp)
            counting.free(temp)
            jupyter_gpumem.report_worker()  # a second call sends the figures now
            return found, os.getpid(), [int(g) for g in ray.get_gpu_ids()]

        def finish(self) -> bool:
            import jupyter_gpumem

            return jupyter_gpumem.report_worker(final=True)

    @ray.remote(num_gpus=1)
    def gpu_task(keep: int, marks: str, final: bool):
        """A GPU task (Ray ends its process after it: max_calls=1). Writes a mark from an
        exit handler: the process ended normally, not cut short by a late Ray call."""
        import atexit

        import jupyter_gpumem
        from jupyter_gpumem.testing import counting

        pid = os.getpid()
        atexit.register(lambda: open(os.path.join(marks, str(pid)), "w").close())
        found = jupyter_gpumem.report_worker()
        counting.allocate(keep)
        if final:
            jupyter_gpumem.report_worker(final=True)
        else:
            time.sleep(4 * 0.25)  # a periodic report goes out while the task runs
            counting.free(keep)  # changed figures after the task: the reporter would send
        return found, pid, [int(g) for g in ray.get_gpu_ids()]

    @ray.remote(num_cpus=1)
    def no_gpu_task() -> bool:
        import jupyter_gpumem

        return jupyter_gpumem.report_worker()

    return GpuActor, gpu_task, no_gpu_task


def wait_for(cond, ch, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ray_workers.poll(ch, 0.05)
        got = cond(ch.live())
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out; workers: {ch.live()}")


def figures(reports):
    return [
        (w.via, w.status, w.host, w.pid, d.index, d.allocated, d.peak_allocated, d.reserved)
        for w in reports
        for d in w.devices
    ]


@needs_ray
def test_ray_workers_report_exact_bytes_then_exit(ray_cluster, tmp_path):
    ray = ray_cluster
    GpuActor, gpu_task, no_gpu_task = remotes(ray)
    host = socket.gethostname()
    # No mailbox yet (no measured cell since ray.init): a worker's call does nothing.
    assert ray.get(no_gpu_task.remote()) is False
    ch = workers.channel()
    tracker = CellTracker(Collector(counting.backend()), ch, worker_sources.CELL_FEEDS)
    try:
        t0 = time.perf_counter()
        tracker.begin()  # the first measured cell after ray.init() makes the mailbox
        assert time.perf_counter() - t0 < 1.0
        assert ray_workers._watcher is not None
        actors = [GpuActor.remote() for _ in KEEP]
        got = ray.get([a.allocate.remote(k, t) for a, k, t in zip(actors, KEEP, TEMP, strict=True)])
        assert [found for found, _, _ in got] == [True, True]
        pids = {pid: (gpus, k, t) for (_, pid, gpus), k, t in zip(got, KEEP, TEMP, strict=True)}
        assert sorted(g for gpus, _, _ in pids.values() for g in gpus) == [0, 1]

        def exact(live, status="running"):
            rows = {(w.pid, w.status, d.allocated) for w in live for d in w.devices}
            return rows == {(p, status, k) for p, (_, k, _) in pids.items()}

        wait_for(exact, ch)
        # the panel's sample (a full reading) lists them too
        full = Collector(counting.backend(), workers=worker_sources.sources()).measure()
        assert {w.pid for w in full.workers} == set(pids)
        report = tracker.end(execution_count=3)
        expected = sorted(
            ("ray", "running", host, p, gpus[0], k, k + t, k + t)
            for p, (gpus, k, t) in pids.items()
        )
        assert sorted(figures(report.workers)) == expected
        # the node's GPU is the device index; the host is in the label
        text = cell_report_text(report)
        for p, (gpus, _, _) in pids.items():
            assert f"ray worker (pid {p} on {host}) cuda:{gpus[0]}  allocated" in text
        assert "still running at the cell's end" in text

        # The actors finish: their last reports say so, with the same figures.
        assert ray.get([a.finish.remote() for a in actors]) == [True, True]
        tracker.begin()
        wait_for(lambda live: exact(live, "exited"), ch)
        report = tracker.end()
        assert sorted(figures(report.workers)) == [(v, "exited", *rest) for v, _, *rest in expected]
        for a in actors:
            ray.kill(a)

        # Two GPU tasks: one ends with report_worker(final=True), one without it (its
        # reporter must not touch Ray once the task is over: its process ends normally).
        marks = str(tmp_path)
        tracker.begin()
        (f1, pid1, gpus1), (f2, pid2, _) = ray.get(
            [gpu_task.remote(KEEP[0], marks, True), gpu_task.remote(KEEP[1], marks, False)]
        )
        assert f1 and f2
        wait_for(  # the second: running, or silent once its process is gone
            lambda live: (
                {(w.pid, w.status != "exited", w.devices[0].allocated) for w in live}
                >= {(pid1, False, KEEP[0]), (pid2, True, KEEP[1])}
            ),
            ch,
        )
        deadline = time.monotonic() + 30
        while len(os.listdir(marks)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(os.listdir(marks)) == sorted([str(pid1), str(pid2)])
        while kernel_channel._alive(pid2, host) and time.monotonic() < deadline:
            time.sleep(0.05)  # its exit handlers ran: the process is ending
        report = tracker.end()
        by_pid = {w.pid: w for w in report.workers}
        w1 = by_pid[pid1]
        assert (w1.status, w1.devices[0].index, w1.devices[0].allocated) == (
            "exited",
            gpus1[0],
            KEEP[0],
        )
        assert w1.started_in_cell and w1.devices[0].peak_exact
        # no last report from the other: gone from this host, it is silent
        assert by_pid[pid2].status == "silent"
    finally:
        tracker.cancel()
        ch.close()


@needs_ray
def test_a_measured_cell_in_a_real_shell_shows_ray_workers(ray_cluster, ip, monkeypatch, tmp_path):
    """The IPython extension's own cells, report and history, with the Ray hooks."""
    from tests.conftest import run

    ray = ray_cluster
    _, gpu_task, _ = remotes(ray)
    monkeypatch.setattr(ray_workers, "WAIT", 2.0)  # the plumbing, not the timing
    ip.user_ns.update(ray=ray, gpu_task=gpu_task, marks=str(tmp_path))
    run(ip, "%%gpumem -q\npass")  # the mailbox, made at the first measured cell
    ray.get(ray_workers._watcher.actor.since.remote(0))  # started (its first answer comes)
    code = (
        "%%gpumem -o rep\n"
        "got = ray.get([gpu_task.remote(k, marks, True) for k in (7 * 2**20, 9 * 2**20)])\n"
        "import time; time.sleep(0.2)\n"
    )
    result, texts, _ = run(ip, code)
    assert result.success
    rep = ip.user_ns["rep"]
    assert sorted((w.via, w.status, w.devices[0].allocated) for w in rep.workers) == [
        ("ray", "exited", 7 * MiB),
        ("ray", "exited", 9 * MiB),
    ]
    (text,) = [t for t in texts if "worker processes" in t]
    assert "worker processes (2): their own allocators" in text
    assert f"on {socket.gethostname()}) cuda:" in text
    _, texts, _ = run(
        ip,
        "import jupyter_gpumem as g\n"
        "[r['worker'] for r in g._ipython.current().history.records() if r['worker']]",
    )
    rows = ip.user_ns["_"]
    assert len(rows) == 2 and all(r.startswith("ray worker (pid ") for r in rows)


def test_without_ray_imported_nothing_imports_it():
    """A kernel that never imported Ray: loading the extension and measured cells import
    neither ray nor our Ray module."""
    code = textwrap.dedent(
        """
        import sys
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.utils.capture import capture_output
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "jupyter_gpumem")
        with capture_output():
            ip.run_cell("%%gpumem\\nx = 1")
            ip.run_cell("%gpumem auto on")
            ip.run_cell("y = 2")
            ip.run_cell("%gpumem")
            ip.run_cell("%gpumem workers")
        print(sorted(m for m in sys.modules if m == "ray" or m.startswith("ray.")
                     or m.endswith("ray_workers")))
        """
    )
    env = {**os.environ, "JUPYTER_GPUMEM_BACKEND": COUNTING}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


class _Ready:
    """A stand-in for Ray in the kernel's reading of the mailbox: every answer has come."""

    def __init__(self, answer):
        self.answer = answer

    def get(self, ref, timeout=None):
        return self.answer


def test_the_kernel_checks_what_the_mailbox_hands_it(monkeypatch):
    """Reports from the mailbox are read, never trusted: each goes through parse_message."""
    import json

    from tests.test_workers import good_message

    ch = workers.WorkerChannel()
    good = json.dumps(good_message(via="ray", final=False))
    answer = (
        7,
        [
            (good, 1.5),
            (json.dumps(good_message(via="ray", pid=-1)), 0.0),  # a bad field
            (json.dumps(good_message(via="fork", pid=99)), 0.0),  # not a Ray report
            ("not json", 0.0),
            (b"bytes", 0.0),
            (json.dumps(good_message(via="ray", pid=4243)), float("nan")),  # age: unknown
        ],
    )
    w = ray_workers.RayWatcher.__new__(ray_workers.RayWatcher)
    w.ray, w.version, w.reported, w._pending = _Ready(answer), 0, 0, object()
    before = time.time()
    assert w._take(ch) == 2 and w.version == 7 and w._pending is None
    live = {x.pid: x for x in ch.live()}
    assert sorted(live) == [4242, 4243] and all(x.via == "ray" for x in live.values())
    assert live[4242].age >= 1.5 and live[4243].age < time.time() - before + 0.5


def test_the_mailbox_keeps_the_latest_report_per_worker():
    box = ray_workers._mailbox_class()(2, 100)
    box.report("h/1", "a")
    box.report("h/2", "b")
    box.report("h/1", "c")  # the same worker: replaced
    version, new = box.since(0)
    assert version == 3 and sorted(d for d, _ in new) == ["b", "c"]
    assert box.since(version) == (3, [])
    box.report("h/3", "d")  # a third worker: the stalest goes
    assert sorted(d for d, _ in box.since(0)[1]) == ["c", "d"]
    box.report("h/4", "x" * 101)  # too long: dropped
    box.report(5, "e")  # not a key
    assert box.since(4) == (4, [])
