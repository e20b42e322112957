"""Run the demo notebook on a GPU and record, cell by cell, what its kernel went through.

Run on the GPU machine (writes the notebook's outputs and the recording the demo's kernel
plays back without a GPU, ``jupyter_gpumem/testing/player.py``):

  python3 examples/make_demo.py
  python3 tests/gpu/record_demo.py examples/demo.ipynb \
      jupyter_gpumem/testing/recorded/demo_cells.json

The kernel is a real one (nbclient over jupyter_client) started with this module as an
IPython extension (``--ext``). For each cell it keeps:

- the raw allocator and NVML readings sampled every 50 ms while the cell ran, with the
  reading before and the one after (the same raw format as ``record_fixtures.py``);
- the history rows and the panel's cell markers the cell made (from the session itself);
- what ``who`` and the segment map read after the cell (the snapshot with its sites, the
  namespace walk's references, the cell names: ``record_attribution.py``'s format), and
  for a cell that ran out of memory the allocator's OOM event.
"""

from __future__ import annotations

import datetime
import json
import linecache
import os
import sys
import threading
import time
from typing import Any

RECORDING_ENV = "GPUMEM_DEMO_RECORDING"
PERIOD_S = 0.05


def _nvml_devices(pid: int) -> list[dict[str, Any]]:
    try:
        import pynvml

        pynvml.nvmlInit()
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            mine = [
                p.usedGpuMemory
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)
                if p.pid == pid
            ]
            name = pynvml.nvmlDeviceGetName(h)
            out.append(
                {
                    "name": name.decode() if isinstance(name, bytes) else name,
                    "total": int(mem.total),
                    "used": int(mem.used),
                    "process_used": int(mine[0]) if mine else None,
                }
            )
        return out
    except Exception:
        return []


def raw_frame() -> dict[str, Any]:
    """What the kernel's GPU looks like now, raw; never initialises CUDA."""
    nv = _nvml_devices(os.getpid())
    t = sys.modules.get("torch")
    cuda = getattr(t, "cuda", None) if t is not None else None
    if cuda is None or not hasattr(cuda, "is_initialized"):
        from jupyter_gpumem.collectors.allocator import TorchBackend

        r = TorchBackend().read()
        devices = [
            {"index": i, "name": n["name"], "backend": "cuda", "initialized": False, "nvml": n}
            for i, n in enumerate(nv)
        ]
        return {"state": r.state, "message": r.message, "torch_version": None, "devices": devices}
    initialized = cuda.is_initialized()
    devices = []
    for i, n in enumerate(nv):
        ready = initialized and bool(t._C._cuda_hasPrimaryContext(i))
        d: dict[str, Any] = {"index": i, "name": n["name"], "backend": "cuda", "initialized": ready}
        if ready:
            d["memory_stats"] = dict(cuda.memory_stats(i))
            d["mem_get_info"] = list(cuda.mem_get_info(i))
            d["fraction"] = float(t._C._cuda_getMemoryFraction(i))
        d["nvml"] = n
        devices.append(d)
    return {
        "state": "ok" if initialized else "not_initialized",
        "message": ""
        if initialized
        else "CUDA is not initialised in this kernel yet: NVML figures only",
        "torch_version": t.__version__,
        "caching": True,
        "devices": devices,
    }


