"""Which notebook holds the GPU, with real NVML on a real GPU: two kernels of a real
jupyter_server allocate 2 GiB and 5 GiB; the endpoint must attribute exactly those (plus
each kernel's CUDA context) to the right notebooks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.test_server_gpus import Server

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.kernel,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
GiB = 1 << 30
MiB = 1 << 20


def run_in(server, kernel_id, code):
    kc = server.client(kernel_id)
    try:
        reply = kc.execute_interactive(code, timeout=120)
    finally:
        kc.stop_channels()
    assert reply["content"]["status"] == "ok", reply["content"]


def two_notebooks(server, prelude: str = "") -> dict[str, str]:
    """Notebooks two.ipynb and five.ipynb whose kernels allocate 2 and 5 GiB on cuda:0:
    their kernel ids by name."""
    kernels = {}
    for name, gib in (("two.ipynb", 2), ("five.ipynb", 5)):
        body = {"path": name, "type": "notebook", "kernel": {"name": "python3"}}
        _, text = server.request("api/sessions", "POST", body)
        kernels[name] = json.loads(text)["kernel"]["id"]
        run_in(
            server,
            kernels[name],
            f"{prelude}import torch\n"
            f"x = torch.empty({gib} << 30, dtype=torch.uint8, device='cuda')\n"
            "torch.cuda.synchronize()",
        )
    return kernels


def test_two_kernels_get_exactly_what_they_allocated(tmp_path):
    nvml = tmp_path / "unused.json"  # no fake: the server reads the real NVML
    server = Server(tmp_path, nvml, fake=False)
    try:
        kernels = two_notebooks(server)
        time.sleep(1.2)
        reply = server.get("api/gpumem/devices")
        assert reply["pid_namespace"] == "shared", reply
        by_id = {k["id"]: k for k in reply["kernels"]}
        for name, gib in (("two.ipynb", 2), ("five.ipynb", 5)):
            k = by_id[kernels[name]]
            assert k["path"] == name
            # the tensor, plus the kernel's CUDA context and libraries (< 1 GiB on an H200)
            assert gib * GiB <= k["gpu_used"] <= gib * GiB + GiB, (name, k["gpu_used"])
        roles = [p for d in reply["devices"] for p in d["processes"] if p["kernel_id"]]
        assert {p["kernel_id"] for p in roles} == set(kernels.values())
        _, metrics = server.request("metrics")
        assert f'kernel_id="{kernels["five.ipynb"]}"' in metrics
    finally:
        server.stop()


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare (a PID namespace like a container's)",
)
def test_server_in_its_own_pid_namespace_names_notebooks_and_the_unseen(tmp_path):
    """The server and its kernels in their own PID namespace (as in a JupyterHub pod),
    a process outside it holding 4 GiB: both notebooks are named with their memory
    (through NVML's PIDs where the driver gives the namespace's own, else through what
    their kernels report), and the 4 GiB are shown as used by processes this server
    cannot see, in the endpoint and in /metrics."""
    outside = subprocess.Popen(
        [
            sys.executable,
            "-c",
            OUTSIDE,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    server = None
    try:
        assert outside.stdout.readline().strip() == "ready"
        server = Server(
            tmp_path,
            tmp_path / "unused.json",
            fake=False,
            prefix=["unshare", "--pid", "--fork", "--mount-proc"],
        )
        kernels = two_notebooks(server, prelude="%load_ext gpumem\n")
        deadline = time.monotonic() + 30  # foreign PIDs: the kernels are asked
        while True:
            time.sleep(1.2)
            reply = server.get("api/gpumem/devices")
            by_id = {k["id"]: k for k in reply["kernels"]}
            named = {
                name: by_id[kid].get("gpu_used") or _reported_allocated(by_id[kid])
                for name, kid in kernels.items()
            }
            if all(named.values()) or time.monotonic() > deadline:
                break
        print(json.dumps({"pid_namespace": reply["pid_namespace"], "named": named}))
        for name, gib in (("two.ipynb", 2), ("five.ipynb", 5)):
            # NVML's figure: the tensor plus the context (< 1 GiB); or PyTorch's, exact
            assert gib * GiB <= named[name] <= gib * GiB + GiB, (name, named[name], reply)
        (device,) = [d for d in reply["devices"] if d["cuda_index"] == 0]
        # What processes outside the namespace hold, as the host's NVML lists them: the
        # outside process (4 GiB and its context) and this test process, whose earlier GPU
        # tests left a context and cached blocks.
        outside_used = _used_outside_namespace(device["uuid"])
        print(json.dumps({"unseen": device["unseen"], "outside_used": outside_used}))
        _record_host_answer(device["uuid"], reply, kernels)
        assert device["unseen"] >= 4 * GiB, device
        assert abs(device["unseen"] - outside_used) <= 256 * MiB, (outside_used, device)
        _, metrics = server.request("metrics")
        line = next(
            m
            for m in metrics.splitlines()
            if m.startswith("jupyter_gpumem_unseen_memory_used_bytes")
        )
        assert abs(float(line.rsplit(" ", 1)[1]) - outside_used) <= 256 * MiB, line
    finally:
        outside.kill()
        if server is not None:
            server.stop()


def _used_outside_namespace(uuid: str) -> int:
    """GPU memory of the processes in this test's own PID namespace (the host's, outside
    the server's), from NVML as the host sees it."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        (handle,) = [h for h in handles if _text(pynvml.nvmlDeviceGetUUID(h)) == uuid]
        ours = os.readlink("/proc/self/ns/pid")
        total = 0
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            try:
                same = os.readlink(f"/proc/{p.pid}/ns/pid") == ours
            except OSError:
                continue
            if same and p.usedGpuMemory:
                total += int(p.usedGpuMemory)
        return total
    finally:
        pynvml.nvmlShutdown()


