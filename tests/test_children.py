"""A kernel's child processes on the GPU (multi-process training started from a notebook)
are shown under it, per process: NVML is faked at its call boundary with the real PIDs of
a child of this process and of a process that is not ours."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from jupyter_gpumem.protocol.convert import to_protocol
from jupyter_gpumem.testing.fake_nvml import env as fake_nvml_env

GiB = 1 << 30


@pytest.fixture
def nvml_with_a_child(tmp_path, monkeypatch):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stranger = os.getppid()  # our parent: on the GPU too, but not our descendant
    path = tmp_path / "nvml.json"
    path.write_text(
        json.dumps(
            {
                "devices": [
                    {
                        "name": "NVIDIA H200",
                        "uuid": "GPU-1",
                        "total": 150 * GiB,
                        "used": 9 * GiB,
                        "processes": [
                            {"pid": os.getpid(), "used": GiB},
                            {"pid": child.pid, "used": 3 * GiB},
                            {"pid": stranger, "used": 5 * GiB},
                        ],
                    }
                ]
            }
        )
    )
    for k, v in fake_nvml_env(str(path)).items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    yield child
    child.kill()


def test_nvml_reading_lists_the_children_only(nvml_with_a_child):
    from jupyter_gpumem.collectors.nvml import Nvml

    nv = Nvml().read(0)
    assert nv.process_used == GiB
    assert nv.children == ((nvml_with_a_child.pid, 3 * GiB),)


def test_now_table_shows_each_child_under_its_device(nvml_with_a_child, monkeypatch):
    from jupyter_gpumem.collectors import Collector
    from jupyter_gpumem.collectors.allocator import TorchBackend
    from jupyter_gpumem.reporters import measurement_text

    monkeypatch.delitem(sys.modules, "torch", raising=False)  # NVML figures only
    m = Collector(TorchBackend()).measure()
    (d,) = m.devices
    with open(f"/proc/{nvml_with_a_child.pid}/comm") as f:
        name = f.read().strip()
    assert d.children == ((nvml_with_a_child.pid, name, 3 * GiB),)
    text = measurement_text(m)
    row = next(line for line in text.splitlines() if "child" in line)
    assert row.strip().startswith(f"child {nvml_with_a_child.pid}") and "3.00 GiB" in row
    sample = to_protocol(m)["devices"][0]
    assert sample["children"][0]["pid"] == nvml_with_a_child.pid
    assert sample["children"][0]["used"] == 3 * GiB


def test_host_rss_in_a_forked_child_is_the_childs():
    """The kept /proc descriptor is the parent's: a forked child reads its own figure
    (the child touches 256 MiB the parent never has)."""
    import os

    import psutil

    from jupyter_gpumem.collectors.host import host_rss

    parent = host_rss()
    assert parent is not None and abs(parent - psutil.Process().memory_info().rss) < 64 << 20
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its own figure after growing by 256 MiB
        try:
            before = host_rss()
            block = bytearray(256 << 20)  # zero-filled: every page touched
            after = host_rss()
            os.write(w, f"{before} {after} {len(block)}".encode())
        finally:
            os._exit(0)
    os.close(w)
    before, after, _ = (int(x) for x in os.read(r, 200).split())
    os.close(r)
    os.waitpid(pid, 0)
    assert after - before >= 250 << 20  # the child's own growth
    assert host_rss() < parent + (128 << 20)  # and not the parent's
