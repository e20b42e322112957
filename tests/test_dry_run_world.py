"""`%%gpumem --dry-run --world-size N` and `jupyter_gpumem.dry_run(fn, world_size=N)`: the
cell as rank 0 of a job of N processes, in PyTorch's fake process group
(`collectors/dry_run/group.py`), on the CPU build of torch. The dry run models the CPU's
storages as one GPU's (``device_type="cpu"``); FSDP2's mesh is then a CPU mesh, the path
is otherwise the one a GPU takes (the GPU side: tests/gpu/fsdp_world_cases.py).

Ground truth by construction: ``nn.Linear(1024, 1024, bias=False)`` layers of P = 4 MiB
of float32 each, so that every sharded tensor is exactly P / N bytes."""

from __future__ import annotations

import collections
import os
import subprocess
import sys

import pytest
from IPython.core.error import UsageError

import jupyter_gpumem
from jupyter_gpumem._ipython.cell_source import CellSource
from jupyter_gpumem.collectors.dry_run.group import (
    ENVIRONMENT,
    MAX_WORLD_SIZE,
    check_world_size,
    fake_job,
    refusal,
)
from jupyter_gpumem.errors import GpuMemError

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():  # pragma: no cover - a torch built without distributed
    pytest.skip("torch.distributed is not available in this build", allow_module_level=True)

from jupyter_gpumem.collectors.dry_run import run as fake_run  # noqa: E402
from jupyter_gpumem.core.dry_run import dry_run  # noqa: E402
from jupyter_gpumem.core.dry_scan import dry_scan  # noqa: E402

MiB = 1 << 20
P = 1024 * 1024 * 4  # one Linear(1024, 1024, bias=False) in float32

_keep: list[object] = []  # what a step leaves alive, for live_at_end


@pytest.fixture(autouse=True)
def _nothing_kept():
    _keep.clear()
    yield
    _keep.clear()


def record(step, world_size: int) -> fake_run.FakeRun:
    with fake_job(world_size):
        return fake_run.record(step, device_type="cpu")


def layers(n: int = 4):
    return torch.nn.Sequential(*[torch.nn.Linear(1024, 1024, bias=False) for _ in range(n)])


def fsdp_step(n_layers: int = 4) -> None:
    from torch.distributed.fsdp import fully_shard

    model = layers(n_layers)
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(64, 1024)).sum().backward()
    opt.step()
    _keep.append((model, opt))


def plain_step(n_layers: int = 4) -> None:
    model = layers(n_layers)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(64, 1024)).sum().backward()
    opt.step()
    _keep.append((model, opt))


def ddp_step(ddp: bool = True, steps: int = 1) -> None:
    model = layers()
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(steps):
        model(torch.randn(64, 1024)).sum().backward()
        opt.step()
    _keep.append((model, opt))


def sizes(run: fake_run.FakeRun) -> list[int]:
    return sorted(a.nbytes for a in run.live_at_end())


# -- the world size ---------------------------------------------------------------------------
@pytest.mark.parametrize("value", [0, -1, "two", 10**9, MAX_WORLD_SIZE + 1, 2.0, True, None, ""])
def test_a_world_size_that_is_not_a_whole_number_from_1_is_refused(value):
    with pytest.raises(GpuMemError, match="world size must be a whole number from 1 to 65536"):
        check_world_size(value)
    with pytest.raises(GpuMemError, match="world size must be"), fake_job(value):
        pass  # pragma: no cover


def test_a_world_size_is_a_whole_number_or_its_digits():
    assert [check_world_size(v) for v in (1, 8, "16", " 4 ", MAX_WORLD_SIZE)] == [
        1,
        8,
        16,
        4,
        MAX_WORLD_SIZE,
    ]


def test_the_function_refuses_a_bad_world_size_before_anything_else():
    for value in (0, -1, "two", 10**9):
        with pytest.raises(jupyter_gpumem.GpuMemError, match="world size must be"):
            jupyter_gpumem.dry_run(lambda: None, world_size=value)
    if torch.version.cuda is None:
        with pytest.raises(jupyter_gpumem.NoGpuError, match="CPU-only build"):
            jupyter_gpumem.dry_run(lambda: None, world_size=2)