def _record_host_answer(uuid: str, reply: dict, kernels: dict[str, str]) -> None:
    """With GPUMEM_RECORD_DIR set: NVML's answer as the host sees it (the kernels under
    their host PIDs, which are foreign to the server's namespace: what older drivers and
    other runtimes report inside a container), in the fake NVML's format, beside what the
    kernels said they hold. ``tests/test_server_gpus.py`` replays it."""
    out = os.environ.get("GPUMEM_RECORD_DIR")
    if not out:
        return
    import pynvml

    pynvml.nvmlInit()
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        (h,) = [h for h in handles if _text(pynvml.nvmlDeviceGetUUID(h)) == uuid]
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        device = {
            "name": _text(pynvml.nvmlDeviceGetName(h)),
            "uuid": uuid,
            "total": int(mem.total),
            "used": int(mem.used),
            "processes": [],
        }
        try:
            v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
            device["reserved"] = int(v2.reserved)
        except Exception:
            pass
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            try:
                name = _text(pynvml.nvmlSystemGetProcessName(p.pid))
            except Exception:
                name = ""
            device["processes"].append(
                {"pid": p.pid, "used": int(p.usedGpuMemory or 0), "name": name}
            )
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
    finally:
        pynvml.nvmlShutdown()
    by_id = {k["id"]: k for k in reply["kernels"]}
    record = {
        "what": "NVML's answer on the host while a jupyter_server ran in its own PID namespace "
        "(unshare --pid --fork --mount-proc) with two kernels holding 2 and 5 GiB and a process "
        "outside holding 4 GiB; the PIDs are the host's",
        "nvml": {"driver": driver, "devices": [device]},
        "kernels": {name: by_id[kid].get("reported") for name, kid in kernels.items()},
        "server_saw": {
            "pid_namespace": reply["pid_namespace"],
            "unseen": [d["unseen"] for d in reply["devices"] if d["uuid"] == uuid],
        },
    }
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "nvml_host_pids.json"), "w") as f:
        json.dump(record, f, indent=1)


def _text(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v


OUTSIDE = """
import time, torch
x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(600)
"""


def _reported_allocated(kernel: dict) -> int | None:
    r = kernel.get("reported")
    if not r:
        return None
    return sum(d["allocated"] for d in r["devices"]) or None
