"""``%gpumem free`` in a real IPython shell, without a GPU: the places IPython keeps an object
in (names, ``Out[N]``, ``_N``, ``_``, the display hook, the last result, the kept traceback)
and letting each go until the object dies (checked with a weak reference); the referrer
search that names hooks, threads and module globals; the command's errors."""

from __future__ import annotations

import gc
import sys
import threading
import types
import weakref

import pytest

from jupyter_gpumem._ipython.cells import TRACEBACK, let_go, places, resolve
from jupyter_gpumem.collectors.holders import keepers


class Model:
    """Stands for a model: any object a weak reference can watch."""

    def __init__(self):
        self.weight = bytearray(16)
        self._forward_hooks = {}


@pytest.fixture
def sh(ip):
    yield ip
    for name in ("m", "m2", "keep", "f", "Model", "other"):
        ip.user_ns.pop(name, None)
    ip.run_line_magic("gpumem", "release-traceback")


def test_every_place_ipython_keeps_a_shown_object_in_is_let_go_and_it_dies(sh):
    sh.user_ns["Model"] = Model
    sh.run_cell("m = Model()", store_history=True)
    shown = sh.run_cell("m", store_history=True)  # Out[n], _n, _, display hook, last result
    sh.run_cell("m2 = m\nkeep = [1, 2, 3]", store_history=True)
    n = shown.execution_count
    del shown  # this test's own handle on the result (a user's cell has none)
    watch = weakref.ref(sh.user_ns["m"])
    held = {p.owner: p for p in places(sh, None) if any(r.obj is watch() for r in p.roots)}
    assert {"m", "m2", f"Out[{n}]", f"_{n}"} <= set(held)
    assert "_" in held or "__" in held  # shown, then moved along by later outputs
    assert held[f"Out[{n}]"].kind == "output" and held["m"].kind == "name"
    for p in held.values():
        let_go(sh, p)
    del p, held
    gc.collect()
    assert watch() is None, gc.get_referrers(watch()) if watch() else None
    assert sh.user_ns["keep"] == [1, 2, 3]  # untouched
    assert n not in sh.user_ns["Out"] and f"_{n}" not in sh.user_ns


def test_the_kept_traceback_is_a_place_and_letting_it_go_frees_its_frames(sh):
    sh.user_ns["Model"] = Model
    sh.run_cell("def f(x):\n    local = Model()\n    raise ValueError(x)\nf(1)")
    tb = [p for p in places(sh, None) if p.kind == "traceback"]
    assert [p.owner for p in tb] == [TRACEBACK]
    local = next(r.obj for r in tb[0].roots if r.path == "local")
    watch = weakref.ref(local)
    del local
    let_go(sh, tb[0])
    del tb
    gc.collect()
    assert watch() is None
    assert not hasattr(sys, "last_traceback")


def test_names_are_resolved_as_the_user_types_them(sh):
    sh.run_cell("m = 1", store_history=True)
    out = sh.run_cell("[1]", store_history=True)
    assert resolve(sh, "m").kind == "name"
    assert resolve(sh, f"Out[{out.execution_count}]").kind == "output"
    assert resolve(sh, "nope") is None and resolve(sh, "Out[99999]") is None
    assert resolve(sh, "m.attr") is None  # not a name


def test_the_command_refuses_unknown_names_and_a_kernel_without_a_gpu(sh):
    r = sh.run_cell("%gpumem free modle")
    assert r.error_in_exec is not None
    assert "'modle' is not a variable of this kernel" in str(r.error_in_exec)
    sh.run_cell("m = 1")
    r = sh.run_cell("%gpumem free m")
    msg = str(r.error_in_exec)
    assert "torch is not imported" in msg or "CPU-only build" in msg or "no GPU" in msg
    assert sh.user_ns["m"] == 1  # nothing was let go
    r = sh.run_cell("%gpumem free")
    assert "NAME" in str(r.error_in_exec)


def test_free_from_python_raises_a_gpumem_error_with_the_reason(sh):
    import jupyter_gpumem

    with pytest.raises(jupyter_gpumem.GpuMemError, match="not a variable"):
        jupyter_gpumem.free("nothing_by_this_name")