def test_one_process_needs_no_group_and_imports_nothing():
    code = (
        "import sys\n"
        "from jupyter_gpumem.collectors.dry_run.group import fake_job\n"
        "with fake_job(1) as job:\n"
        "    assert job.world_size == 1\n"
        "assert not any(m == 'torch' or m.startswith('torch.') for m in sys.modules), 'torch'\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    with fake_job(1):
        assert not dist.is_initialized()


# -- the job, and nothing left behind ---------------------------------------------------------
def _state() -> dict[str, object]:
    """Everything the job patches, as it is now."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor._sharding_prop import ShardingPropagator
    from torch.nn.parallel.distributed import DistributedDataParallel

    names = (
        "init_device_mesh",
        "_verify_param_shape_across_processes",
        "init_process_group",
        "destroy_process_group",
    )
    found: dict[str, object] = {}
    for name, module in list(sys.modules.items()):
        for attr in names:
            value = vars(module).get(attr) if hasattr(module, "__dict__") else None
            if value is not None:
                found[f"{name}.{attr}"] = value
    found["DeviceMesh.from_group"] = vars(DeviceMesh)["from_group"]
    found["ShardingPropagator._propagate_tensor_meta_non_cached"] = vars(ShardingPropagator)[
        "_propagate_tensor_meta_non_cached"
    ]
    found["DDP._pre_forward"] = vars(DistributedDataParallel)["_pre_forward"]
    found.update({f"env {k}": os.environ.get(k) for k in ENVIRONMENT})
    return found


def test_the_job_is_rank_0_of_n_and_leaves_nothing_behind():
    import torch.distributed.fsdp  # noqa: F401  (its modules hold init_device_mesh too)

    before = _state()
    meshes = [k for k in before if k.endswith(".init_device_mesh")]
    assert len(meshes) >= 4, meshes  # device_mesh, distributed, tensor, fsdp's init
    spy: collections.deque = collections.deque()  # the dry run puts dicts back, not this

    def step() -> None:
        spy.append(("rank", dist.get_rank()))
        spy.append(("size", dist.get_world_size()))
        spy.append(("backend", dist.get_backend()))
        spy.append(("env", {k: os.environ.get(k) for k in ENVIRONMENT}))
        fsdp_step(1)

    run = record(step, 4)
    assert run.error is None, run.error
    assert dict(spy) == {
        "rank": 0,
        "size": 4,
        "backend": "fake",
        "env": {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"},
    }
    assert not dist.is_initialized()
    after = _state()
    assert after == before  # every patch undone, in every module that held one
    # and a second job in the same process works as the first did
    again = record(step, 4)
    assert again.error is None and sizes(again) == sizes(run)
    assert not dist.is_initialized() and _state() == before


def test_a_failing_cell_still_takes_the_job_down():
    def step() -> None:
        raise RuntimeError("the cell's own error")

    before = _state()
    run = record(step, 2)
    assert run.error is not None and "the cell's own error" in run.error.message
    assert not dist.is_initialized() and _state() == before


def test_a_process_that_has_a_group_is_refused_and_keeps_it():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        why = refusal(2)
        assert why is not None
        assert why.startswith("a process group is already initialised in this process")
        assert "backend gloo, world size 1" in why
        assert "does not replace a real job's group" in why
        with pytest.raises(GpuMemError, match="already initialised"), fake_job(2):
            pass  # pragma: no cover
        with pytest.raises(GpuMemError, match="already initialised"):
            dry_run(lambda: None, device_type="cpu", world_size=2)
        assert dist.is_initialized() and dist.get_backend() == "gloo"  # still the user's
        assert refusal(1) is None  # one process needs no group: nothing to refuse
    finally:
        dist.destroy_process_group()


# -- FSDP2 ------------------------------------------------------------------------------------
def test_fully_shard_leaves_rank_0_a_quarter_of_the_parameter():
    run = record(lambda: fsdp_step(1), 4)
    assert run.error is None, run.error
    shards = [a for a in run.live_at_end() if a.nbytes == P // 4]
    assert shards, sizes(run)  # the parameter's shard: 1024 x 1024 x 4 B / 4
    assert any(a.op == "aten.new_zeros.default" for a in shards)  # FSDP2's padded shard
    notes = " ".join(run.notes)
    assert "collectives ran" in notes


def test_fully_shard_shards_the_gradient_and_adamw_state_likewise():
    run = record(lambda: fsdp_step(1), 4)
    assert run.error is None, run.error
    # the parameter, its gradient and AdamW's two states, each a quarter; the step count
    assert sizes(run) == [4, P // 4, P // 4, P // 4, P // 4]


def test_the_per_rank_peak_is_what_the_sharding_predicts():
    """The step's peak is in AdamW's step (parameters, gradients, two states and the
    step's temporaries): all of it sharded except the four step counts, so rank 0 of 2
    holds half of what one process holds."""
    one = fake_run.record(plain_step, device_type="cpu")
    _keep.clear()
    two = record(fsdp_step, 2)
    assert one.error is None and two.error is None, two.error
    unsharded = 4 * 4  # four float32 step counts (the batch is gone by the step)
    assert two.peak < one.peak
    assert two.peak - unsharded == (one.peak - unsharded) // 2
    assert sum(sizes(two)) - 16 == (sum(sizes(one)) - 16) // 2


def test_the_predicted_peak_allocated_halves_with_two_ranks():
    """The same through the allocator's model: each block rounded to 512 bytes, the
    sharded part halves and the rest (four step counts) stays."""
    one = dry_run(plain_step, device_type="cpu")
    _keep.clear()
    two = dry_run(fsdp_step, device_type="cpu", world_size=2)
    assert one.stopped is None and two.stopped is None, two.notes
    assert (one.world_size, two.world_size) == (1, 2)
    rest = 4 * 512
    a1, a2 = one.devices[0].peak_allocated, two.devices[0].peak_allocated
    assert a2 - rest == (a1 - rest) // 2


# -- DDP and ZeRO -----------------------------------------------------------------------------
def test_ddp_holds_its_gradient_buckets_beside_the_gradients():
    """DDP's reducer keeps a flat bucket of every gradient (the four 4 MiB gradients fit
    in one 25 MiB bucket): the peak is one process's plus the bucket."""
    plain = record(lambda: ddp_step(ddp=False), 2)
    _keep.clear()
    ddp = record(ddp_step, 2)
    assert plain.error is None and ddp.error is None, ddp.error
    assert 4 * P in sizes(ddp) and 4 * P not in sizes(plain)  # the bucket, alive with DDP
    assert ddp.peak - plain.peak == 4 * P
    notes = " ".join(ddp.notes)
    assert "collectives ran" in notes


def test_ddp_trains_for_two_steps_and_says_what_its_rebuild_may_hold():
    """PyTorch rebuilds DDP's buckets at the second forward (which reads values on the
    host): skipped, the first step's buckets stay, and a note says what the real job may
    hold beside them for a while."""
    r = dry_run(lambda: ddp_step(steps=2), device_type="cpu", world_size=2)
    assert r.stopped is None, r.notes
    assert any(n.startswith("DDP's buckets keep the layout of the first step") for n in r.notes)
    assert any("ran as rank 0 of 2 processes in PyTorch's fake process group" in n for n in r.notes)
    one = dry_run(ddp_step, device_type="cpu", world_size=2)  # one step: nothing rebuilt
    assert not any("DDP's buckets keep" in n for n in one.notes)


def test_zero_keeps_the_optimizer_state_of_its_own_parameters():
    """ZeroRedundancyOptimizer gives rank 0 one parameter in N of four equal ones: AdamW's
    two states for those alone."""

    def step() -> None:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        model = layers()
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW)
        model(torch.randn(64, 1024)).sum().backward()
        opt.step()
        _keep.append((model, opt))

    for n, mine in ((2, 2), (4, 1)):
        run = record(step, n)
        _keep.clear()
        assert run.error is None, run.error
        # parameters and gradients whole, states for rank 0's parameters, step counts
        assert sizes(run) == [4] * mine + [P] * (4 + 4 + 2 * mine)


