"""End to end through a real ipykernel started with jupyter_client."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def kernel():
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    yield kc
    kc.stop_channels()
    km.shutdown_kernel(now=True)


def execute(kc, code: str, timeout: float = 60):
    """Run code; return (reply content, [iopub messages of this request])."""
    msg_id = kc.execute(code)
    msgs = []
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        msgs.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    reply = kc.get_shell_msg(timeout=timeout)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=timeout)
    return reply["content"], msgs


def of_type(msgs, t):
    return [m["content"] for m in msgs if m["msg_type"] == t]


def test_cell_report_through_kernel(kernel):
    reply, _ = execute(kernel, "%load_ext gpumem")
    assert reply["status"] == "ok"
    reply, msgs = execute(kernel, "%%gpumem\nx = 20\nx * 2")
    assert reply["status"] == "ok"
    results = of_type(msgs, "execute_result")
    assert [r["data"]["text/plain"] for r in results] == ["40"]
    displays = of_type(msgs, "display_data")
    assert len(displays) == 1
    data = displays[0]["data"]
    assert data["text/plain"].startswith(f"gpumem: cell [{reply['execution_count']}] ok in ")
    assert data["text/html"].startswith('<div class="jp-GpuMem-report">')


def test_error_cell_traceback_and_report(kernel):
    reply, msgs = execute(kernel, "%%gpumem\ny = 1\nraise ValueError('boom')")
    assert reply["status"] == "error" and reply["ename"] == "ValueError"
    tb = "\n".join(of_type(msgs, "error")[0]["traceback"])
    assert "line 3" in tb
    report = of_type(msgs, "display_data")[0]["data"]["text/plain"]
    assert "FAILED (ValueError: boom)" in report


def test_usage_error_does_not_run_body(kernel):
    reply, msgs = execute(kernel, "%%gpumem --nope\nside_effect = 1")
    assert reply["status"] == "error" and reply["ename"] == "UsageError"
    reply, msgs = execute(kernel, "'side_effect' in globals()")
    assert of_type(msgs, "execute_result")[0]["data"]["text/plain"] == "False"


def test_await_and_auto_mode(kernel):
    execute(kernel, "%gpumem auto on")
    reply, msgs = execute(kernel, "import asyncio\nawait asyncio.sleep(0.01)\n'done'")
    assert reply["status"] == "ok"
    assert of_type(msgs, "execute_result")[0]["data"]["text/plain"] == "'done'"
    lines = [d["data"]["text/plain"] for d in of_type(msgs, "display_data")]
    assert len(lines) == 1 and lines[0].startswith(f"gpumem [{reply['execution_count']}] ")
    execute(kernel, "%gpumem auto off")
    reply, msgs = execute(kernel, "import sys; 'torch' in sys.modules")
    assert of_type(msgs, "execute_result")[0]["data"]["text/plain"] == "False"
