"""The dry run (collectors/dry_run/run.py) on the CPU: CPU storages stand for the device's,
cuBLAS's workspaces come from a table the test passes. Sizes are checked against tensors of
known size, a training step against the same step run for real, and the user's namespace
and objects against what they were before."""

from __future__ import annotations

import collections
import contextlib
import threading
import time
import weakref

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from jupyter_gpumem._ipython.cell_source import CellSource  # noqa: E402
from jupyter_gpumem.collectors.dry_run.run import (  # noqa: E402
    OTHER_CARDS,
    WORKSPACE_TABLE,
    Alloc,
    FakeRun,
    Free,
    Workspaces,
    cuda_workspaces,
    parse_workspace_config,
    record,
)

MiB = 1 << 20
TABLE = Workspaces(cublas=1000, cublaslt=100, source="the test's table")


def cpu(run, **kw) -> FakeRun:
    return record(run, device_type="cpu", **kw)


def allocs(r: FakeRun) -> list[Alloc]:
    return [e for e in r.events if isinstance(e, Alloc)]


def tensor_allocs(r: FakeRun) -> list[Alloc]:
    return [e for e in allocs(r) if e.kind == "tensor"]


def line_of(func, marker: str) -> int:
    """The file line holding ``marker`` in ``func``'s source."""
    import inspect

    lines, first = inspect.getsourcelines(func)
    return first + next(i for i, text in enumerate(lines) if marker in text)


# -- sizes ------------------------------------------------------------------------------


def test_an_empty_tensor_is_one_allocation_of_its_bytes():
    def run():
        return torch.empty(1000, dtype=torch.float32)

    r = cpu(run)
    assert r.error is None
    assert [(e.nbytes, e.device, e.stream, e.thread, e.op) for e in allocs(r)] == [
        (4000, 0, 0, 0, "aten.empty.memory_format")
    ]
    assert r.events[-1] == Free(allocs(r)[0].key)  # the returned value dies with the run


def test_views_and_in_place_ops_allocate_nothing():
    def run():
        x = torch.zeros(250, 4, dtype=torch.float64)  # 8000 B
        v = x[10:].t()
        x.add_(1).mul_(2)
        v.clamp_(max=3)
        x.view(-1)[:5].fill_(0)

    r = cpu(run)
    a = allocs(r)
    assert [(e.nbytes, e.op) for e in a] == [(8000, "aten.zeros.default")]
    assert r.events == [a[0], Free(a[0].key)]
    assert r.ops >= 8


def test_a_free_comes_when_the_last_view_dies_in_order():
    def run():
        x = torch.empty(1000)  # 4000
        v = x[1:]
        del x
        y = torch.empty(10, dtype=torch.int64)  # 80, while x's storage lives through v
        del v
        z = torch.empty(3, dtype=torch.bool)  # 3
        del y, z

    r = cpu(run)
    a = allocs(r)
    assert [e.nbytes for e in a] == [4000, 80, 3]
    assert r.events == [a[0], a[1], Free(a[0].key), a[2], Free(a[1].key), Free(a[2].key)]
    assert r.peak == 4080
    assert r.live_at_end() == []


def test_a_storage_resized_in_place_is_a_new_allocation():
    def run():
        a = torch.ones(4, 4)
        o = torch.empty(0)  # nothing: the allocator is not asked for 0 bytes
        torch.mm(a, a, out=o)  # o grows to 64 B
        o.resize_(100)  # and again, to 400 B
        return o

    r = cpu(run)
    a = allocs(r)
    assert [e.nbytes for e in a] == [64, 64, 400]
    assert Free(a[1].key) in r.events and r.events.index(Free(a[1].key)) < r.events.index(a[2])
    assert r.events.count(Free(a[2].key)) == 1
    assert r.peak == 64 + 400


def test_real_tensors_are_held_from_the_start_not_allocated_by_the_cell():
    # GIVEN a tensor made before the run (8192 B), which the run reads twice (w and w.t())
    w = torch.randn(64, 32)

    def run():
        return (w.t() @ w).sum()

    r = cpu(run)
    # THEN its storage is held once, first, as a fresh process that made it earlier holds it;
    # the run's own allocations follow
    assert [(e.nbytes, e.op) for e in r.held] == [(8192, "held before the cell")]
    assert r.events[0] == r.held[0]
    assert [e.nbytes for e in tensor_allocs(r)][1:] == [32 * 32 * 4, 4]
    assert Free(r.held[0].key) not in r.events
    assert r.input_bytes == 8192


