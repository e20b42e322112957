"""The demo's kernel plays the notebook's recording: a real ipykernel over jupyter_client,
started from the kernel spec `jupyter-gpumem demo` writes, runs every code cell of
examples/demo.ipynb as Run All does, without a GPU and without importing torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jupyter_gpumem import demo
from jupyter_gpumem.testing.player import DemoRecording, key

pytestmark = pytest.mark.kernel

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = json.loads((ROOT / "examples" / "demo.ipynb").read_text())
RECORDING = DemoRecording.load(str(demo.recording()))
LABEL = RECORDING.label()
STATE = "__import__('jupyter_gpumem._ipython', fromlist=['current']).current()"
DEVICES = f"{STATE}.collector.measure().devices"
QUERIES = {
    "allocated": f"[d.allocator and d.allocator.allocated for d in {DEVICES}]",
    "rows": f"len({STATE}.history)",
    "last_row": f"[[list(d) for d in r.devices] for r in {STATE}.history.last(1)]",
    "torch": "'torch' in __import__('sys').modules",
}


def code_cells() -> list[dict]:
    return [c for c in NOTEBOOK["cells"] if c["cell_type"] == "code"]


def text(value) -> str:
    return "".join(value) if isinstance(value, list) else value


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    from jupyter_client.manager import KernelManager

    folder = tmp_path_factory.mktemp("demo-kernels")
    demo.write_kernel_spec(folder)
    mp = pytest.MonkeyPatch()
    mp.setenv("JUPYTER_PATH", str(folder))  # as the demo's server has it
    km = KernelManager(kernel_name="python3")
    assert km.kernel_spec.argv[-1] == "--ext=jupyter_gpumem.testing.player"
    km.start_kernel(cwd=str(tmp_path_factory.mktemp("demo-cwd")))
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    yield kc
    kc.stop_channels()
    km.shutdown_kernel(now=True)
    mp.undo()


def execute(kc, code: str, timeout: float = 60):
    """Run a cell as JupyterLab does; (reply, iopub contents by type, user expressions)."""
    msg_id = kc.execute(code, user_expressions=QUERIES, stop_on_error=False)
    outputs: list[tuple[str, dict]] = []
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        t = msg["msg_type"]
        if t == "status" and msg["content"]["execution_state"] == "idle":
            break
        if t in ("stream", "display_data", "execute_result", "error"):
            outputs.append((t, msg["content"]))
    reply = kc.get_shell_msg(timeout=timeout)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=timeout)
    found = {
        name: eval(r["data"]["text/plain"])  # (reprs of lists, ints, bools)
        for name, r in reply["content"]["user_expressions"].items()
        if r["status"] == "ok"
    }
    return reply["content"], outputs, found


def unlabelled(t: str, content: dict) -> dict:
    """An output as the notebook recorded it: the replay label taken off (each must have it)."""
    if t == "stream":
        assert content["text"].startswith(f"[{LABEL}]\n")
        return {"name": content["name"], "text": content["text"].removeprefix(f"[{LABEL}]\n")}
    if t == "error":
        assert content["traceback"][0] == f"[{LABEL}]"
        return {k: content[k] for k in ("ename", "evalue")} | {
            "traceback": content["traceback"][1:]
        }
    data = dict(content["data"])
    assert data["text/plain"].startswith(f"[{LABEL}]\n")
    data["text/plain"] = data["text/plain"].removeprefix(f"[{LABEL}]\n")
    if "text/html" in data:
        head, _, rest = data["text/html"].partition("</div>")
        assert "gpumem-replay-label" in head and LABEL in head
        data["text/html"] = rest
    return {"data": data}


def recorded(output: dict) -> dict:
    t = output["output_type"]
    if t == "stream":
        return {"name": output["name"], "text": text(output["text"])}
    if t == "error":
        return {k: output[k] for k in ("ename", "evalue", "traceback")}
    return {"data": {k: text(v) for k, v in output["data"].items()}}


@pytest.fixture(scope="module")
def run_all(kernel):
    """Every code cell in order, as Run All sends them (a raises-exception cell does not
    stop the queue)."""
    return [(cell, *execute(kernel, text(cell["source"]))) for cell in code_cells()]


def test_run_all_shows_each_cells_recorded_outputs_marked_replay(run_all):
    assert len(run_all) == len(RECORDING.cells) == 16
    for cell, reply, outputs, _ in run_all:
        assert reply["execution_count"] == cell["execution_count"]
        raises = "raises-exception" in cell["metadata"].get("tags", [])
        assert reply["status"] == ("error" if raises else "ok"), text(cell["source"])
        if raises:
            assert reply["ename"] == "OutOfMemoryError"
        got = [unlabelled(t, c) for t, c in outputs]
        assert got == [recorded(o) for o in cell["outputs"]], text(cell["source"])


def test_the_kernels_figures_after_each_cell_are_the_recorded_ones(run_all):
    """What the panel and `%gpumem` read after a cell is what the GPU read after it; the
    history gets each measured cell's row as its report gave it, in the same figures."""
    rows = 0
    checked = 0
    for (cell, reply, _, found), rec in zip(run_all, RECORDING.cells, strict=True):
        assert key(text(cell["source"])) == key(rec.source)
        rows += len(rec.history)
        if reply["status"] != "ok":
            continue  # (a kernel evaluates no user expressions after an error)
        checked += 1
        after = rec.frames[-1][1]
        expected = [
            d["memory_stats"]["allocated_bytes.all.current"] if d.get("memory_stats") else None
            for d in after["devices"]
        ]
        assert found["allocated"] == expected, rec.source
        assert found["rows"] == rows
        if rec.history:
            assert found["last_row"] == [rec.history[-1][-1]]
            assert found["last_row"][0][0][1] == expected[0]  # the row's allocated = the panel's
        assert found["torch"] is False  # nothing played imports torch
    assert checked == 15 and rows == 2