class DemoRecorder:
    def __init__(self, ip: Any) -> None:
        self.ip = ip
        self.before = raw_frame()
        self.cells: list[dict[str, Any]] = []
        self.reports: list[Any] = []
        self._current: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._listening = False
        ip.events.register("pre_run_cell", self.pre)
        ip.events.register("post_run_cell", self.post)

    def _session(self) -> Any:
        from jupyter_gpumem._ipython import current

        return current()

    def pre(self, info: Any) -> None:
        session = self._session()
        if session is not None and not self._listening:
            session.report_listeners.append(self.reports.append)
            self._listening = True
        start = time.perf_counter()
        cell = {"source": info.raw_cell, "frames": [[0.0, raw_frame()]]}
        self._current = cell
        self._stop.clear()

        def sample() -> None:
            while not self._stop.wait(PERIOD_S):
                try:
                    cell["frames"].append([time.perf_counter() - start, raw_frame()])
                except Exception:
                    pass  # torch half imported: the next one works

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        cell["_start"] = start

    def post(self, result: Any) -> None:
        cell, self._current = self._current, None
        if cell is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        t = time.perf_counter() - cell.pop("_start")
        cell["frames"].append([t, raw_frame()])
        cell["duration_s"] = t
        cell["execution_count"] = result.execution_count
        session = self._session()
        torch = sys.modules.get("torch")
        if session is not None and torch is not None and torch.cuda.is_initialized():
            cell["attribution"] = self.attribution(session, torch)
            error = result.error_in_exec
            if error is not None and "OutOfMemoryError" in type(error).__name__:
                ev = session.collector.ooms[-1]
                nv = cell["frames"][-1][1]["devices"][0]["nvml"]
                cell["attribution"]["oom"] = [ev.device, ev.requested, ev.allowed, ev.free]
                cell["attribution"]["device"] = {
                    "total": nv["total"],
                    "device_used": nv["used"],
                    "process_used": nv["process_used"],
                }
        self.cells.append(cell)

    def attribution(self, session: Any, torch: Any) -> dict[str, Any]:
        from jupyter_gpumem.analysis.sites import default_library_dirs
        from jupyter_gpumem.collectors.snapshot import read_snapshot
        from tests.gpu.record_attribution import trimmed

        source = session.who.source
        fmap = dict(self.ip.compile._filename_map)
        snap = read_snapshot(torch)
        ws = source.workspace
        walk = source.walker(torch).walk(ws.roots(torch.optim.Optimizer) + ws.traceback_roots())
        return {
            "segments": trimmed(snap.segments, set(fmap)),
            "allocator_settings": snap.settings,
            "filename_map": fmap,
            "lines": {
                f: {
                    str(i): linecache.getline(f, i).rstrip("\n")
                    for i in range(1, 40)
                    if linecache.getline(f, i)
                }
                for f in fmap
            },
            "library_dirs": list(default_library_dirs()),
            "before": [list(k) for k in session.who.recording.before if k[0] == 0],
            "refs": [
                [r.device, r.address, r.nbytes, r.owner, r.via, r.path, r.order]
                for r in walk.refs
                if r.device == 0
            ],
        }

    def dump(self, path: str, meta: dict[str, Any]) -> None:
        from jupyter_gpumem.protocol.convert import to_protocol

        session = self._session()
        rows = list(session.history) if session is not None else []
        for cell in self.cells:
            n = cell["execution_count"]
            cell["history"] = [
                [*row[:-1], [list(d) for d in row.devices]]
                for row in rows
                if row.execution_count == n
            ]
            cell["markers"] = [to_protocol(r) for r in self.reports if r.execution_count == n]
        with open(path, "w") as f:
            json.dump({"meta": meta, "before": self.before, "cells": self.cells}, f)


def load_ipython_extension(ip: Any) -> None:
    ip.gpumem_demo_recorder = DemoRecorder(ip)


def main(notebook: str, out: str) -> None:
    from importlib.metadata import version

    import nbformat
    from jupyter_core.utils import run_sync
    from nbclient import NotebookClient

    # (asked of NVML: a CUDA context here would count in the kernel's device figures)
    meta = {
        "device": _nvml_devices(os.getpid())[0]["name"],
        "torch": version("torch"),
        "recorded": datetime.date.today().isoformat(),
        "period_s": PERIOD_S,
    }
    nb = nbformat.read(notebook, as_version=4)
    client = NotebookClient(
        nb, timeout=900, kernel_name="python3", extra_arguments=["--ext=tests.gpu.record_demo"]
    )
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                client.execute_cell(cell, index)
        run_sync(client.kc.execute_interactive)(
            f"get_ipython().gpumem_demo_recorder.dump({os.path.abspath(out)!r}, {meta!r})",
            silent=True,
            timeout=120,
        )
    nb.metadata["jupyter_gpumem"] = {
        "outputs": {"gpu": meta["device"], "torch": meta["torch"], "date": meta["recorded"]}
    }
    nbformat.write(nb, notebook)
    with open(out) as f:
        data = json.load(f)
    cells = data["cells"]
    code = [c for c in nb.cells if c.cell_type == "code"]
    for cell, nb_cell in zip(cells, code, strict=True):  # in the order they ran
        assert cell["source"] == nb_cell.source, (cell["source"], nb_cell.source)
        cell["outputs"] = nb_cell.outputs
    with open(out, "w") as f:
        json.dump(data, f)
    print(f"{notebook}: outputs from {meta['device']}; {out}: {len(cells)} cells recorded")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
