"""The fake mode's faster cache key (collectors/dry_run/cache_key.py): each output it gives
from the cache equals what the op computes afresh (torch's own cross-check, on a
transformer's training step and a CNN's), keys differ where outputs do, and inputs torch
refuses to key are refused the same way."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from jupyter_gpumem.collectors.dry_run.cache_key import _MARKER, install  # noqa: E402
from jupyter_gpumem.collectors.dry_run.patches import fake_mode  # noqa: E402


def _ours(mode) -> int:
    from torch._subclasses.fake_tensor import FakeTensorMode

    return sum(1 for k in FakeTensorMode.cache if k.key[:1] == (_MARKER,))


def test_the_dry_runs_fake_mode_has_the_fast_key():
    mode = fake_mode()
    assert "_cache_key" in vars(mode)  # this torch's cache is the one it was written for
    with mode:
        a = torch.empty(4, 8)
        a + a
        a + a
    assert _ours(mode) > 0


@pytest.mark.parametrize("model", ["transformer", "cnn"])
def test_cached_outputs_equal_fresh_ones_over_a_training_step(model):
    """torch's cross-check dispatches every cache hit afresh and compares the outputs
    (shape, strides, dtype, device, storage offset, aliasing, requires_grad): it raises on
    any difference."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    FakeTensorMode.cache_clear()
    mode = fake_mode()
    mode.cache_crosscheck_enabled = True
    hits = FakeTensorMode.cache_hits
    with mode:
        if model == "transformer":
            net = nn.TransformerEncoder(
                nn.TransformerEncoderLayer(64, 4, 128, batch_first=True), num_layers=2
            )
            x = torch.randn(3, 10, 64)
            xs = [x, x.transpose(0, 1).contiguous().transpose(0, 1)]
        else:
            net = nn.Sequential(
                nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(800, 5)
            )
            x = torch.randn(2, 3, 12, 12)
            xs = [x, x.to(memory_format=torch.channels_last)]
        opt = torch.optim.AdamW(net.parameters())
        for x in xs:
            net(x).sum().backward()
            opt.step()
            opt.zero_grad()
    assert FakeTensorMode.cache_hits > hits
    assert _ours(mode) > 0


def test_keys_differ_where_the_outputs_do():
    mode = fake_mode()
    from torch._subclasses.fake_tensor import _CacheKeyState

    add = torch.ops.aten.add.Tensor
    with mode:
        i = torch.zeros(4, 6, dtype=torch.int64)
        t = torch.empty(6, 4).t()  # same shape as c, other strides
        c = torch.empty(4, 6)
        g = torch.empty(4, 6, requires_grad=True)
        v = torch.empty(2, 4, 6)[1]  # a view at an offset into a larger storage

    def key(*args, **kwargs):
        return mode._cache_key(_CacheKeyState(None), add, args, kwargs)

    keys = [
        key(i, 1),
        key(i, 1.0),  # int + float is float
        key(i, True),
        key(c, c),
        key(t, c),
        key(g, c),
        key(v, c),
        key(c, c, alpha=2),
    ]
    assert len(set(keys)) == len(keys)
    with torch.inference_mode():
        assert key(c, c) != keys[3]  # inference mode makes other outputs


def test_inputs_torch_refuses_to_key_are_refused_alike():
    from torch._subclasses.fake_tensor import _BypassDispatchCache, _CacheKeyState

    mode = fake_mode()
    add = torch.ops.aten.add.Tensor
    other = fake_mode()
    with other:
        theirs = torch.empty(3)
    with mode:
        ours = torch.empty(3)
    for args in ((ours, torch.ones(3)), (ours, theirs)):
        with pytest.raises(_BypassDispatchCache):
            mode._cache_key(_CacheKeyState(None), add, args, {})
    # a real input still computes (for real where every input is real: the guard's job)
    with mode:
        out = ours + torch.ones(3)
    assert out.shape == (3,)


def test_a_torch_it_was_not_written_for_is_left_alone():
    class Other:
        def _cache_key(self, state, func, args):  # another signature
            return None

    mode = Other()
    assert install(mode) is False
    assert "_cache_key" not in vars(mode)
