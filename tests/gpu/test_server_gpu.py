"""Which notebook holds the GPU, with real NVML on a real GPU: two kernels of a real
jupyter_server allocate 2 GiB and 5 GiB; the endpoint must attribute exactly those (plus
each kernel's CUDA context) to the right notebooks."""

from __future__ import annotations

import json
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


def run_in(root, kernel_id, server, code):
    from jupyter_client import BlockingKernelClient

    # Connect once the server has heard from the kernel: a client's heartbeat that starts
    # before the kernel binds its socket takes it for dead (seen on a loaded machine).
    deadline = time.monotonic() + 60
    while server.get(f"api/kernels/{kernel_id}").get("execution_state") != "idle":
        if time.monotonic() > deadline:
            raise RuntimeError(f"the kernel did not start; the server's log:\n{server.tail()}")
        time.sleep(0.2)
    kc = BlockingKernelClient(connection_file=str(root / "runtime" / f"kernel-{kernel_id}.json"))
    kc.load_connection_file()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
    except RuntimeError as e:
        raise RuntimeError(f"{e}; the server's log ends with:\n{server.tail()}") from None
    reply = kc.execute_interactive(code, timeout=120)
    kc.stop_channels()
    assert reply["content"]["status"] == "ok", reply["content"]


def test_two_kernels_get_exactly_what_they_allocated(tmp_path):
    nvml = tmp_path / "unused.json"  # no fake: the server reads the real NVML
    server = Server(tmp_path, nvml, fake=False)
    try:
        kernels = {}
        for name, gib in (("two.ipynb", 2), ("five.ipynb", 5)):
            body = {"path": name, "type": "notebook", "kernel": {"name": "python3"}}
            _, text = server.request("api/sessions", "POST", body)
            kernels[name] = json.loads(text)["kernel"]["id"]
            run_in(
                tmp_path,
                kernels[name],
                server,
                f"import torch\nx = torch.empty({gib} << 30, dtype=torch.uint8, device='cuda')\n"
                "torch.cuda.synchronize()",
            )
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
