"""Values a dry run knows (collectors/dry_run/values.py): a read of a value made of constants
gets its real answer, so that a loop that ends on one (Hugging Face's generate()) ends;
what is random, large or overwritten stays unknown and is read as 0."""

from __future__ import annotations

import collections

import pytest

torch = pytest.importorskip("torch")

from jupyter_gpumem.collectors.dry_run.run import record  # noqa: E402


def cpu(run, **kw):
    return record(run, device_type="cpu", **kw)


def reads_noted(r) -> list[str]:
    return [n for n in r.notes if n.startswith("a value read to the host")]


def test_a_value_made_of_constants_is_read_exactly():
    seen = collections.deque()  # a spy the dry run does not put back (not a dict)

    def run():
        seen.append(("sum", torch.ones(3).sum().item()))
        seen.append(("any", bool(torch.zeros(2).any())))
        seen.append(("max", int(torch.arange(5).max())))
        seen.append(("tensor", torch.tensor([2, 7]).sum().item()))

    r = cpu(run)
    assert r.error is None
    assert dict(seen) == {"sum": 3.0, "any": False, "max": 4, "tensor": 9}
    assert reads_noted(r) == []  # nothing was taken as 0


def test_a_generate_loop_ends_at_its_max_length():
    """generate()'s stop: `unfinished & ~(max_length_done | eos_done)`, read with
    `unfinished.max() == 0`: the EOS check is unknown, the length check known, and its
    True absorbs the OR at the last step."""
    steps = collections.deque()  # a spy the dry run does not put back (not a list)

    def run():
        ids = torch.zeros(2, 3, dtype=torch.long)
        unfinished = torch.ones(2, dtype=torch.long)
        eos = torch.tensor([7])
        while True:
            logits = torch.randn(2, 10)  # unknown values
            nxt = logits.argmax(-1)
            ids = torch.cat([ids, nxt[:, None]], dim=-1)
            done = torch.full((2,), ids.shape[1] >= 8, dtype=torch.bool)
            done = done | torch.isin(ids[:, -1], eos)
            unfinished = unfinished & ~done
            steps.append(ids.shape[1])
            if unfinished.max() == 0:
                break

    r = cpu(run)
    assert r.error is None
    assert list(steps) == [4, 5, 6, 7, 8]


def test_a_write_forgets_the_values_of_its_storage():
    seen = collections.deque()  # a spy the dry run does not put back (not a dict)

    def run():
        x = torch.ones(2)
        x.copy_(torch.randn(2))  # unknown now
        seen.append(("copied", x.sum().item()))
        y = torch.ones(4)
        view = y[:2]
        y.mul_(torch.randn(4))  # written through the base: the view's values go too
        seen.append(("view", view.sum().item()))
        z = torch.zeros(3)
        z.fill_(2.0)  # overwritten with a known value: known again
        seen.append(("filled", z.sum().item()))

    r = cpu(run)
    assert r.error is None
    assert dict(seen) == {"copied": 0.0, "view": 0.0, "filled": 6.0}


def test_a_large_or_random_tensor_is_not_known():
    seen = collections.deque()  # a spy the dry run does not put back (not a dict)

    def run():
        seen.append(("large", torch.ones(100_000).sum().item()))
        seen.append(("random", bool(torch.rand(3).max() >= 0)))
        seen.append(("float_times_zero", (torch.randn(3) * torch.zeros(3)).sum().item()))

    r = cpu(run)
    assert r.error is None
    assert dict(seen) == {"large": 0.0, "random": False, "float_times_zero": 0.0}
    assert len(reads_noted(r)) == 3


def test_a_small_real_cpu_tensor_of_the_user_is_known():
    mask = torch.tensor([[1, 1, 0]])
    seen = collections.deque()  # a spy the dry run does not put back (not a dict)

    def run():
        seen.append(("ones", int(mask.sum())))

    r = cpu(run)
    assert r.error is None and dict(seen) == {"ones": 2}


def test_a_loop_on_a_known_value_is_still_stopped(monkeypatch):
    from jupyter_gpumem.collectors.dry_run import state as fake_state

    monkeypatch.setattr(fake_state, "MAX_HOST_READS", 50)

    def run():
        done = torch.zeros(1, dtype=torch.bool)
        while not done:  # known False: for ever, in a real run too
            torch.empty(4)

    r = cpu(run)
    assert r.error is not None and "read 50 values to the host" in r.error.message


def test_a_run_past_its_time_stops_with_a_line(monkeypatch):
    from jupyter_gpumem.collectors.dry_run import state as fake_state

    monkeypatch.setattr(fake_state, "MAX_SECONDS", 0.2)

    def run():
        x = torch.randn(4)
        while True:
            x = x + 1
            if x.sum() > 1e9:  # unknown: read as False for ever
                break

    r = cpu(run)
    assert r.error is not None and r.error.kind == "time"
    assert "ran past its 0.2 s" in r.error.message
    assert "test_fake_values.py:" in r.error.message  # where most values were read