def test_a_script_for_torchrun_runs_as_its_rank_0():
    """A cell written for torchrun: it inits its own group (answered by the fake one),
    reads its rank from the environment and takes its group down at the end."""

    def script() -> None:
        dist.init_process_group("nccl")
        rank = int(os.environ["LOCAL_RANK"])
        model = torch.nn.parallel.DistributedDataParallel(layers())
        assert rank == 0
        model(torch.randn(64, 1024)).sum().backward()
        dist.destroy_process_group()

    r = dry_run(script, device_type="cpu", world_size=8)
    assert r.stopped is None, r.notes
    assert "the cell's init_process_group was answered by the fake group (rank 0 of 8)" in r.notes
    assert not dist.is_initialized()


# -- the report -------------------------------------------------------------------------------
def test_the_report_says_which_rank_and_what_the_fake_group_counts():
    from jupyter_gpumem.reporters.dry_run import dry_run_text

    r = dry_run(lambda: fsdp_step(1), device_type="cpu", world_size=4)
    assert r.world_size == 4 and r.stopped is None
    text = dry_run_text(r)
    assert text.startswith("gpumem: dry run of function, as rank 0 of 4 processes: predicted")
    assert (
        "ran as rank 0 of 4 processes in PyTorch's fake process group: collectives moved no "
        "data; the buffers they take from PyTorch's allocator (FSDP2's all-gather and "
        "reduce-scatter buffers, DDP's buckets) are counted"
    ) in text
    assert "NCCL's own buffers are outside PyTorch's allocator" in text
    assert "fsdp." not in text  # FSDP2's copy ops are torch's own: no "custom op" note