def real_peak(step) -> int:
    """Peak of live storage bytes of a step run for real on the CPU, counted by an
    independent small dispatch mode on the real tensors' storages (data pointers)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    live: dict[int, int] = {}
    existing: set[int] = set()  # storages from before the step (parameters)
    peak = [0]

    def dead(ptr: int) -> None:
        live.pop(ptr, None)

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            for x in tree_flatten((args, kwargs))[0]:
                if isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() not in live:
                    existing.add(x.untyped_storage().data_ptr())
            out = func(*args, **(kwargs or {}))
            for x in tree_flatten(out)[0]:
                if isinstance(x, torch.Tensor):
                    st = x.untyped_storage()
                    ptr = st.data_ptr()
                    if ptr and ptr not in live and ptr not in existing:
                        live[ptr] = st.nbytes()
                        weakref.finalize(st, dead, ptr)
                        peak[0] = max(peak[0], sum(live.values()))
            return out

    with Count():
        step()
    return peak[0]


def mlp_step():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)

    def step():
        x = torch.randn(32, 8)
        loss = net(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

    return net, opt, step


def test_a_training_step_peaks_where_the_real_step_does():
    # GIVEN the same small MLP step twice: once run for real, once dry
    *_, real_step = mlp_step()
    expected = real_peak(real_step)
    net, _, step = mlp_step()
    # WHEN it runs dry
    r = cpu(step)
    # THEN the parameters, made before the run, are held from its start (512+64+256+16 B)
    params = sum(p.nbytes for p in net.parameters())
    assert sum(a.nbytes for a in r.held) == params == 848
    # and above them the live bytes peak at what the real storages did, in backward's
    # threshold_backward: x 1024 + relu out 2048 + loss 4 + its grad 4 + Linear 2's input
    # grad 2048 and weight grad 256 and bias grad 16 + threshold_backward's output 2048 = 7448
    assert r.error is None
    assert r.peak - params == expected == 1024 + 2048 + 4 + 4 + 2048 + 256 + 16 + 2048
    # and the momentum buffers (the step's only survivors) are live at the end, beside the
    # held parameters
    held = {a.key for a in r.held}
    assert sorted(e.nbytes for e in r.live_at_end() if e.key not in held) == [16, 64, 256, 512]


# -- cuBLAS's workspaces ----------------------------------------------------------------


def test_a_workspace_is_added_once_per_thread_at_the_first_matmul():
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    def run():
        a, b = torch.randn(4, 4), torch.randn(4, 4)
        torch.relu(a)
        torch.mm(a, b)
        torch.mm(a, b)
        modes = _get_current_dispatch_mode_stack()

        def other_thread():  # a thread of its own, the dry run's modes entered there too
            with contextlib.ExitStack() as stack:
                for m in modes:
                    stack.enter_context(m)
                torch.bmm(a[None], b[None])
                torch.mm(a, b)

        t = threading.Thread(target=other_thread)
        t.start()
        t.join()

    r = cpu(run, workspaces=TABLE)
    ws = [e for e in allocs(r) if e.kind != "tensor"]
    assert [(e.nbytes, e.thread, e.op, e.kind) for e in ws] == [
        (1000, 0, "aten.mm.default", "cublas workspace"),
        (1000, 1, "aten.bmm.default", "cublas workspace"),
    ]
    # after the matmul's own output, never freed
    first = r.events.index(ws[0])
    assert r.events[first - 1].op == "aten.mm.default"  # type: ignore[union-attr]
    assert all(Free(e.key) not in r.events for e in ws)
    assert any("cuBLAS workspace of 1,000 B" in n and "the test's table" in n for n in r.notes)


def test_linear_with_bias_takes_the_cublaslt_workspace_too():
    lin = nn.Linear(8, 8)
    no_bias = nn.Linear(8, 8, bias=False)
    x = torch.randn(4, 8)

    r = cpu(lambda: no_bias(x), workspaces=TABLE)
    assert [e.kind for e in allocs(r) if e.kind != "tensor"] == ["cublas workspace"]
    r = cpu(lambda: (no_bias(x), lin(x)), workspaces=TABLE)
    assert [(e.kind, e.op) for e in allocs(r) if e.kind != "tensor"] == [
        ("cublas workspace", "aten.mm.default"),
        ("cublaslt workspace", "aten.addmm.default"),
    ]


def test_a_per_call_workspace_is_taken_and_given_back_around_each_call():
    table = Workspaces(2048, 0, "per call", lifetime="per_call")

    def run():
        a = torch.randn(4, 4)
        torch.mm(a, a)
        torch.mm(a, a)

    r = cpu(run, workspaces=table)
    ws = [e for e in allocs(r) if e.kind != "tensor"]
    assert len(ws) == 2
    for w in ws:
        assert r.events[r.events.index(w) + 1] == Free(w.key)


def test_the_workspace_table_follows_pytorch():
    hopper = cuda_workspaces((9, 0), env={})
    assert (hopper.cublas, hopper.cublaslt) == (32 * MiB, 1 * MiB)
    assert "measured" in hopper.source
    ampere = cuda_workspaces((8, 0), env={})
    assert ampere.cublas == 4096 * 1024 * 2 + 16 * 1024 * 8 == 8_519_680 == OTHER_CARDS.cublas
    unknown = cuda_workspaces(None, env={})
    assert unknown.cublas == 8_519_680 and "not known" in unknown.source
    assert all(ws.source for ws in WORKSPACE_TABLE.values())
    # the environment as PyTorch parses it: SIZE KiB x COUNT, added up
    assert cuda_workspaces((9, 0), env={"CUBLAS_WORKSPACE_CONFIG": ":16:8"}).cublas == 131072
    assert parse_workspace_config(":4096:2:16:8") == 8_519_680
    assert parse_workspace_config("nonsense") is None
    assert cuda_workspaces((9, 0), env={"CUBLAS_WORKSPACE_CONFIG": "x"}).cublas == 32 * MiB
    assert cuda_workspaces((8, 6), env={"CUBLASLT_WORKSPACE_SIZE": "4096"}).cublaslt == 4 * MiB


# -- what it cannot see -----------------------------------------------------------------


def test_a_value_read_to_the_host_goes_on_with_zero_and_says_where():
    """`.item()` and `if tensor` are in most training loops (logging the loss): the run
    goes on as if the value were 0 (False), and a note names the line. (Values made of
    constants are known: tests/test_fake_values.py; random ones are not.)"""

    def run():
        loss = torch.randn(3).sum()
        if loss.item() > 0:  # item here
            torch.empty(10)  # not reached: the value is taken as 0
        kept = torch.empty(25)
        flag = torch.randn(1) > 0
        if flag:  # bool here
            torch.empty(1000)
        return kept

    r = cpu(run)
    assert r.error is None
    # randn(3)=12 B, sum=4 B, 25 floats, randn(1)=4 B and one bool: no skipped branch
    assert [e.nbytes for e in allocs(r)] == [12, 4, 100, 4, 1]
    item_line = f"test_fake_run.py:{line_of(run, '# item here')}"
    bool_line = f"test_fake_run.py:{line_of(run, '# bool here')}"
    reads = [n for n in r.notes if n.startswith("a value read to the host")]
    assert len(reads) == 2
    assert f"at {item_line} " in reads[0] and f"at {bool_line} " in reads[1]
    assert "as if it were 0 (False)" in reads[0]


def test_a_loop_that_waits_on_a_value_is_stopped(monkeypatch):
    from jupyter_gpumem.collectors.dry_run import state as fake_state

    monkeypatch.setattr(fake_state, "MAX_HOST_READS", 50)

    def run():
        done = torch.zeros(1, dtype=torch.bool)
        while not done:  # for ever in a dry run: done reads as False
            torch.empty(4)

    r = cpu(run)
    assert r.error is not None and "read 50 values to the host" in r.error.message


def test_a_module_of_fake_tensors_can_be_moved_and_cast():
    """`.to(dtype)`, `.half()` (and `.cuda()` on a GPU) of a module built in the run swap
    its parameters in place, which torch refuses for tensors with weak references (the
    fake mode keeps some): the dry run lets it, and puts torch back afterwards."""
    import weakref

    import torch.utils

    def run():
        net = torch.nn.Linear(256, 128)
        net.to(torch.float64)
        assert net.weight.dtype == torch.float64
        net.half()
        return net

    r = cpu(run)
    assert r.error is None, r.error
    sizes = [e.nbytes for e in allocs(r)]
    # built in float32, copied to float64, then to float16 (weight and bias each)
    assert sizes[:2] == [256 * 128 * 4, 128 * 4]
    assert 256 * 128 * 8 in sizes and 256 * 128 * 2 in sizes
    assert torch.utils.weakref is weakref  # put back


def test_the_patches_are_put_back_and_answer_bf16_without_cuda():
    import torch.optim.optimizer as optimizer
    from torch._subclasses.fake_tensor import FakeTensor

    from jupyter_gpumem.collectors.dry_run.patches import patched

    before = torch.cuda.is_bf16_supported
    with patched(torch, "cuda", capability=lambda i: (7, 5)):
        assert FakeTensor in optimizer._foreach_supported_types  # the real run's choice
        assert torch.cuda.is_bf16_supported() is True  # a T4 emulates it
        assert torch.cuda.is_bf16_supported(including_emulation=False) is False
    with patched(torch, "cuda", capability=lambda i: (9, 0)):
        assert torch.cuda.is_bf16_supported(including_emulation=False) is True
    assert FakeTensor not in optimizer._foreach_supported_types
    assert torch.cuda.is_bf16_supported is before
    assert not torch.cuda.is_initialized()


def test_a_cards_compute_capability_is_answered_by_card_without_starting_cuda():
    """transformers asks ``get_device_capability(weight.device)`` before its grouped
    matmuls: answered from NVML's figure for that card, by index, while CUDA has not
    started; put back afterwards."""
    from jupyter_gpumem.collectors.dry_run.patches import patched

    before = torch.cuda.get_device_capability
    asked: list[int] = []

    def capability(i: int) -> tuple[int, int]:
        asked.append(i)
        return (9, 0) if i == 0 else (7, 5)

    with patched(torch, "cuda", capability=capability):
        assert torch.cuda.get_device_capability() == (9, 0)
        assert torch.cuda.get_device_capability(torch.device("cuda:1")) == (7, 5)
        assert torch.cuda.get_device_capability("cuda") == (9, 0)
        assert torch.cuda.get_device_capability(1) == (7, 5)
    assert asked == [0, 1, 0, 1]
    assert torch.cuda.get_device_capability is before
    assert not torch.cuda.is_initialized()


def test_tensors_from_data_are_built_on_the_cpu_and_moved_with_no_torch_function_mode():
    """A torch function mode would turn off fast paths the real run takes
    (``has_torch_function`` is true under any mode): the functions are replaced instead,
    for the run only."""
    from jupyter_gpumem.collectors.dry_run.patches import data_on_cpu

    originals = (torch.tensor, torch.as_tensor, torch.asarray, torch.Tensor.new_tensor)
    made = []
    with data_on_cpu(torch, "meta"):
        assert not torch._C._is_torch_function_mode_enabled()
        x = torch.tensor([1.0, 2.0], device="meta", requires_grad=True)
        made.append(x)
        made.append(torch.as_tensor([1, 2, 3], device=torch.device("meta")))
        made.append(torch.asarray([[1, 2]], device="meta"))
        made.append(x.new_tensor([5.0]))  # x's device and dtype
        made.append(torch.tensor([1.0]))  # the CPU: untouched
        with torch.device("meta"):
            made.append(torch.tensor([3]))  # the default device
    assert [m.device.type for m in made] == ["meta", "meta", "meta", "meta", "cpu", "meta"]
    assert made[0].requires_grad and made[0].is_leaf
    assert made[3].dtype == torch.float32 and made[1].dtype == torch.int64
    assert [tuple(m.shape) for m in made] == [(2,), (3,), (1, 2), (1,), (1,), (1,)]
    assert (torch.tensor, torch.as_tensor, torch.asarray, torch.Tensor.new_tensor) == originals


def test_the_fake_mode_runs_nothing_on_a_device_also_where_a_gpu_is_visible(monkeypatch):
    """Where torch sees a GPU, its own FakeTensorMode computes a constant's copy to the GPU
    by running it there; the dry run's mode never does (``avoid_device_init``, as torch
    sets it where no GPU is visible), and is torch's mode in every other respect."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from jupyter_gpumem.collectors.dry_run.patches import fake_mode

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert FakeTensorMode().avoid_device_init is False  # torch's own, with a GPU
    mode = fake_mode()
    assert isinstance(mode, FakeTensorMode) and mode.avoid_device_init is True
    assert mode.allow_non_fake_inputs is True
    assert fake_mode() is not mode  # a new mode for each run


