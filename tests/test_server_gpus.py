"""Which notebook holds each GPU, through a real jupyter_server with two real kernels.

NVML is replaced at its call boundary (JUPYTER_GPUMEM_FAKE_NVML, a test-only switch) by a
file that names the real PIDs of the kernels this test starts, a child process one of them
spawns, and this test's own process. Everything else is real: the server, its
authentication, the session manager, the process table, /metrics.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest

from jupyter_gpumem.testing.fake_nvml import env as fake_nvml_env
from jupyter_gpumem.testing.replay import env as replay_env
from tests.fakes import FIXTURES

psutil = pytest.importorskip("psutil")
pytestmark = pytest.mark.kernel
GiB = 1 << 30
UUIDS = ["GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000"]


def _port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    def __init__(
        self, root: Path, nvml: Path, fake: bool = True, prefix: Sequence[str] = ()
    ) -> None:
        self.root = root
        self.token = "gpumem-test-token"
        self.port = _port()
        self.base = f"http://127.0.0.1:{self.port}/"
        self.nvml = nvml
        env = {
            **os.environ,
            **fake_nvml_env(str(nvml)),
            "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
            "JUPYTER_CONFIG_DIR": str(root / "config"),
        }
        for name in replay_env(""):  # the server's own kernels: no recorded allocator
            env.pop(name, None)
        if not fake:
            env.pop("JUPYTER_GPUMEM_FAKE_NVML")
            env.pop("JUPYTER_GPUMEM_NVML")
        self.runtime = root / "runtime"
        # The server's log (and its kernels' stderr) to a file: a pipe nobody reads fills up
        # and blocks them.
        self.log = root / "server.log"
        self._log = open(self.log, "w")  # closed in stop()
        self.proc = subprocess.Popen(
            [
                *prefix,  # e.g. unshare --pid --fork --mount-proc: a container's PID namespace
                sys.executable,
                "-m",
                "jupyter_server",
                "--no-browser",
                "--allow-root",
                f"--port={self.port}",
                "--ServerApp.port_retries=0",
                f"--ServerApp.root_dir={root}",
                f"--IdentityProvider.token={self.token}",
                "--ServerApp.jpserver_extensions={'jupyter_gpumem': True}",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            text=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                self.get("api/status")
                return
            except Exception:
                if self.proc.poll() is not None:
                    raise RuntimeError(self.log.read_text()[-3000:]) from None
                time.sleep(0.3)
        raise RuntimeError("the server did not start")

    def request(self, path, method="GET", body=None, token=True):
        headers = {"Authorization": f"token {self.token}"} if token else {}
        data = json.dumps(body).encode() if body is not None else None
        if data is not None:
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self.base + path, data=data, headers=headers, method=method)
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()

    def get(self, path, token=True):
        _, text = self.request(path, token=token)
        return json.loads(text) if text.startswith(("{", "[")) else text

    def tail(self, n: int = 3000) -> str:
        """The end of the server's log (its kernels' stderr included)."""
        self._log.flush()
        return self.log.read_text()[-n:]

    def client(self, kernel_id: str, timeout: float = 90):
        """A started, ready client of one of this server's kernels. A kernel still starting
        (slow on a cold machine) misses the client's first heartbeat and the client takes
        it for dead: ask again with a fresh client until `timeout`."""
        from jupyter_client import BlockingKernelClient

        deadline = time.monotonic() + timeout
        while True:
            kc = BlockingKernelClient(
                connection_file=str(self.root / "runtime" / f"kernel-{kernel_id}.json")
            )
            kc.load_connection_file()
            kc.start_channels()
            try:
                kc.wait_for_ready(timeout=max(1.0, deadline - time.monotonic()))
                return kc
            except RuntimeError as e:
                kc.stop_channels()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{e}; the server's log ends with:\n{self.tail()}") from None
                time.sleep(0.5)

    def stop(self) -> None:
        self._log.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def write_nvml(path: Path, processes0, processes1, fail=None, reserved=(GiB // 2, None)) -> None:
    """Two fake H200s; ``reserved``: what each driver reports it reserves (NVML memory info
    v2), None for a driver without v2 (a server asks once: drivers do not change)."""
    devices = [
        {
            "name": "NVIDIA H200",
            "uuid": UUIDS[0],
            "total": 150 * GiB,
            "used": 20 * GiB,
            "processes": processes0,
        },
        {
            "name": "NVIDIA H200",
            "uuid": UUIDS[1],
            "total": 150 * GiB,
            "used": 6 * GiB,
            "processes": processes1,
        },
    ]
    for d, r in zip(devices, reserved, strict=True):
        if r is not None:
            d["reserved"] = r
    data = {"driver": "580.00", "devices": devices}
    if fail:
        data["fail"] = fail
    path.write_text(json.dumps(data))


def kernel_pid(server: Server, kernel_id: str) -> int:
    """The kernel's process: the server's child started with the kernel's connection file."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for child in psutil.Process(server.proc.pid).children(recursive=True):
            try:
                if any(kernel_id in part for part in child.cmdline()):
                    return child.pid
            except psutil.Error:
                continue
        time.sleep(0.2)
    raise AssertionError(f"no process for kernel {kernel_id}")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("server")
    nvml = root / "nvml.json"
    write_nvml(nvml, [], [])
    server = Server(root, nvml)
    kernels = {}
    for name in ("a.ipynb", "b.ipynb"):
        body = {"path": name, "type": "notebook", "kernel": {"name": "python3"}}
        _, text = server.request("api/sessions", "POST", body)
        kernels[name] = json.loads(text)["kernel"]["id"]
    pids = {name: kernel_pid(server, kid) for name, kid in kernels.items()}
    # a child process of kernel a (as torch.multiprocessing or a launcher would start one)
    kc = server.client(kernels["a.ipynb"])
    kc.execute(
        "import subprocess, sys\nchild = subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(300)'])\nprint(child.pid)"
    )
    child = None
    while child is None:
        msg = kc.get_iopub_msg(timeout=30)
        if msg["msg_type"] == "stream":
            child = int(msg["content"]["text"].strip())
    kc.stop_channels()
    yield SimpleNamespace(server=server, kernels=kernels, pids=pids, child=child, nvml=nvml)
    server.stop()