def test_a_cell_that_shards_nothing_is_told_so():
    r = dry_run(plain_step, device_type="cpu", world_size=2)
    assert r.stopped is None
    assert any("but no collective ran: nothing was sharded or reduced" in n for n in r.notes)


def test_one_process_is_todays_dry_run():
    r = dry_run(lambda: plain_step(1), device_type="cpu")
    assert r.world_size == 1
    assert not any("rank 0" in n for n in r.notes)


def test_a_scan_without_running_runs_each_value_as_rank_0(shell):
    from jupyter_gpumem.analysis.targets import parse_target
    from jupyter_gpumem.reporters.dry_run import dry_scan_html, dry_scan_text

    shell.run_cell("import torch\nn = 'mine'")
    body = (
        "import torch.distributed as dist\n"
        "x = torch.empty((n << 20) * dist.get_world_size(), dtype=torch.uint8)\n"
    )
    target = parse_target("1GiB")  # 282 MiB of cap beside 742 MiB
    s = dry_scan(
        CellSource(shell, body), "n", (8, 16), True, target, device_type="cpu", world_size=2
    )
    assert s.world_size == 2
    assert (s.largest, s.smallest_failing) == (141, 142)  # 2 x 141 MiB fits, 2 x 142 does not
    assert shell.user_ns["n"] == "mine" and "x" not in shell.user_ns
    assert not dist.is_initialized()
    text = dry_scan_text(s)
    assert ", as rank 0 of 2 processes: n" in text.splitlines()[0]
    assert "as rank 0 of 2 processes" in dry_scan_html(s)


# -- the magic --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "line, message",
    [
        ("--world-size 2", "--world-size goes with --dry-run"),
        ("--scan batch=1,2 --world-size 2", "--world-size goes with --dry-run"),
        ("--dry-run --world-size 0", "--world-size: world size must be a whole number from 1"),
        ("--dry-run --world-size -1", "--world-size: world size must be"),
        ("--dry-run --world-size two", "--world-size: world size must be"),
        ("--dry-run --world-size 1000000000", "--world-size: world size must be"),
        ("--dry-run --world-size 2 --check", "--check runs the cell here as one process"),
    ],
)
def test_the_magic_refuses_a_bad_world_size(ip, line, message):
    from jupyter_gpumem._ipython import current

    with pytest.raises(UsageError, match=message.replace("(", r"\(")[:50]):
        current().parse_cell_line(line)


def test_the_magic_takes_the_world_size_with_a_dry_run(ip):
    from jupyter_gpumem._ipython import current

    parse = current().parse_cell_line
    assert parse("--dry-run --world-size 8").world_size == 8
    assert parse("--dry-run").world_size == 1
    scan = parse("--scan batch=2,4 --dry-run --fit-in H100 --world-size 4")
    assert scan.world_size == 4 and scan.dry_run


def test_the_magic_on_a_cpu_build_says_so_and_runs_nothing(ip, capsys):
    if torch.version.cuda is not None:
        pytest.skip("a CUDA build of torch")
    ip.run_cell("import torch")
    ip.run_cell("%%gpumem --dry-run --world-size 4\nplanned_on_4 = torch.empty(10)")
    out = capsys.readouterr().err
    assert (
        "--dry-run needs torch and a CUDA GPU" in out
        and "CPU-only build" in out
        and "planned_on_4" not in ip.user_ns
    )
    assert not dist.is_initialized()


def test_the_magic_refuses_a_process_that_has_a_group(ip, capsys, monkeypatch):
    """On a CUDA build (pretended: the refusal comes before anything runs)."""
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    ip.run_cell("import torch")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ip.run_cell("%%gpumem --dry-run --world-size 2\nnever_planned = 1")
        out = capsys.readouterr().err
        assert "UsageError: a process group is already initialised in this process" in out
        assert "the cell did not run" in out and "never_planned" not in ip.user_ns
    finally:
        dist.destroy_process_group()