def test_shapes_that_depend_on_values_a_dry_run_does_not_size_stop_the_run():
    def unique():
        x = torch.randn(3)
        return x.unique()  # unique here

    def repeat():
        x = torch.randn(5)
        return x.repeat_interleave(torch.randint(0, 3, (5,)))  # repeat here

    for run, marker, op in (
        (unique, "# unique here", "aten._unique2.default"),
        (repeat, "# repeat here", "aten.repeat_interleave.Tensor"),
    ):
        r = cpu(run)
        assert r.error is not None and r.error.kind == "dynamic shape"
        assert r.error.op == op
        assert r.error.where == f"test_fake_run.py:{line_of(run, marker)}"
        assert "depends on the tensor's values" in r.error.message


def test_a_custom_op_without_a_fake_kernel_is_named():
    torch.library.define("gpumem_test::triple", "(Tensor x) -> Tensor")
    torch.library.impl("gpumem_test::triple", "CPU", lambda x: x * 3)

    def run():
        return torch.ops.gpumem_test.triple(torch.ones(3))

    r = cpu(run)
    assert r.error is not None and r.error.kind == "no fake kernel"
    assert r.error.op == "gpumem_test.triple.default"
    assert "gpumem_test.triple.default has no fake kernel" in r.error.line


def test_a_custom_op_with_a_fake_kernel_runs_with_a_note():
    @torch.library.custom_op("gpumem_test::double", mutates_args=())
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @double.register_fake
    def _(x):
        return torch.empty_like(x)

    r = cpu(lambda: double(torch.ones(5)))
    assert r.error is None
    assert [e.nbytes for e in tensor_allocs(r)] == [20, 20]
    assert any("gpumem_test.double.default (a custom op)" in n for n in r.notes)


