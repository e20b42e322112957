"""The hooks of a ``--breakdown`` cell (collectors/step.py), on the CPU: CPU tensors count
as device 0 and the allocator's counter is a stand-in, so what is checked here is what the
hooks see and that they change nothing in the user's program."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from jupyter_gpumem.collectors.step import StepRecorder  # noqa: E402


class Counter:
    """Stands in for the allocator's allocations + frees: one more at every reading."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, device: int) -> int:
        self.n += 1
        return self.n


def recorder(ns: dict) -> StepRecorder:
    return StepRecorder(
        torch, lambda: ns.items(), devices=lambda: [0], count=Counter(), device_of=lambda t: 0
    )


def model_and_opt():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return model, torch.optim.AdamW(model.parameters())


def no_hooks_left() -> bool:
    import torch.nn.modules.module as m
    import torch.optim.optimizer as o

    return (
        not m._global_forward_pre_hooks
        and not m._global_forward_hooks
        and not o._global_optimizer_pre_hooks
        and not o._global_optimizer_post_hooks
        and torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    )


def test_a_training_step_gives_its_phases_modules_and_owners():
    model, opt = model_and_opt()
    r = recorder({"model": model, "opt": opt})
    r.start()
    loss = model(torch.randn(5, 8)).square().sum()
    loss.backward()
    opt.step()
    rec = r.stop()
    assert [m.phase for m in rec.marks] == [
        "forward",
        "other",
        "backward",
        "backward done",
        "optimizer step",
        "other",
    ]
    assert [c.name for c in rec.calls] == ["model", "model.0", "model.1", "model.2"]
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {(o.category, o.address) for o in rec.observations}
    assert {("parameters", a) for a in params} <= seen
    assert {("gradients", p.grad.untyped_storage().data_ptr()) for p in model.parameters()} <= seen
    state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    assert {("optimizer state", v.untyped_storage().data_ptr()) for v in state} <= seen
    saved = {o.module for o in rec.observations if o.category == "activations"}
    assert saved == {"model.0", "model.1", "model.2", ""}  # "": square(), outside modules
    assert no_hooks_left()


def test_the_hooks_change_no_gradient():
    def grads(with_recorder: bool):
        model, _ = model_and_opt()
        r = recorder({"model": model})
        if with_recorder:
            r.start()
        torch.manual_seed(1)
        model(torch.randn(4, 8)).square().mean().backward()
        r.stop()
        return [p.grad.clone() for p in model.parameters()]

    assert all(torch.equal(a, b) for a, b in zip(grads(True), grads(False), strict=True))


def test_in_place_changes_of_saved_tensors_still_raise():
    r = recorder({})
    r.start()
    try:
        x = torch.randn(5, requires_grad=True)
        y = x.exp()
        y.add_(1)  # exp saved its output: backward must refuse
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()
    finally:
        r.stop()


def test_saved_outputs_are_freed_without_the_garbage_collector():
    import gc
    import weakref

    gc.disable()
    try:
        r = recorder({})
        r.start()
        x = torch.randn(100, requires_grad=True)
        y = torch.exp(x)  # exp saves its output: returning it from pack would be a cycle
        alive = weakref.ref(y)
        del y
        r.stop()
        assert alive() is None
    finally:
        gc.enable()


def test_an_exception_in_the_cell_leaves_no_hook_behind():
    model, _ = model_and_opt()
    r = recorder({"model": model})
    r.start()
    with pytest.raises(RuntimeError):
        model(torch.randn(5, 3))  # wrong width
    rec = r.stop()
    assert no_hooks_left()
    assert rec.calls[1].end_ns is not None  # the failing call was closed (always_call)


def test_a_graph_built_under_the_hooks_backwards_after_them():
    model, _ = model_and_opt()
    r = recorder({"model": model})
    r.start()
    loss = model(torch.randn(5, 8)).sum()
    r.stop()
    loss.backward()  # the unpack hook outlives the cell, and records nothing
    assert all(p.grad is not None for p in model.parameters())
    assert [m.phase for m in r.record.marks] == ["forward", "other"]


def test_a_module_moved_in_the_cell_is_seen_again():
    model, _ = model_and_opt()
    r = recorder({"model": model})
    r.start()
    model.double()  # new storages for every parameter
    model(torch.randn(5, 8, dtype=torch.float64))
    rec = r.stop()
    now = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert now <= {o.address for o in rec.observations if o.category == "parameters"}


def test_a_cell_that_builds_a_model_names_its_parameters_and_buffers():
    """Nothing ran a forward pass or an optimizer step: the model the cell made is found
    in the namespace when it ends, and what it holds is observed there, by category."""
    ns: dict = {}
    r = recorder(ns)
    r.start()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ns.update(model=model, opt=opt)  # the cell's names, bound as it ends
    rec = r.stop()
    by_category: dict[str, set[int]] = {}
    for o in rec.observations:
        by_category.setdefault(o.category, set()).add(o.address)
    params = {p.data_ptr() for p in model.parameters()}
    buffers = {b.data_ptr() for b in model.buffers()}
    assert params and params <= by_category.get("parameters", set())
    assert buffers and buffers <= by_category.get("buffers", set())
    assert rec.calls == []  # no module ran


def test_a_breakdown_s_trace_keeps_the_frames_tracking_needs():
    """A --breakdown's trace records no stacks (all it needs is addresses and sizes), but
    with allocation tracking on the frames of the blocks that stay alive are still kept
    (``context="state"``), or the cell's kept lines would be lost."""
    from types import SimpleNamespace

    from jupyter_gpumem.collectors.snapshot import Recording, Trace

    calls: list[dict] = []
    memory = SimpleNamespace(_record_memory_history=lambda **kw: calls.append(kw))
    fake = SimpleNamespace(
        cuda=SimpleNamespace(memory=memory),
        _C=SimpleNamespace(_cuda_isHistoryEnabled=lambda: False),
    )
    contexts = []
    for ours, stacks in ((False, False), (True, False), (True, True), (False, True)):
        recording = Recording()
        recording.ours = ours
        Trace(recording, 100, stacks=stacks).start(fake)
        contexts.append(calls[-1]["context"])
    assert contexts == [None, "state", "all", "all"]
