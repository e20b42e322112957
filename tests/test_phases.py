"""The one tracker of a training step's phases and modules (collectors/phases.py), which
``--breakdown``, ``--scan`` and the dry run's breakdown share, on the CPU: the phases in
order, the module calls' entries, the thread it tracks, and nothing once stopped."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from jupyter_gpumem.collectors.phases import PhaseTracker, qualified_names  # noqa: E402


def _tracked(**kw):
    seen: list = []
    tracker = PhaseTracker(
        torch,
        on_phase=seen.append,
        on_module_enter=lambda m, outermost: (type(m).__name__, outermost),
        on_module_exit=lambda entry: seen.append(("exit", *entry)),
        on_optimizer_step=lambda opt, before: seen.append(("step", before)),
        **kw,
    )
    return tracker, seen


def test_a_training_step_goes_forward_backward_then_optimizer_step():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tracker, seen = _tracked(outputs=True)
    tracker.start()
    try:
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    finally:
        tracker.stop()
    assert seen == [
        "forward",
        ("exit", "Linear", False),
        ("exit", "ReLU", False),
        ("exit", "Sequential", True),
        "other",
        "backward",
        "backward done",
        "optimizer step",
        ("step", True),
        ("step", False),
        "other",
    ]


def test_only_the_thread_that_started_it_is_tracked_and_nothing_after_stop():
    model = torch.nn.Linear(4, 4)
    tracker, seen = _tracked()
    tracker.start()
    try:
        t = threading.Thread(target=lambda: model(torch.randn(1, 4)))
        t.start()
        t.join()
        assert seen == []
        model(torch.randn(1, 4))
        assert seen == ["forward", ("exit", "Linear", True), "other"]
    finally:
        tracker.stop()
    model(torch.randn(1, 4))
    assert len(seen) == 3 and tracker.stack == []


def test_recompute_names_module_calls_of_backward_threads_and_begins_no_phase():
    """Activation checkpointing recomputes the forward in autograd's thread during the
    backward pass: with ``recompute`` (the breakdown's) those calls are entered and exited,
    in their own stack; outside a backward pass, and without ``recompute``, they are not."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())

    def in_other_thread():
        t = threading.Thread(target=lambda: model(torch.randn(1, 4)))
        t.start()
        t.join()

    for recompute, expected in (
        (True, [("exit", "Linear", False), ("exit", "ReLU", False), ("exit", "Sequential", False)]),
        (False, []),
    ):
        tracker, seen = _tracked(recompute=recompute)
        tracker.start()
        try:
            in_other_thread()  # not in a backward pass: nothing
            assert seen == []
            tracker.in_backward = True  # as the first unpacked saved tensor makes it
            in_other_thread()
            tracker.in_backward = False
        finally:
            tracker.stop()
        assert seen == expected, recompute
        assert tracker.stack == [] and tracker.others == {}


def test_submodules_are_named_below_their_root():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.ReLU()))
    names = [q for _, _, q in qualified_names(model, "net")]
    assert names == ["net", "net.0", "net.1", "net.1.0"]