def test_ops_with_scratch_memory_of_their_own_are_noted(monkeypatch):
    """A convolution on cuDNN (PyTorch's choice answered "Cudnn", as on a GPU) whose
    workspace cannot be asked (no CUDA context) is named, with why."""
    from jupyter_gpumem.collectors.dry_run import conv as conv_module
    from jupyter_gpumem.collectors.dry_run import cudnn

    monkeypatch.setattr(conv_module, "backend", lambda t, args: "Cudnn")
    monkeypatch.setattr(cudnn, "sizer", lambda t, device: (None, "no CUDA context here"))
    conv = nn.Conv2d(3, 8, 3)
    r = cpu(lambda: conv(torch.randn(2, 3, 16, 16)))
    assert r.error is None
    expected = "not seen: cuDNN's workspace for convolutions of 1 calls (no CUDA context here)"
    assert [n for n in r.notes if n.startswith("not seen:")] == [expected]


def test_an_ordinary_error_is_a_plain_line_with_its_place():
    def run():
        torch.empty(4)
        return undefined_name  # type: ignore[name-defined]  # noqa: F821

    r = cpu(run)
    assert r.error is not None and r.error.kind == "error" and r.error.op is None
    assert r.error.message == "NameError: name 'undefined_name' is not defined"
    assert r.error.where == f"test_fake_run.py:{line_of(run, 'undefined_name')}"


