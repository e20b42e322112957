"""The tool never imports torch, never starts CUDA, never collects garbage on its own."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest


def _run(script: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_no_torch_import_no_gc():
    r = _run(
        """
        import gc, json, sys
        from IPython.core.interactiveshell import InteractiveShell
        collections = []
        gc.callbacks.append(lambda phase, info: phase == "start" and collections.append(info))
        gc.disable()  # only explicit gc.collect() calls would now show up
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "gpumem")
        for cell in ["%gpumem", "%gpumem auto on", "a = 1", "%%gpumem -o rep\\nb = [0] * 10",
                     "%gpumem history", "%gpumem auto off"]:
            ip.run_cell(cell)
        print(json.dumps({"torch": "torch" in sys.modules, "gc": len(collections),
                          "state": ip.user_ns["rep"].after.state}))
        """
    )
    assert r == {"torch": False, "gc": 0, "state": "no_torch"}


def test_cpu_only_torch_is_a_clear_statement():
    r = _run(
        """
        import json
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.utils.capture import capture_output
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "gpumem")
        import torch
        if torch.version.cuda or torch.version.hip:
            print(json.dumps({"skip": "torch is a GPU build here"}))
            raise SystemExit
        with capture_output() as cap:
            ip.run_cell("import torch")
            res = ip.run_cell("%%gpumem -o rep\\nt = torch.ones(1000)")
        rep = ip.user_ns["rep"]
        print(json.dumps({"ok": res.success, "state": rep.after.state, "msg": rep.after.message,
                          "text": cap.outputs[0].data["text/plain"], "err": cap.stderr}))
        """
    )
    if "skip" in r:
        pytest.skip(r["skip"])
    assert r["ok"] and r["state"] == "cpu_only"
    assert r["msg"].startswith("torch 2.") and "CPU-only build" in r["msg"]
    assert r["msg"] in r["text"] and r["err"] == ""


def test_import_is_cheap():
    r = _run(
        """
        import json, sys
        import jupyter_gpumem, gpumem
        print(json.dumps({"mods": sorted(m for m in ("torch", "IPython", "pandas", "pynvml")
                                         if m in sys.modules)}))
        """
    )
    assert r == {"mods": []}
