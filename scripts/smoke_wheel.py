"""Smoke test of an installed jupyter-gpumem (`make wheel-test` runs it in a clean virtual
environment with the built wheel): what a user gets from `pip install`.

1. The package imports from the environment's site-packages, not from a source tree.
2. A real kernel (jupyter_client) runs `%load_ext gpumem` and a `%%gpumem` cell: the cell's
   own output is there and so is a report for that cell.
3. `jupyter labextension list` lists jupyter-gpumem as enabled and OK, and `jupyter server
   extension list` lists jupyter_gpumem as enabled.
4. The demo's recording ships in the wheel: a kernel with `jupyter-gpumem demo`'s
   environment answers `%gpumem` with the replayed H200 readings, marked as a replay.
5. `jupyter-gpumem demo --dir D --print-env` and the demo notebook's copy work.

Exits non-zero with the reason on the first failure.
"""

from __future__ import annotations

import os
import re
import site
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent


def check(ok: bool, what: str) -> None:
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        sys.exit(1)


def run_cells(cells: list[str], env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Run ``cells`` in a fresh kernel; the outputs of each, as (msg_type, content)."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", env={**os.environ, **(env or {})})
    try:
        results = []
        for source in cells:
            outputs: list[dict[str, Any]] = []
            reply = kc.execute_interactive(source, timeout=120, output_hook=outputs.append)
            results.append({"reply": reply["content"], "outputs": outputs})
        return results
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def text_of(outputs: list[dict[str, Any]]) -> str:
    parts = []
    for m in outputs:
        c = m["content"]
        if m["msg_type"] == "stream":
            parts.append(c["text"])
        elif m["msg_type"] in ("display_data", "execute_result"):
            parts.append(c["data"].get("text/plain", ""))
        elif m["msg_type"] == "error":
            parts.append("\n".join(c["traceback"]))
    return "\n".join(parts)


def jupyter(*args: str) -> str:
    out = subprocess.run([str(BIN / "jupyter"), *args], capture_output=True, text=True, check=False)
    return re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)


def main() -> None:
    import jupyter_gpumem

    paths = sysconfig.get_paths()
    sites = {
        Path(p).resolve() for p in (*site.getsitepackages(), paths["purelib"], paths["platlib"])
    }
    where = Path(jupyter_gpumem.__file__).resolve()
    installed = next((s for s in sites if s in where.parents), None)
    check(installed is not None, f"jupyter_gpumem imports from {where.parent}, a site-packages")

    # 2. a real kernel, the extension, a measured cell
    cell = run_cells(["%load_ext gpumem", "%%gpumem\nanswer = 6 * 7\nprint(answer)"])
    check(cell[0]["reply"]["status"] == "ok", "%load_ext gpumem in a real kernel")
    text = text_of(cell[1]["outputs"])
    check(cell[1]["reply"]["status"] == "ok", "the %%gpumem cell ran")
    check("42" in text, "the cell's own output is shown")
    check(re.search(r"gpumem: cell \[2\]", text) is not None, "a report for cell [2] follows it")

    # 3. the JupyterLab extension and the server extension
    labext = jupyter("labextension", "list")
    check(
        re.search(r"jupyter-gpumem v\S+ enabled\s+OK", labext) is not None,
        "jupyter labextension list: jupyter-gpumem enabled OK",
    )
    server = jupyter("server", "extension", "list")
    check(
        re.search(r"jupyter_gpumem enabled", server) is not None,
        "jupyter server extension list: jupyter_gpumem enabled",
    )

    # 4. the demo's recording, replayed in a real kernel
    from jupyter_gpumem.demo import kernel_env, recording

    check(installed in recording().resolve().parents, "the recording ships in the wheel")
    demo = run_cells(["%load_ext gpumem", "%gpumem"], env=kernel_env())
    text = text_of(demo[1]["outputs"])
    check("NVIDIA H200" in text, "%gpumem replays the H200 readings")
    check("replay" in text.lower(), "%gpumem says that it is a replay")

    # 5. the demo's folder and notebook
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "demo"
        out = subprocess.run(
            [str(BIN / "jupyter-gpumem"), "demo", "--print-env"],
            capture_output=True,
            text=True,
            check=False,
        )
        check(
            out.returncode == 0 and "JUPYTER_GPUMEM_REPLAY=" in out.stdout,
            "jupyter-gpumem demo --print-env",
        )
        from jupyter_gpumem.demo import prepare

        demo_folder, _ = prepare(str(folder))
        check((demo_folder / "demo.ipynb").is_file(), "the demo notebook ships too")
    print("smoke test of the installed wheel: all passed")


if __name__ == "__main__":
    main()