@pytest.mark.skipif(torch.version.cuda is not None, reason="a CUDA build of torch")
def test_a_backward_where_torch_sees_no_gpu_says_so_in_one_line():
    """Where a CUDA build sees no GPU, torch's autograd fails a backward on fake CUDA
    tensors with a message about an internal call; the stop names the cause instead."""
    from jupyter_gpumem.collectors.dry_run.where import describe

    e = RuntimeError("hasPrimaryContext expects a valid device index, but got device_index=0")
    kind, op, text = describe(e, None, torch)
    assert kind == "no gpu visible" and op is None
    assert text.startswith("this torch sees no GPU") and "--fit-in" in text
    assert describe(RuntimeError("another failure"), None, torch)[0] == "error"


def test_a_cpu_only_torch_says_a_cuda_dry_run_needs_cuda():
    ran = []
    r = record(lambda: ran.append(1))  # device_type="cuda" by default
    assert ran == []
    assert r.error is not None and r.error.kind == "no cuda build"
    assert r.error.message.startswith("a dry run for CUDA needs a CUDA build of torch")


def test_no_cuda_context_and_no_device_memory():
    started = torch.cuda.is_initialized()
    used = torch.cuda.memory_allocated() if started else 0
    *_, step = mlp_step()
    r = cpu(step, workspaces=TABLE)
    assert r.error is None and r.cuda_initialized is False
    assert torch.cuda.is_initialized() == started
    assert (torch.cuda.memory_allocated() if started else 0) == used


# -- the user's objects -----------------------------------------------------------------


def test_real_parameters_gradients_and_optimizer_state_are_left_alone():
    # GIVEN a real model and optimizer, with a gradient already there
    net, opt, step = mlp_step()
    params = list(net.parameters())
    values = [p.detach().clone() for p in params]
    params[0].grad = torch.full_like(params[0], 7.0)
    grad0 = params[0].grad
    history: list[float] = []
    # WHEN a step runs dry (SGD with momentum writes parameters, grads and state)
    r = cpu(lambda: (step(), history.append(1.0), setattr(net, "extra", 1)), keep=[net, opt])
    # THEN the real tensors keep their values, the gradients are the ones from before
    assert r.error is None
    assert all(torch.equal(a, b) for a, b in zip(values, params, strict=True))
    assert params[0].grad is grad0 and all(p.grad is None for p in params[1:])
    assert type(params[0]) is nn.Parameter and params[0].grad.unique().tolist() == [7.0]
    # and what it bound in the objects it was given is undone; a list it wasn't given is not
    assert len(opt.state) == 0 and not hasattr(net, "extra")
    assert history == [1.0]
    assert any("put back" in n for n in r.notes)


def test_torch_switches_and_requires_grad_are_put_back():
    net = nn.Linear(4, 4)
    before = torch.random.get_rng_state()

    def run():
        torch.manual_seed(123)
        torch.set_grad_enabled(False)
        torch.set_default_dtype(torch.float64)
        net.requires_grad_(False)
        net.eval()

    r = cpu(run, keep=[net])
    assert r.error is None
    assert torch.equal(torch.random.get_rng_state(), before)
    assert torch.is_grad_enabled() and torch.get_default_dtype() == torch.float32
    assert all(p.requires_grad for p in net.parameters()) and net.training


