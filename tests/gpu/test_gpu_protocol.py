"""The panel protocol in a real kernel with real allocations (GPU machine)."""

from __future__ import annotations

import time

import pytest

from tests.test_kernel_protocol import Listener, start_kernel, stop_kernel, wait_execute

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.kernel,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
MiB = 1 << 20


@pytest.fixture(scope="module")
def kernel():
    km, kc = start_kernel({})
    listener = Listener(kc)
    wait_execute(kc, "%load_ext jupyter_gpumem\nimport torch\ntorch.empty(0, device='cuda')")
    yield kc, listener
    stop_kernel(km, kc, listener)


def allocated(listener):
    _, content, _, _ = listener.request("sample")
    return content["result"]["sample"]["devices"][0]


def test_sample_counts_exact_bytes(kernel):
    kc, listener = kernel
    base = allocated(listener)["allocated"]
    wait_execute(kc, "x = torch.empty(256 << 20, dtype=torch.uint8, device='cuda')")
    assert allocated(listener)["allocated"] - base == 256 * MiB
    wait_execute(kc, "del x")
    assert allocated(listener)["allocated"] == base


def test_live_samples_and_empty_cache_during_a_cell(kernel):
    kc, listener = kernel
    _, content, _, _ = listener.request("subscribe", interval_ms=100, client="gpu")
    comm_id = content["result"]["stream"]["comm_id"]
    base = allocated(listener)
    code = (
        "import time\n"
        "held = []\n"
        "for i in range(4):\n"
        "    held.append(torch.empty(128 << 20, dtype=torch.uint8, device='cuda'))\n"
        "    time.sleep(0.5)\n"
        "freed = torch.empty(512 << 20, dtype=torch.uint8, device='cuda'); del freed\n"
        "time.sleep(1.5)\n"
    )
    msg_id = kc.execute(code)
    time.sleep(2.6)  # all held, 512 MiB freed into the cache, cell still sleeping
    t0 = time.monotonic()
    _, content, rtt, _ = listener.request("empty_cache")
    assert content["status"] == "ok" and rtt < 0.5
    assert content["result"]["released"]["0"] >= 512 * MiB
    after = content["result"]["sample"]["devices"][0]
    assert after["allocated"] - base["allocated"] == 4 * 128 * MiB
    reply = kc.get_shell_msg(timeout=20)
    assert reply["parent_header"]["msg_id"] == msg_id
    t_reply = time.monotonic()
    samples = [
        m["content"]["data"]["sample"]["devices"][0]["allocated"]
        for t, m in listener.iopub
        if m["msg_type"] == "comm_msg"
        and m["content"]["comm_id"] == comm_id
        and m["content"]["data"]["type"] == "sample"
        and t < t_reply
    ]
    grown = sorted({a - base["allocated"] for a in samples})
    for k in range(1, 5):  # every step of the loop was seen while the cell ran
        assert k * 128 * MiB in grown, grown
    assert t0 < t_reply
    listener.request("unsubscribe", client="gpu")
    wait_execute(kc, "del held")


def test_who_names_the_holder_and_is_busy_while_a_cell_runs(kernel):
    kc, listener = kernel
    wait_execute(kc, "whoami = torch.empty(96 << 20, dtype=torch.uint8, device='cuda')")
    _, content, _, _ = listener.request("who", n=5)
    assert content["status"] == "ok", content
    dev = content["result"]["devices"][0]
    rows = {r["key"]: r for r in dev["by_variable"]["rows"]}
    assert rows["whoami"]["bytes"] == 96 * MiB and rows["whoami"]["detail"] == "tensor"
    assert sum(r["bytes"] for r in dev["by_variable"]["rows"]) == dev["by_variable"]["allocated"]
    assert dev["by_variable"]["allocated"] == allocated(listener)["allocated"]
    msg_id = kc.execute("import time; time.sleep(2)")
    time.sleep(0.5)
    _, content, rtt, _ = listener.request("who")
    assert content["error"]["code"] == "busy" and rtt < 1.0
    assert kc.get_shell_msg(timeout=10)["parent_header"]["msg_id"] == msg_id
    wait_execute(kc, "del whoami")


def test_tracking_from_the_panel_and_kept_lines_in_cell_markers(kernel):
    kc, listener = kernel
    _, content, _, _ = listener.request("track", enabled=True)
    assert content["status"] == "ok" and content["result"]["tracking"]["active"] is True
    _, content, _, _ = listener.request("subscribe", interval_ms=1000, client="who")
    comm_id = content["result"]["stream"]["comm_id"]
    wait_execute(
        kc, "%%gpumem -q\nq = 1\nkept = torch.empty(32 << 20, dtype=torch.uint8, device='cuda')"
    )
    time.sleep(0.3)
    cells = [
        m["content"]["data"]["cell"]
        for _, m in listener.iopub
        if m["msg_type"] == "comm_msg"
        and m["content"]["comm_id"] == comm_id
        and m["content"]["data"]["type"] == "cell"
    ]
    kept_at = cells[-1]["devices"][0]["kept_at"]
    assert kept_at[0]["line"] == 3 and kept_at[0]["bytes"] == 32 * MiB
    assert kept_at[0]["text"].startswith("kept = torch.empty(32 << 20")
    _, content, _, _ = listener.request("who")
    line_rows = content["result"]["devices"][0]["by_line"]["rows"]
    assert any(r["bytes"] == 32 * MiB and r["example"] == "held by kept" for r in line_rows)
    failed = wait_execute(
        kc,
        "def g():\n    t = torch.empty(64 << 20, dtype=torch.uint8,"
        " device='cuda')\n    raise ValueError\ng()",
    )
    assert failed["content"]["status"] == "error"
    _, content, _, _ = listener.request("release_traceback")
    assert content["result"]["freed"]["0"] == 64 * MiB
    listener.request("unsubscribe", client="who")
    listener.request("track", enabled=False)
    wait_execute(kc, "del kept")