# -- the referrer search (collectors/holders.py) ------------------------------------------
def _closure_over(obj):
    return lambda *a: obj


def test_a_hook_on_another_module_is_found_and_removed_alone():
    target = Model()
    other = Model()
    other._forward_hooks[7] = _closure_over(target)
    other._forward_hooks[8] = lambda *a: None  # not about the target
    found = keepers(target, {}, {id(other): "other"})
    hooks = [f for f in found if f.kind == "hook"]
    assert [h.label for h in hooks] == ["other._forward_hooks[7]"]
    watch = weakref.ref(target)
    hooks[0].remove()
    del target, found, hooks
    gc.collect()
    assert watch() is None and list(other._forward_hooks) == [8]


def test_a_thread_that_holds_the_object_is_named():
    ev = threading.Event()
    target = Model()
    th = threading.Thread(target=lambda m: ev.wait(), args=(target,), name="loader", daemon=True)
    th.start()
    try:
        found = keepers(target, {})
        assert any(f.kind == "thread" and "'loader'" in f.label for f in found), found
    finally:
        ev.set()
        th.join()


def test_a_module_global_is_named_with_its_path():
    mod = types.ModuleType("fake_library_state")
    target = Model()
    mod.CACHE = {"engine": target}
    sys.modules[mod.__name__] = mod
    try:
        found = keepers(target, {})
        assert [f.label for f in found] == ["fake_library_state.CACHE['engine']"]
        assert found[0].kind == "global"
    finally:
        del sys.modules[mod.__name__]


def test_the_plan_of_a_real_session_with_cpu_tensors_standing_in_for_gpu_ones(sh, monkeypatch):
    """The whole planning path of ``%gpumem free --dry`` in a real shell: every place walked
    alone, the hook and the closure found from the model's referrers. Without a GPU, CPU
    tensors stand in (the walk is told to count them; there is no allocator snapshot, so
    sizes are the storages'); nothing is let go."""
    torch = pytest.importorskip("torch")
    from jupyter_gpumem._ipython import SESSIONS
    from jupyter_gpumem.collectors.namespace import NamespaceWalker, TorchTensors
    from jupyter_gpumem.core import free as core_free

    session = SESSIONS[id(sh)]
    monkeypatch.setattr(core_free, "why_nothing", lambda t: None)
    monkeypatch.setattr(core_free, "cuda_ready", lambda t: True)
    monkeypatch.setattr(core_free, "read_snapshot", lambda t: None)
    everything = NamespaceWalker(TorchTensors(torch, include=lambda x: True))
    monkeypatch.setattr(session.who, "walker", lambda t: everything)
    cell = """
import torch
model = torch.nn.Linear(256, 256)
opt = torch.optim.AdamW(model.parameters())
model(torch.ones(4, 256)).sum().backward()
opt.step()
total = model(torch.ones(4, 256)).sum()
def closing_over(m):
    return lambda *a: m
step = closing_over(model)
other = torch.nn.Linear(2, 2)
hook = other.register_forward_hook(closing_over(model))
results = {"model": model, "x": torch.ones(1000)}
keep = torch.arange(10.0)
"""
    assert sh.run_cell(cell).error_in_exec is None
    try:
        report = session.frees.free(["model"], dry=True)
        got = {g.holder: g.action for g in report.let_go}
        assert got.pop("model") == "delete" and got.pop("opt") == "delete"
        assert got.pop("total") == "detach" and got.pop("step") == "delete"
        (hook_label,) = [k for k in got if k.startswith("other._forward_hooks[")]
        assert got.pop(hook_label) == "unhook"
        assert not got, got  # nothing else
        assert [k.holder for k in report.kept] == ["results"]
        assert report.kept[0].fix == "del results['model']"
        params = 256 * 256 * 4 + 256 * 4
        assert report.devices[0].held == 2 * params  # weights and bias, and their gradients
        assert not report.done
        assert sh.user_ns["model"] is sh.user_ns["results"]["model"]  # nothing was let go
        assert len(sh.user_ns["other"]._forward_hooks) == 1
    finally:
        for name in (
            "model",
            "opt",
            "total",
            "closing_over",
            "step",
            "other",
            "hook",
            "results",
            "keep",
        ):
            sh.user_ns.pop(name, None)