def test_a_cell_leaves_the_namespace_exactly_as_it_was(shell):
    # GIVEN a namespace with a real model, optimizer, input and a function that rebinds
    net, opt, _ = mlp_step()
    x = torch.randn(32, 8)
    values = [p.detach().clone() for p in net.parameters()]
    shell.run_cell("def rebind():\n    global counter\n    counter = 99\n")
    shell.user_ns.update(net=net, opt=opt, x=x, counter=1, log=[])
    before = dict(shell.user_ns)
    # WHEN a cell binds names, rebinds others, and takes an SGD step on the real model
    cell = (
        "y = net(x).square().mean()\n"
        "y.backward()\n"
        "opt.step()\n"
        "net = None\n"
        "rebind()\n"
        "log.append(y)\n"
    )
    r = CellSource(shell, cell).record(device_type="cpu")
    # THEN the namespace holds exactly what it held, names bound by the cell are gone
    assert r.error is None
    assert "y" not in shell.user_ns
    assert shell.user_ns.keys() == before.keys()
    assert all(shell.user_ns[k] is v for k, v in before.items())
    assert shell.user_ns["counter"] == 1 and shell.user_ns["log"] == []
    # and the real tensors kept their values, with no gradient and no optimizer state
    params = list(net.parameters())
    assert all(torch.equal(a, b) for a, b in zip(values, params, strict=True))
    assert all(p.grad is None for p in params) and len(opt.state) == 0
    assert r.peak > 0 and r.input_bytes > 0
    for k in ("net", "opt", "x", "counter", "log", "rebind"):
        shell.user_ns.pop(k, None)


def test_a_cell_names_its_line_as_ipython_does(shell):
    shell.user_ns["z"] = torch.ones(3)
    try:
        r = CellSource(shell, "a = z * 2\nb = a.unique()\n", first_line=2).record(device_type="cpu")
    finally:
        shell.user_ns.pop("z")
    assert r.error is not None and r.error.kind == "dynamic shape"
    assert r.error.where == f"In[{shell.execution_count}] line 3"
    assert r.error.line.endswith(f"at In[{shell.execution_count}] line 3")
    assert "a" not in shell.user_ns and "b" not in shell.user_ns


def test_a_cell_that_does_not_compile_says_so(shell):
    r = CellSource(shell, "x = (\n").record(device_type="cpu")
    assert r.error is not None and r.error.kind == "syntax"
    assert r.events == [] and r.error.message.startswith("SyntaxError")


# -- cost -------------------------------------------------------------------------------


def test_a_small_step_runs_dry_in_a_fraction_of_a_second():
    *_, warm = mlp_step()
    cpu(warm)  # the first dry run of a process imports torch._dynamo (about 1 s here)
    *_, step = mlp_step()
    start = time.perf_counter()
    r = cpu(step, workspaces=TABLE)
    took = time.perf_counter() - start
    assert r.error is None and r.ops > 50
    assert took < 0.5, f"{took:.3f} s for {r.ops} ops"


# -- what the peak is made of: the breakdown's hooks -------------------------------------------


def global_hooks() -> tuple[int, ...]:
    from torch.nn.modules import module
    from torch.optim import optimizer

    return (
        len(module._global_forward_pre_hooks),
        len(module._global_forward_hooks),
        len(module._global_forward_hooks_always_called),
        len(optimizer._global_optimizer_pre_hooks),
        len(optimizer._global_optimizer_post_hooks),
    )


def test_the_hooks_are_there_during_the_run_only_also_when_it_fails():
    before = global_hooks()
    during = collections.deque()  # a spy the dry run does not put back (not a list)

    def run():
        during.append((global_hooks(), torch._C._autograd._top_saved_tensors_default_hooks(False)))
        raise ValueError("boom")

    r = cpu(run)
    assert r.error is not None and r.error.message == "ValueError: boom"
    ((hooks, saved),) = during
    # one more forward pre-hook and forward hook (always called), optimizer pre and post
    assert [n - b for n, b in zip(hooks, before, strict=True)] == [1, 1, 1, 1, 1]
    assert saved is not None
    assert global_hooks() == before
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    disable = torch._C._autograd._saved_tensors_hooks_disable
    assert disable.__name__ == "_saved_tensors_hooks_disable"  # torch's own, put back