def test_requests_without_a_token_are_refused(served):
    server = served.server
    with pytest.raises(urllib.error.HTTPError) as err:
        server.request("api/gpumem/devices", token=False)
    assert err.value.code == 403


def test_processes_are_matched_with_notebooks_and_their_children(served):
    server, kernels, pids, child, nvml = (
        served.server,
        served.kernels,
        served.pids,
        served.child,
        served.nvml,
    )
    me = psutil.Process()
    write_nvml(
        nvml,
        [
            {"pid": pids["a.ipynb"], "used": 2 * GiB, "name": "python"},
            {"pid": child, "used": 1 * GiB, "name": "python"},
            {"pid": os.getpid(), "used": GiB // 4, "name": me.name()},
        ],
        [{"pid": pids["b.ipynb"], "used": 5 * GiB, "name": "python"}],
        reserved=(GiB // 2, None),
    )
    time.sleep(1.1)  # past the server's 1 s cache
    reply = server.get("api/gpumem/devices")
    assert reply["pid_namespace"] == "shared" and reply["note"] is None
    # memory no listed process holds: 20 GiB used, 0.5 GiB the driver's, 3.25 GiB listed;
    # the second driver does not say what it reserves (then the unseen amount includes it)
    assert [d["driver_reserved"] for d in reply["devices"]] == [GiB // 2, None]
    assert [d["unseen"] for d in reply["devices"]] == [20 * GiB - GiB // 2 - 13 * GiB // 4, GiB]
    d0, d1 = reply["devices"]
    assert (d0["uuid"], d1["uuid"]) == tuple(UUIDS) and d0["total"] == 150 * GiB
    roles = {p["pid"]: (p["role"], p["kernel_id"], p["used"]) for p in d0["processes"]}
    assert roles[pids["a.ipynb"]] == ("kernel", kernels["a.ipynb"], 2 * GiB)
    assert roles[child] == ("child", kernels["a.ipynb"], 1 * GiB)
    assert roles[os.getpid()] == ("other", None, GiB // 4)
    mine = next(p for p in d0["processes"] if p["pid"] == os.getpid())
    assert mine["name"] == me.name() and mine["user"] == me.username()
    assert [(p["pid"], p["kernel_id"]) for p in d1["processes"]] == [
        (pids["b.ipynb"], kernels["b.ipynb"])
    ]
    by_id = {k["id"]: k for k in reply["kernels"]}
    a, b = by_id[kernels["a.ipynb"]], by_id[kernels["b.ipynb"]]
    assert (a["path"], a["gpu_used"], a["pid"]) == ("a.ipynb", 3 * GiB, pids["a.ipynb"])
    assert a["children"] == [{"pid": child, "used": GiB}]
    assert (b["path"], b["gpu_used"]) == ("b.ipynb", 5 * GiB)
    assert b["devices"] == [{"index": 1, "used": 5 * GiB}]
    assert a["execution_state"] in ("idle", "busy", "starting") and a["last_activity"]


def test_metrics_carry_device_and_kernel_series(served):
    server, kernels = served.server, served.kernels
    text = ""
    deadline = time.monotonic() + 10
    series = f'jupyter_gpumem_kernel_memory_used_bytes{{device="0",kernel_id="{kernels["a.ipynb"]}",uuid="{UUIDS[0]}"}}'  # noqa: E501
    while time.monotonic() < deadline and series not in text:
        _, text = server.request("metrics")
        time.sleep(0.5)
    line = next(x for x in text.splitlines() if x.startswith(series))
    assert float(line.split()[-1]) == 3 * GiB  # the kernel and its child
    assert f'jupyter_gpumem_device_memory_total_bytes{{device="1",uuid="{UUIDS[1]}"}}' in text
    assert "jupyter_gpumem_other_memory_used_bytes" in text
    unseen = f'jupyter_gpumem_unseen_memory_used_bytes{{device="0",uuid="{UUIDS[0]}"}}'
    assert float(next(x for x in text.splitlines() if x.startswith(unseen)).split()[-1]) == (
        20 * GiB - GiB // 2 - 13 * GiB // 4
    )
    reserved = f'jupyter_gpumem_driver_reserved_bytes{{device="0",uuid="{UUIDS[0]}"}}'
    assert float(next(x for x in text.splitlines() if x.startswith(reserved)).split()[-1]) == (
        GiB // 2
    )
    assert 'jupyter_gpumem_driver_reserved_bytes{device="1"' not in text  # not told
    assert "jupyter_gpumem_nvml_up 1.0" in text
    assert "a.ipynb" not in text and "b.ipynb" not in text  # no paths in labels


def replayed_figures(device: int) -> set[tuple[int, int]]:
    """Every (reserved, allocated) the replay backend can report for a device: the
    recorded timeline, frame by frame."""
    from jupyter_gpumem.testing.replay import ReplayBackend, reading_from_raw

    backend = ReplayBackend(str(FIXTURES))
    out = set()
    for frame in backend.timeline:
        for d in reading_from_raw(frame, "").devices:
            if d.index == device and d.allocator is not None:
                out.add((d.allocator.reserved, d.allocator.allocated))
    return out


def test_foreign_pids_name_notebooks_by_what_their_kernels_report(served):
    """NVML's PIDs are not this server's (a container without the host's PID namespace):
    no process is matched, but each kernel with the extension loaded is asked for its own
    PyTorch figures and its notebook is named with them; a kernel without the extension
    is not named."""
    server, kernels, nvml = served.server, served.kernels, served.nvml
    kc = server.client(kernels["a.ipynb"])
    try:
        env = replay_env(str(FIXTURES))  # kernel a's torch figures: replayed H200 readings
        reply = kc.execute_interactive(
            f"import os; os.environ.update({env!r})\n%load_ext jupyter_gpumem", timeout=60
        )
        assert reply["content"]["status"] == "ok"
    finally:
        kc.stop_channels()
    foreign = [{"pid": 4_000_001, "used": 3 * GiB, "name": "python"}]
    write_nvml(nvml, foreign, [{"pid": 4_000_002, "used": GiB, "name": "python"}])
    time.sleep(1.1)
    reply = server.get("api/gpumem/devices")
    assert reply["pid_namespace"] == "foreign"
    assert "1 notebook(s) with jupyter_gpumem loaded said what PyTorch holds" in reply["note"]
    by_id = {k["id"]: k for k in reply["kernels"]}
    a, b = by_id[kernels["a.ipynb"]], by_id[kernels["b.ipynb"]]
    assert b["reported"] is None  # no extension: never answers, never named
    (dev,) = [d for d in a["reported"]["devices"] if d["cuda_index"] == 0]
    assert dev["name"] == "NVIDIA H200"
    assert (dev["reserved"], dev["allocated"]) in replayed_figures(0)
    d0 = reply["devices"][0]
    assert [(r["kernel_id"], r["reserved"]) for r in d0["reported"]] == [
        (kernels["a.ipynb"], dev["reserved"])
    ]
    assert {p["role"] for d in reply["devices"] for p in d["processes"]} == {"other"}
    assert all(p["kernel_id"] is None for d in reply["devices"] for p in d["processes"])
    # NVML's PIDs become ours again: matching by PID, nothing asked or reported
    write_nvml(nvml, [], [])
    time.sleep(1.1)
    reply = server.get("api/gpumem/devices")
    assert reply["pid_namespace"] == "unknown"
    assert all(d["reported"] == [] for d in reply["devices"])


PID_MAX = 1 << 22  # Linux's largest pid_max: no PID here is at or above it


def test_recorded_host_pids_are_foreign_and_the_unseen_is_exact(tmp_path):
    """NVML's answer recorded on an H100 (driver 580) on the host while the server and its
    kernels ran in their own PID namespace (``tests/gpu/test_server_gpu.py`` writes it):
    the kernels under their host PIDs, as older drivers and other runtimes report them
    inside a container. Served from the start by a server of its own (a real one never
    sees a GPU change its name), no process is matched with a notebook (each stays
    ``other`` under NVML's name), the memory no listed process holds is the recorded used
    minus the driver's reservation minus the listed processes, and the kernel with the
    extension loaded is named by what it reports, on its own GPU only."""
    record = json.loads((Path(__file__).parent / "fixtures" / "nvml_host_pids.json").read_text())
    answer = record["nvml"]
    (device,) = answer["devices"]
    for p in device["processes"]:
        # The recorded PIDs are small numbers a process here may have; PIDs that exist
        # here are moved past pid_max (none can exist there): a PID that runs another
        # program here is foreign too, but that is test_pids_of_another_namespace's case.
        if psutil.pid_exists(p["pid"]):
            p["pid"] += PID_MAX
    nvml = tmp_path / "nvml.json"
    nvml.write_text(json.dumps(answer))
    server = Server(tmp_path, nvml)
    try:
        kernels = {}
        for name in ("a.ipynb", "b.ipynb"):
            body = {"path": name, "type": "notebook", "kernel": {"name": "python3"}}
            _, text = server.request("api/sessions", "POST", body)
            kernels[name] = json.loads(text)["kernel"]["id"]
        kc = server.client(kernels["a.ipynb"])
        try:
            env = replay_env(str(FIXTURES))  # kernel a's figures: replayed H200 readings
            reply = kc.execute_interactive(
                f"import os; os.environ.update({env!r})\n%load_ext jupyter_gpumem", timeout=60
            )
            assert reply["content"]["status"] == "ok"
        finally:
            kc.stop_channels()
        deadline = time.monotonic() + 20
        while True:
            time.sleep(1.1)  # past the server's 1 s cache; the kernels are asked in between
            reply = server.get("api/gpumem/devices")
            by_id = {k["id"]: k for k in reply["kernels"]}
            if by_id[kernels["a.ipynb"]]["reported"] or time.monotonic() > deadline:
                break
    finally:
        server.stop()
    assert reply["pid_namespace"] == "foreign"
    (d0,) = reply["devices"]
    assert (d0["name"], d0["used"], d0["driver_reserved"]) == (
        "NVIDIA H100 80GB HBM3",
        13_964_935_168,
        503_316_480,
    )
    listed = sum(p["used"] for p in device["processes"])
    assert listed == 4_838_129_664 + 2_690_646_016 + 5_911_871_488
    assert d0["unseen"] == device["used"] - device["reserved"] - listed == 20 * (1 << 20)
    assert [(p["pid"], p["used"], p["role"], p["kernel_id"]) for p in d0["processes"]] == [
        (p["pid"], p["used"], "other", None)
        for p in sorted(device["processes"], key=lambda p: -p["used"])
    ]
    assert {p["name"] for p in d0["processes"]} == {"/opt/torch/.venv/bin/python3"}
    a, b = by_id[kernels["a.ipynb"]], by_id[kernels["b.ipynb"]]
    assert a["gpu_used"] == 0 and b["gpu_used"] == 0  # nothing matched by PID
    assert b["reported"] is None  # no extension: never answers, never named
    # kernel a reports its own (replayed H200) figures: named at the kernel, but not put
    # on this H100, which is not the GPU it reports
    assert [d["name"] for d in a["reported"]["devices"]] == ["NVIDIA H200"]
    assert d0["reported"] == []


def test_pids_of_another_namespace_are_not_matched(served):
    server, nvml = served.server, served.nvml
    # NVML names a PID that runs another program here (the server), as in a container
    # without the host's PID namespace, where the driver's PIDs are not ours
    pid = server.proc.pid
    write_nvml(nvml, [{"pid": pid, "used": GiB, "name": "/usr/bin/firefox"}], [])
    time.sleep(1.1)
    reply = server.get("api/gpumem/devices")
    assert reply["pid_namespace"] == "foreign"
    assert "PID namespace" in reply["note"]
    (p,) = reply["devices"][0]["processes"]
    assert (p["pid"], p["kernel_id"], p["name"], p["role"]) == (
        pid,
        None,
        "/usr/bin/firefox",
        "other",
    )


def test_nvml_failures_are_a_value_not_a_crash(served):
    server, pids, nvml = served.server, served.pids, served.nvml
    write_nvml(
        nvml,
        [{"pid": pids["a.ipynb"], "used": GiB}],
        [],
        fail="nvmlDeviceGetComputeRunningProcesses",
    )
    time.sleep(1.1)
    reply = server.get("api/gpumem/devices")
    assert "nvmlDeviceGetComputeRunningProcesses failed" in reply["nvml"]["error"]
    assert len(reply["devices"]) == 2 and reply["devices"][0]["processes"] == []
    assert reply["devices"][0]["unseen"] is None  # processes not listed: nothing to subtract
    nvml.unlink()  # no NVML at all
    time.sleep(1.1)
    reply = server.get("api/gpumem/devices")
    assert reply["devices"] == [] and reply["nvml"]["error"]
    write_nvml(nvml, [], [])


def test_the_grafana_dashboard_uses_only_documented_series():
    import re

    from jupyter_gpumem.server.metrics import SERIES

    dashboard = json.loads(
        (Path(__file__).parents[1] / "examples" / "grafana-gpumem.json").read_text()
    )
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"jupyter_gpumem_[a-z_]+", e)}
    assert used and used <= set(SERIES)
    docs = (Path(__file__).parents[1] / "docs" / "server.md").read_text()
    for name in SERIES:
        assert f"`{name}`" in docs