def test_the_out_of_memory_cell_raises_the_recorded_error_and_then_its_report(run_all):
    cell, reply, outputs, _ = next(r for r in run_all if r[1]["status"] == "error")
    error = next(o for o in cell["outputs"] if o["output_type"] == "error")
    assert (reply["ename"], reply["evalue"]) == (error["ename"], error["evalue"])
    assert "Tried to allocate 2.00 GiB" in reply["evalue"]
    assert [t for t, _ in outputs] == ["error", "display_data"]  # the report after the error
    assert "out of memory" in outputs[1][1]["data"]["text/plain"].lower()


def test_a_cell_not_in_the_recording_runs_here_and_says_what_this_machine_has(kernel, run_all):
    before = run_all[-1][3]
    reply, outputs, found = execute(kernel, "%%gpumem\ny = 1")
    assert reply["status"] == "ok"
    report = outputs[-1][1]["data"]["text/plain"]
    assert "torch is not imported" in report and "replay" not in report
    assert found["rows"] == before["rows"] + 1 and found["last_row"] == [[]]
    # between cells the panel is back on the recording's last reading
    assert found["allocated"] == before["allocated"]


def test_a_gpumem_command_out_of_its_place_asks_about_the_replayed_state(kernel, run_all):
    """`%gpumem` is recorded as the third cell (256 MiB allocated then); run after the last
    cell it answers with the state now, and says it is a replay."""
    now = run_all[-1][3]["allocated"][0]
    reply, outputs, found = execute(kernel, "%gpumem")
    assert reply["status"] == "ok" and found["allocated"][0] == now
    plain = outputs[-1][1]["data"]["text/plain"]
    assert plain.startswith("replay: readings recorded on an NVIDIA")
    mib = f"{now / (1 << 20):.2f} MiB"
    assert mib in plain


def test_an_edited_recorded_cell_runs_for_real(kernel, run_all):
    first = text(code_cells()[0]["source"])
    reply, _, found = execute(kernel, first + "\nz = 41 + 1  # edited")
    assert reply["status"] == "ok"  # this machine's torch (CPU) is imported for real
    assert found["torch"] is True
    reply, outputs, _ = execute(kernel, "%%gpumem\nw = torch.ones(4)")
    report = outputs[-1][1]["data"]["text/plain"]
    assert "CPU-only build" in report and "replay" not in report