def test_the_hooks_change_no_event():
    """The pack hook keeps saved outputs as detached aliases (no reference cycle, which
    would free them only at the garbage collector's pass), saved inputs as they are: the
    storages die exactly when they do without the hooks."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(32)
            self.lin = nn.Linear(32, 32)

        def forward(self, x):
            h = self.lin(self.norm(x)).sigmoid()  # saves its output
            h = torch.softmax(h * h.tanh(), dim=-1)
            return nn.functional.gelu(h).exp().sum()

    def step():
        torch.manual_seed(0)
        net = Net()
        opt = torch.optim.Adam(net.parameters())
        for _ in range(2):
            net(torch.randn(16, 32)).backward()
            opt.step()
            opt.zero_grad()

    import gc

    gc.disable()  # a cycle would show as a missing or late free
    try:
        plain = cpu(step, breakdown=False)
        watched = cpu(step)
    finally:
        gc.enable()
    assert plain.seen is None and watched.seen is not None
    assert watched.seen.saved and watched.seen.marks
    assert [(type(e), e.key, getattr(e, "nbytes", 0)) for e in watched.events] == [
        (type(e), e.key, getattr(e, "nbytes", 0)) for e in plain.events
    ]


def test_a_step_is_marked_and_its_storages_claimed_by_key():
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))  # real, from before

    def run():
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model(torch.randn(32, 8)).square().mean().backward()
        opt.step()
        net(torch.randn(2, 8))  # a real model: its parameters are not the run's allocations

    r = cpu(run)
    assert r.error is None and r.seen is not None
    seen = r.seen
    phases = [m.phase for m in seen.marks]
    assert phases == [
        "forward",
        "other",
        "backward",
        "backward done",
        "optimizer step",
        "other",
        "forward",
        "other",
    ]
    assert [m.at for m in seen.marks] == sorted(m.at for m in seen.marks)
    sizes = {e.key: e.nbytes for e in allocs(r)}
    by = {}
    for key, category in seen.claims.items():
        by.setdefault(category, []).append(sizes[key])
    assert sorted(by["parameters"]) == sorted([8 * 16 * 4, 16 * 4, 16 * 4 * 4, 4 * 4])
    assert sorted(by["gradients"]) == sorted(by["parameters"])
    assert sorted(by["optimizer state"]) == sorted(by["parameters"])  # momentum buffers
    # the modules: by class (the function binds no name the run can see), innermost
    names = seen.modules
    assert names[:4] == ["Sequential", "Sequential.0", "Sequential.1", "Sequential.2"]
    made = {names[e.module] for e in allocs(r) if e.module >= 0}
    assert {"Sequential.0", "Sequential.1", "Sequential.2"} <= made
    # saved: the input by Linear 1, ReLU's output by ReLU (and by Linear 2), by key
    saved = [(sizes[s.key], names[s.module] if s.module >= 0 else "") for s in seen.saved]
    assert (32 * 8 * 4, "Sequential.0") in saved and (32 * 16 * 4, "Sequential.1") in saved


def test_roots_are_named_after_the_variables_of_the_cell_or_the_namespace(shell):
    shell.user_ns.update(torch=torch, nn=nn, before=nn.Linear(4, 4))
    cell = (
        "x = torch.ones(2, 4)\n"
        "model = nn.Sequential(nn.Linear(4, 4))\n"
        "model(x)\n"  # bound before its first forward: found then
        "before(x)\n"  # in the namespace before the cell
        "nn.Linear(4, 4)(x)\n"  # never bound: its class
        "late = nn.Linear(4, 2)\n"
        "y = late(x)\n"
        "alias = late\n"
    )
    try:
        r = CellSource(shell, cell).record(device_type="cpu")
    finally:
        for k in ("torch", "nn", "before"):
            shell.user_ns.pop(k)
    assert r.error is None and r.seen is not None
    names = r.seen.modules
    assert {"model", "model.0", "before", "Linear", "late"} <= set(names)
    assert "alias" not in names


def test_a_module_the_run_drops_is_freed_as_without_the_hooks():
    def run():
        m = nn.Linear(256, 256)  # 256 KiB of weight
        m(torch.randn(4, 256))
        del m
        torch.empty(10)

    r = cpu(run)
    a = allocs(r)
    weight = next(e for e in a if e.nbytes == 256 * 256 * 4)
    assert r.events.index(Free(weight.key)) < r.events.index(a[-1])


def test_a_tensor_modified_in_place_after_it_was_saved_raises_autograd_s_error():
    def run():
        w = torch.ones(4, requires_grad=True)
        y = w.sigmoid()
        y.mul_(2)  # sigmoid's backward needs its output
        y.sum().backward()

    real = None
    try:
        run()
    except RuntimeError as e:
        real = str(e)
    assert real is not None and "modified by an inplace operation" in real
    r = cpu(run)
    assert r.error is not None and "modified by an inplace operation" in r.error.message


def test_a_run_that_switches_saved_tensor_hooks_off_runs_again_without_them():
    runs = collections.deque()  # a spy the dry run does not put back (not a list)

    def run():
        runs.append(1)
        w = torch.ones(4, requires_grad=True)
        with torch.autograd.graph.disable_saved_tensors_hooks("not with hooks"):
            (w * w).sum().backward()

    r = cpu(run)
    assert r.error is None and len(runs) == 2
    assert r.seen is None
    assert "switches saved-tensor hooks off" in r.notes[0]


def test_torch_s_warnings_about_fake_tensors_are_not_shown_but_the_user_s_are():
    import warnings

    def run():
        layer = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
        net = torch.nn.TransformerEncoder(layer, 2)  # deep-copies the fake layer
        warnings.warn("the user's own warning", UserWarning, stacklevel=1)
        return net

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = cpu(run)
    assert r.error is None
    texts = [str(w.message) for w in caught]
    assert "the user's own warning" in texts
    assert not any("data pointer of FakeTensor" in t for t in texts), texts


def test_a_convolution_s_workspace_is_named_as_not_sized(monkeypatch):
    """Not sized where cuDNN runs it and cannot be asked; nothing unseen where another
    backend runs it (the CPU's), nor for a matmul."""
    from jupyter_gpumem.collectors.dry_run import conv as conv_module
    from jupyter_gpumem.collectors.dry_run import cudnn

    def step():
        return nn.Conv2d(3, 8, 3)(torch.randn(1, 3, 8, 8))

    assert not cpu(step).unseen  # the CPU's own convolution: no cuDNN workspace
    monkeypatch.setattr(conv_module, "backend", lambda t, args: "Cudnn")
    monkeypatch.setattr(cudnn, "sizer", lambda t, device: (None, "no CUDA context"))
    r = cpu(step)
    assert r.error is None
    assert any("convolutions" in u for u in r.unseen)
    assert not cpu(lambda: torch.randn(4, 4) @ torch.randn(4, 4)).unseen


def test_sizes_that_depend_on_values_are_exact_when_known_else_the_worst_case():
    def run():
        m = torch.arange(10) < 3  # known: made of constants
        exact = torch.nonzero(m)
        x = torch.randn(1000, 16)
        worst = x[x[:, 0] > 0]  # unknown: every row selected
        return exact, worst

    r = cpu(run)
    assert r.error is None, r.error
    sizes = {e.op: e.nbytes for e in tensor_allocs(r)}
    assert sizes["aten.nonzero.default"] == 3 * 1 * 8
    assert sizes["aten.index.Tensor"] == 1000 * 16 * 4
    assert any("nonzero" in n and "exactly" in n for n in r.notes)
    assert any("index.Tensor" in n and "worst case" in n for n in r.notes)


def test_a_mixture_of_experts_loop_is_planned_as_the_worst_routing_and_says_so():
    tokens, d, experts, k = 64, 32, 4, 2

    def run():
        x = torch.randn(tokens, d)
        router = nn.Linear(d, experts)
        layers = [nn.Linear(d, d) for _ in range(experts)]
        weights, chosen = router(x).topk(k, dim=-1)
        mask = torch.nn.functional.one_hot(chosen, experts).permute(2, 1, 0)
        out = torch.zeros_like(x)
        for e in range(experts):
            slot, token = torch.where(mask[e])
            out.index_add_(0, token, layers[e](x[token]) * weights[token, slot, None])
        return out

    r = cpu(run)
    assert r.error is None, r.error
    picked = [a.nbytes for a in tensor_allocs(r) if a.op == "aten.index.Tensor"]
    # every expert's tokens as the worst case: all k slots of all tokens, d floats each
    assert max(picked) == tokens * k * d * 4
    assert any("worst case" in n for n in r.notes)


def test_linear_on_a_strided_input_adds_its_bias_in_place_as_the_real_op_does():
    # GIVEN a 3-D input that is not contiguous (an RNN's batch-first output, transposed)
    lin = nn.Linear(32, 64)

    def run():
        x = torch.randn(16, 8, 32).transpose(0, 1)  # not contiguous
        return lin(x)

    r = cpu(run, keep=[lin])
    assert r.error is None
    # THEN one output-sized block (the matmul's, the bias added into it), as at::linear
    # makes for real; no out-of-place add
    out = 8 * 16 * 64 * 4
    made = [a for a in tensor_allocs(r) if a.nbytes == out]
    assert len(made) == 1, [(a.op, a.nbytes) for a in tensor_allocs(r)]
    assert not any(a.op == "aten.add.Tensor" for a in tensor_allocs(r))
    assert torch.nn.functional.linear is torch._C._nn.linear  # put back
    # the same numbers as the real op, outside a dry run too
    x = torch.randn(16, 8, 32).transpose(0, 1)
    assert torch.allclose(lin(x), torch._C._nn.linear(x, lin.weight, lin.bias))
