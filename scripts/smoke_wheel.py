"""Smoke test of an installed jupyter-gpumem (`make wheel-test` runs it in a clean virtual
environment with the built wheel): what a user gets from `pip install`.

1. The package imports from the environment's site-packages, not from a source tree.
2. A real kernel (jupyter_client) runs `%load_ext gpumem` and a `%%gpumem` cell: the cell's
   own output is there and so is a report for that cell.
3. `jupyter labextension list` lists jupyter-gpumem as enabled and OK, and `jupyter server
   extension list` lists jupyter_gpumem as enabled.
4. The demo's recording ships in the wheel: a kernel of `jupyter-gpumem demo`'s kernel
   spec plays the demo notebook's first cells, each output marked as a replay.
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


def run_cells(
    cells: list[str], env: dict[str, str] | None = None, kernel: str = "python3"
) -> list[dict[str, Any]]:
    """Run ``cells`` in a fresh kernel; the outputs of each, as (msg_type, content)."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name=kernel, env={**os.environ, **(env or {})})
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

    # 4. the demo's recording, played by a kernel of the demo's kernel spec
    from jupyter_gpumem.demo import notebook_source, recording, write_kernel_spec

    check(installed in recording().resolve().parents, "the recording ships in the wheel")
    import json

    nb = json.loads(notebook_source().read_text())
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    with tempfile.TemporaryDirectory() as kernels:
        write_kernel_spec(Path(kernels))
        os.environ["JUPYTER_PATH"] = kernels  # as the demo's server has it
        try:
            played = run_cells(code[:3])
        finally:
            del os.environ["JUPYTER_PATH"]
    text = text_of(played[2]["outputs"])
    check("NVIDIA H200" in text, "the demo's kernel plays its third cell (%gpumem) as recorded")
    check("replay" in text.lower(), "the played output says that it is a replay")

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
            out.returncode == 0 and "JUPYTER_GPUMEM_DEMO_RECORDING=" in out.stdout,
            "jupyter-gpumem demo --print-env",
        )
        from jupyter_gpumem.demo import prepare

        demo_folder, _ = prepare(str(folder))
        check((demo_folder / "demo.ipynb").is_file(), "the demo notebook ships too")
    print("smoke test of the installed wheel: all passed")


if __name__ == "__main__":
    main()
