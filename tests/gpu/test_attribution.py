"""Who holds the GPU memory, on a real GPU: every figure against what the cells allocated.

Cells run with ``store_history=True`` so that each has its own execution count, as in a
notebook; ``In[N] line L`` is checked against the count IPython gave the cell.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
MiB = 1 << 20
NAMES = (
    "a",
    "b",
    "x",
    "y",
    "z",
    "v",
    "base",
    "view",
    "model",
    "opt",
    "xb",
    "total",
    "loss",
    "acts",
    "blocks",
    "big",
    "keep",
    "f",
    "make",
    "rep",
    "h",
    "out",
)


def cell(ip, code: str):
    """Run a cell as a notebook does (its own execution count); capture its outputs."""
    from IPython.utils.capture import capture_output

    with capture_output() as cap:
        result = ip.run_cell(code, store_history=True)
    texts = [o.data.get("text/plain", "") for o in cap.outputs]
    return result, texts, cap


def who(by="variable", device=0):
    import jupyter_gpumem

    return jupyter_gpumem.who(device=device, by=by, n=50)


def block_bytes(tensors):
    """What the allocator counts for these tensors: the sizes of their storages' blocks
    (a block can be larger than the tensor when the allocator did not split it)."""
    sizes = {
        b["address"]: b["size"]
        for s in torch.cuda.memory_snapshot()
        for b in s["blocks"]
        if b["state"] == "active_allocated"
    }
    return sum(sizes[p] for p in {t.untyped_storage().data_ptr() for t in tensors})


def row(df, key, detail_prefix=""):
    rows = df[(df["key"] == key) & df["detail"].str.startswith(detail_prefix)]
    assert len(rows) == 1, (key, detail_prefix, df.to_string())
    return rows.iloc[0]


@pytest.fixture
def tip(ip):
    """Torch on cuda:0 with a context, an empty cache and allocation tracking on."""
    cell(ip, "import torch\ntorch.empty(0, device='cuda:0')\ntorch.cuda.empty_cache()")
    cell(ip, "%gpumem track on")
    yield ip
    cell(ip, "%gpumem limit off")
    cell(ip, "%gpumem track off")
    cell(ip, "%gpumem auto off")
    for name in NAMES:
        ip.user_ns.pop(name, None)
    for name in [n for n in ip.user_ns if n[1:].isdigit() and n.startswith("_")]:
        del ip.user_ns[name]  # _5 and the like keep outputs alive
    ip.user_ns.get("Out", {}).clear()
    for name in ("_", "__", "___"):
        ip.user_ns[name] = ""
    from jupyter_gpumem._ipython.cells import release_traceback

    release_traceback(ip)
    gc.collect()
    torch.cuda.empty_cache()


def test_lines_of_a_cell_get_their_exact_bytes(tip):
    code = (
        "%%gpumem -o rep\n"
        "a = torch.empty(3 << 20, dtype=torch.uint8, device='cuda')\n"
        "# a comment\n"
        "b = torch.empty(5 << 20, dtype=torch.uint8, device='cuda')\n"
    )
    res, texts, _ = cell(tip, code)
    assert res.success
    n = res.execution_count
    att = tip.user_ns["rep"].device_attribution(0)
    assert [(s.line, s.bytes, s.blocks) for s in att.lines] == [(4, 5 * MiB, 1), (2, 3 * MiB, 1)]
    assert att.lines[0].text == "b = torch.empty(5 << 20, dtype=torch.uint8, device='cuda')"
    assert "5.00 MiB at line 4 `b = torch.empty(5 << 20" in texts[0]
    df = who("line")
    r4 = row(df, f"In[{n}] line 4")
    assert (r4["bytes"], r4["blocks"]) == (5 * MiB, 1)
    assert r4["example"] == "held by b"
    assert row(df, f"In[{n}] line 2")["bytes"] == 3 * MiB
    assert df["bytes"].sum() == torch.cuda.memory_allocated(0)


def test_function_from_another_cell_and_the_library_frame(tip):
    defined, _, _ = cell(
        tip, "def make(n):\n    return torch.zeros(n, dtype=torch.uint8, device='cuda')\n"
    )
    res, _, _ = cell(tip, "%%gpumem -o rep\nx = 1\ny = make(7 << 20)\n")
    att = tip.user_ns["rep"].device_attribution(0)
    # per cell: the line of this cell that led to the allocation
    assert [(s.line, s.bytes) for s in att.lines] == [(3, 7 * MiB)]
    site = att.lines[0].site
    # the innermost user frame: the function's line, in the cell that defined it
    assert site.label == f"In[{defined.execution_count}] line 2"
    assert site.function == "make"
    df = who("line")
    r = row(df, f"In[{defined.execution_count}] line 2")
    assert r["bytes"] == 7 * MiB and r["detail"].startswith("make(): `return torch.zeros(")
    by_cell = who("cell")
    assert row(by_cell, f"In[{res.execution_count}]")["bytes"] == 7 * MiB


def test_blocks_from_before_tracking_are_said_so(ip):
    cell(
        ip,
        "import torch\ntorch.cuda.empty_cache()\nold = torch.empty(9 << 20, dtype=torch.uint8,"
        " device='cuda')",
    )
    cell(ip, "%gpumem track on")
    try:
        df = who("line")
        r = row(df, "allocated before tracking began")
        assert r["bytes"] >= 9 * MiB and r["kind"] == "untracked"
    finally:
        cell(ip, "%gpumem track off")
        ip.user_ns.pop("old", None)


def test_a_view_and_its_base_count_once(tip):
    cell(tip, "base = torch.empty(64 << 20, dtype=torch.uint8, device='cuda')\nview = base[1024:]")
    df = who()
    assert row(df, "base")["bytes"] == 64 * MiB
    assert "view" not in set(df["key"])  # the same storage: counted for base only
    assert df["bytes"].sum() == torch.cuda.memory_allocated(0)


def test_module_parameters_gradients_and_optimizer_state(tip):
    cell(
        tip,
        "model = torch.nn.Linear(1024, 1024).cuda()\n"
        "opt = torch.optim.Adam(model.parameters())\n"
        "model(torch.ones(8, 1024, device='cuda')).sum().backward()\n"
        "opt.step()",
    )
    model, opt = tip.user_ns["model"], tip.user_ns["opt"]
    params = list(model.parameters())
    state = [v for s in opt.state.values() for v in s.values() if v.is_cuda]  # exp_avg(_sq)
    assert len(state) == 4
    df = who()
    assert row(df, "model", "module parameters")["bytes"] == block_bytes(params)
    assert block_bytes(params) >= 1024 * 1024 * 4 + 4096
    assert row(df, "model", "gradients")["bytes"] == block_bytes([p.grad for p in params])
    assert row(df, "opt", "optimizer state")["bytes"] == block_bytes(state)
    assert "parameters the optimizer holds" not in "".join(df["detail"])


def test_out_holds_a_tensor(tip):
    res, _, _ = cell(tip, "torch.ones(1 << 20, device='cuda')")  # 4 MiB shown as Out[N]
    n = res.execution_count
    df = who()
    r = row(df, f"Out[{n}]")
    assert r["bytes"] == 4 * MiB and r["detail"].startswith("output history")


def test_total_plus_loss_leak_is_the_graph_of_total(tip):
    cell(
        tip,
        "model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),"
        " torch.nn.Linear(4096, 1)).cuda()\n"
        "xb = torch.randn(512, 1024, device='cuda')\n"
        "model(xb).sum().item()  # cuBLAS takes its workspace once, here\n"
        "total = torch.zeros((), device='cuda')",
    )
    base = torch.cuda.memory_allocated(0)
    step = 512 * 4096 * 4 + 2048  # the ReLU output and the squared output (512 floats)
    held = []
    for _i in range(5):
        res, _, _ = cell(
            tip, "%%gpumem -o rep\nloss = model(xb).square().mean()\ntotal = total + loss\ndel loss"
        )
        assert res.success
        rep = tip.user_ns["rep"]
        assert rep.device(0).allocated_delta == step
        att = rep.device_attribution(0)
        assert [(s.line, s.bytes) for s in att.lines] == [(2, step), (3, 512)]
        df = who()
        held.append(row(df, "total", "autograd graph")["bytes"])
    assert held == [step * k for k in range(1, 6)]
    assert torch.cuda.memory_allocated(0) - base == 5 * step


def test_traceback_holding_512_mib_is_named_and_released_exactly(tip):
    cell(
        tip,
        "keep = torch.empty(1 << 20, dtype=torch.uint8, device='cuda')\n"
        "def f():\n"
        "    h = torch.empty(512 << 20, dtype=torch.uint8, device='cuda')\n"
        "    raise ValueError('boom')",
    )
    defined = tip.execution_count - 1
    res, texts, _ = cell(tip, "%%gpumem -o rep\nf()")
    assert not res.success
    rep = tip.user_ns["rep"]
    top = rep.traceback.holdings[0]
    assert (top.name, top.bytes) == ("h", 512 * MiB)
    assert top.frame == f"f() at In[{defined}] line 4"  # where f was when it raised
    assert "the kept traceback holds 512.00 MiB" in texts[0]
    before = torch.cuda.memory_allocated(0)
    _, _, cap = cell(tip, "%gpumem release-traceback")
    assert before - torch.cuda.memory_allocated(0) == 512 * MiB
    assert "freed cuda:0 512.00 MiB" in cap.stdout
    assert tip.user_ns["keep"].numel() == 1 << 20  # nothing the user had is lost
    assert getattr(sys, "last_traceback", None) is None


def test_oom_with_planted_fragmentation_ranks_fragmentation_first(tip):
    cell(
        tip,
        "torch.cuda.empty_cache()\n"
        "big = torch.empty(1 << 30, dtype=torch.uint8, device='cuda'); del big\n"
        "blocks = [torch.empty(64 << 20, dtype=torch.uint8, device='cuda')"
        " for _ in range(16)]\n"
        "for i in range(0, 16, 2): blocks[i] = None",
    )
    cap = torch.cuda.memory_reserved(0) + 32 * MiB
    cell(tip, f"%gpumem limit {cap}B")
    res, texts, _ = cell(
        tip, "%%gpumem -o rep\ny = torch.empty(128 << 20, dtype=torch.uint8, device='cuda')"
    )
    assert isinstance(res.error_in_exec, torch.OutOfMemoryError)
    pm = tip.user_ns["rep"].postmortems[0]
    assert pm.requested == 128 * MiB
    assert pm.largest_free_block == 64 * MiB
    big_pieces = [
        1
        for s in torch.cuda.memory_snapshot()
        for b in s["blocks"]
        if b["state"] == "inactive" and b["size"] == 64 * MiB
    ]
    assert len(big_pieces) == 8
    # Fixes are judged against the cell's need (the 128 MiB it asked for; nothing above its
    # start): they cover it ("maybe": nothing says the cell needs no more after the failure).
    assert pm.need == 128 * MiB
    assert pm.fixes[0].kind == "fragmentation" and pm.fixes[0].fits is None
    assert "largest free block 64.00 MiB < 128.00 MiB requested" in pm.fixes[0].text
    delete = next(f for f in pm.fixes if f.kind == "delete" and "del blocks" in f.text)
    assert delete.frees == 8 * 64 * MiB and delete.fits is None
    empty = next(f for f in pm.fixes if f.kind == "empty_cache")
    assert empty.fits is False
    assert "out of memory on cuda:0: fixes, best first" in texts[0]


def test_oom_under_a_cap_ranks_the_cap(tip):
    cell(tip, "torch.cuda.empty_cache()")
    cell(tip, "%gpumem limit 1GiB")
    cell(tip, "x = torch.empty(256 << 20, dtype=torch.uint8, device='cuda')")
    res, _, _ = cell(
        tip, "%%gpumem -o rep\nz = torch.empty(2 << 30, dtype=torch.uint8, device='cuda')"
    )
    assert not res.success
    pm = tip.user_ns["rep"].postmortems[0]
    assert pm.cap is not None and pm.cap <= 1 << 30
    assert pm.fixes[0].kind == "cap" and pm.fixes[0].fits is None
    delete_x = next(f for f in pm.fixes if f.kind == "delete" and "del x" in f.text)
    assert delete_x.frees == 256 * MiB and delete_x.fits is False
    assert "not enough" in delete_x.text
    assert delete_x.shortfall is not None and delete_x.shortfall > 0
    assert all(f.kind != "fragmentation" for f in pm.fixes)
    assert [r.key for r in pm.owners][:1] == ["x"]


def test_oom_when_deleting_a_variable_is_enough(tip):
    cell(tip, "torch.cuda.empty_cache()")
    cell(tip, "%gpumem limit 1GiB")
    cell(tip, "acts = [torch.empty(128 << 20, dtype=torch.uint8, device='cuda') for _ in range(6)]")
    res, _, _ = cell(
        tip, "%%gpumem -o rep\nz = torch.empty(512 << 20, dtype=torch.uint8, device='cuda')"
    )
    assert not res.success
    pm = tip.user_ns["rep"].postmortems[0]
    fix = next(f for f in pm.fixes if f.kind == "delete" and "del acts" in f.text)
    assert fix.text == (
        "`del acts` frees 768.00 MiB: covers the 512.00 MiB the cell needed so far (maybe: it "
        "may need more after the point where it failed)"
    )
    assert fix.fits is None
    assert pm.owners[0].key == "acts" and pm.owners[0].bytes == 768 * MiB


def test_oom_with_a_leaked_graph_offers_detach(tip):
    cell(
        tip,
        "torch.cuda.empty_cache()\n"
        "model = torch.nn.Sequential(torch.nn.Linear(1024, 8192), torch.nn.ReLU(),"
        " torch.nn.Linear(8192, 1)).cuda()\n"
        "xb = torch.randn(2048, 1024, device='cuda')\n"
        "total = torch.zeros((), device='cuda')\n"
        "for _ in range(8):\n"
        "    total = total + model(xb).square().mean()",
    )
    graph = 8 * (2048 * 8192 * 4 + 2048 * 4)  # ReLU outputs + squared outputs, per step
    cell(tip, f"%gpumem limit {torch.cuda.memory_reserved(0) + 64 * MiB}B")
    res, _, _ = cell(
        tip, "%%gpumem -o rep\nz = torch.empty(256 << 20, dtype=torch.uint8, device='cuda')"
    )
    assert not res.success
    pm = tip.user_ns["rep"].postmortems[0]
    detach = next(f for f in pm.fixes if f.kind == "graph")
    assert detach.frees == graph and detach.fits is None
    assert detach.command == "total = total.detach()"
    assert pm.fixes[0] is detach


def test_auto_mode_names_the_top_line(tip):
    cell(tip, "acts = []")
    cell(tip, "%gpumem auto on")
    _, texts, _ = cell(tip, "acts.append(torch.empty(64 << 20, dtype=torch.uint8, device='cuda'))")
    line = texts[-1]
    assert "alloc +64.00 MiB" in line
    assert "top line 1 `acts.append(torch.empty(64 << 20" in line and "` 64.00 MiB" in line


def test_rows_add_up_to_allocated_in_every_view(tip):
    cell(
        tip,
        "a = torch.empty(3 << 20, dtype=torch.uint8, device='cuda')\n"
        "acts = [torch.empty(1 << 20, device='cuda') for _ in range(10)]\n"
        "torch.ones(5, device='cuda')",
    )
    for by in ("variable", "line", "cell"):
        df = who(by)
        assert df["bytes"].sum() == torch.cuda.memory_allocated(0), by


def test_grads_of_backward_have_no_python_stack(tip):
    cell(
        tip,
        "model = torch.nn.Linear(2048, 2048).cuda()\n"
        "model(torch.ones(4, 2048, device='cuda')).sum().backward()",
    )
    df = who("line")
    grads = 2048 * 2048 * 4 + 2048 * 4
    r = row(df, "no Python stack (backward pass or C++)")
    assert r["bytes"] >= grads  # autograd's device thread allocates the gradients


def test_who_statements_without_cuda_and_no_context_from_tracking():
    """In a fresh process: `%gpumem who` and `track on` before CUDA starts say so and
    create no context; tracking then records the first allocation's line."""
    script = textwrap.dedent(
        """
        import json, torch
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.utils.capture import capture_output
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "gpumem")
        with capture_output() as c1:
            ip.run_cell("%gpumem who", store_history=True)
        with capture_output() as c2:
            ip.run_cell("%gpumem track on", store_history=True)
        init = torch.cuda.is_initialized()
        ctx = torch._C._cuda_hasPrimaryContext(0)
        r = ip.run_cell("import torch\\nx = torch.empty(1 << 20, device='cuda')",
                        store_history=True)
        if not r.success:
            print(json.dumps({"error": repr(r.error_in_exec)}))
            raise SystemExit(0)
        import jupyter_gpumem
        df = jupyter_gpumem.who(by="line")
        print(json.dumps({"who": c1.stdout, "track": c2.stdout, "init": init, "ctx": ctx,
                          "keys": list(df["key"]), "count": r.execution_count}))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert "error" not in r, r
    assert "CUDA is not initialised in this kernel" in r["who"]
    assert "allocation tracking is on" in r["track"]
    assert r["init"] is False and r["ctx"] is False
    assert f"In[{r['count']}] line 2" in r["keys"]


def test_tracking_changes_no_result(tip):
    code = "torch.manual_seed(0)\nout = (torch.randn(256, 256, device='cuda') @ torch.randn(256, 256, device='cuda')).sum().item()"  # noqa: E501
    cell(tip, code)
    on = tip.user_ns["out"]
    cell(tip, "%gpumem track off")
    cell(tip, code)
    assert tip.user_ns["out"] == on
