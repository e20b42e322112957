"""A dry run changes nothing real: hostile cells in a real IPython shell (CPU storages stand
for the device's). Each cell's real tensors, weights, files, commands and the user's names
are checked by value after the run, and each refusal is one plain line naming what, which
file or command, and the user's line (``In[N] line L``)."""

from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")

from jupyter_gpumem._ipython.cell_source import CellSource  # noqa: E402
from jupyter_gpumem.analysis.targets import parse_target  # noqa: E402
from jupyter_gpumem.core.dry_run import dry_run  # noqa: E402
from jupyter_gpumem.core.dry_scan import dry_scan  # noqa: E402


@pytest.fixture
def ns(shell):
    """The shell with a real model, optimizer (one real step taken), counter and files."""
    shell.run_cell(
        "import torch, os, subprocess, socket, json\n"
        "torch.manual_seed(0)\n"
        "lin = torch.nn.Linear(64, 64)\n"
        "opt = torch.optim.AdamW(lin.parameters())\n"
        "lin(torch.randn(8, 64)).square().mean().backward()\n"
        "opt.step()\n"
        "steps = torch.zeros(())\n"
        "it = iter([1, 2, 3])\n"
    )
    yield shell
    for name in ("lin", "opt", "steps", "it", "ckpt", "log", "cfg", "marker", "x", "out"):
        shell.user_ns.pop(name, None)


def snapshot(shell) -> dict[str, object]:
    """Everything real the cell could change, by value."""
    lin, opt = shell.user_ns["lin"], shell.user_ns["opt"]
    state = opt.state[lin.weight]
    return {
        "weight": lin.weight.detach().clone(),
        "bias": lin.bias.detach().clone(),
        "grad": lin.weight.grad.clone(),
        "exp_avg": state["exp_avg"].clone(),
        "step": state["step"].clone(),
        "steps": shell.user_ns["steps"].clone(),
        "ids": (id(lin.weight), id(lin.weight.grad), id(state["exp_avg"])),
        "names": sorted(k for k in shell.user_ns if not k.startswith("_")),
    }


def same(before: dict[str, object], after: dict[str, object]) -> bool:
    for k, v in before.items():
        w = after[k]
        if isinstance(v, torch.Tensor):
            if not (isinstance(w, torch.Tensor) and torch.equal(v, w)):
                return False
        elif v != w:
            return False
    return True


def dry(shell, source: str):
    return CellSource(shell, source).record(device_type="cpu")


def cell_line(shell, line: int) -> str:
    """How a dry run names line ``line`` of the cell it ran (the shell's execution count)."""
    return f"In[{shell.execution_count}] line {line}"


def test_in_place_ops_on_real_weights_and_counters_change_only_the_fake_copies(ns):
    before = snapshot(ns)
    r = dry(
        ns,
        "with torch.no_grad():\n"
        "    lin.weight.mul_(0)\n"
        "    lin.bias.zero_()\n"
        "    lin.weight.data.add_(1)\n"
        "steps += 1\n"
        "x = torch.randn(8, 64)\n"
        "lin(x).sum().backward()\n"
        "opt.step()\n"
        "opt.zero_grad()\n",
    )
    assert r.error is None, r.error
    assert same(before, snapshot(ns))
    # the real weights' storages were held from the start (the cell used them), not made
    assert sum(a.nbytes for a in r.held) >= 64 * 64 * 4 + 64 * 4


def test_a_real_optimizer_step_count_keeps_its_value_in_the_dry_run(ns):
    # AdamW's step count (a CPU scalar) divides by 1 - beta ** step: read as 0 it would fail
    before = snapshot(ns)
    r = dry(ns, "lin(torch.randn(8, 64)).sum().backward()\nopt.step()\n")
    assert r.error is None, r.error
    assert same(before, snapshot(ns))


def test_torch_save_over_a_checkpoint_is_refused_and_the_file_stays(ns, tmp_path):
    ckpt = tmp_path / "model.pt"
    torch.save(ns.user_ns["lin"].state_dict(), ckpt)
    data = ckpt.read_bytes()
    ns.user_ns["ckpt"] = str(ckpt)
    r = dry(ns, "y = lin(torch.randn(2, 64))\ntorch.save(lin.state_dict(), ckpt)\n")
    assert ckpt.read_bytes() == data
    assert r.error is not None and r.error.kind == "refused"
    line = r.error.line
    assert "torch.save" in line and str(ckpt) in line and cell_line(ns, 2) in line
    assert line.count("\n") == 0
    assert torch.load(ckpt)["weight"].shape == (64, 64)  # still a checkpoint that loads


@pytest.mark.parametrize(
    "code, what",
    [
        ("open(log, 'w').write('x')", "open("),
        (
            "with open(log, 'a') as f:\n    f.write(f'{lin(torch.randn(1, 64)).sum().item()}\\n')",
            "append",
        ),
        ("open(log, 'r+').write('x')", "open("),
        ("os.remove(log)", "os.remove"),
        ("os.rename(log, log + '.old')", "os.rename"),
        ("os.truncate(log, 0)", "os.truncate"),
        ("import shutil; shutil.rmtree(os.path.dirname(log))", "shutil.rmtree"),
        ("import numpy; numpy.save(log + '.npy', numpy.zeros(3))", "open("),
    ],
)
def test_writes_to_files_are_refused_and_the_file_stays(ns, tmp_path, code, what):
    log = tmp_path / "log.csv"
    log.write_text("step,loss\n")
    ns.user_ns["log"] = str(log)
    r = dry(ns, "x = lin(torch.randn(2, 64))\n" + code + "\n")
    assert log.read_text() == "step,loss\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.csv"]
    assert r.error is not None and r.error.kind == "refused", r.error
    assert what in r.error.line and cell_line(ns, 2) in r.error.line


@pytest.mark.parametrize(
    "code, what",
    [
        ("subprocess.run(['touch', marker])", "subprocess.Popen"),
        ("os.system('touch ' + marker)", "os.system"),
        ("!touch {marker}", "touch"),
    ],
)
def test_commands_are_refused_and_do_not_run(ns, tmp_path, code, what):
    marker = tmp_path / "ran"
    ns.user_ns["marker"] = str(marker)
    r = dry(ns, "x = lin(torch.randn(2, 64))\n" + code + "\n")
    assert not marker.exists()
    assert r.error is not None and r.error.kind == "refused", r.error
    assert what in r.error.line and "starts no process" in r.error.line
    assert cell_line(ns, 2) in r.error.line


def test_network_connections_are_refused(ns):
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    ns.user_ns["port"] = server.getsockname()[1]
    try:
        r = dry(ns, "socket.create_connection(('127.0.0.1', port), timeout=1)\n")
        with pytest.raises(TimeoutError):
            server.accept()  # nobody connected
    finally:
        server.close()
        ns.user_ns.pop("port")
    assert r.error is not None and r.error.kind == "refused"
    assert "opens no connection" in r.error.line and "127.0.0.1" in r.error.line


def test_a_refusal_the_cell_catches_still_stops_the_run(ns, tmp_path):
    log = tmp_path / "log.csv"
    ns.user_ns["log"] = str(log)
    caught = dry(ns, "try:\n    open(log, 'w')\nexcept Exception:\n    pass\nx = 1\n")
    swallowed = dry(ns, "try:\n    open(log, 'w')\nexcept:\n    pass\nx = 1\n")
    assert not log.exists()
    for r in (caught, swallowed):
        assert r.error is not None and r.error.kind == "refused"
        assert cell_line(ns, 2) in r.error.line


def test_reads_work(ns, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text('{"width": 32}')
    ns.user_ns["cfg"] = str(cfg)
    r = dry(ns, "width = json.load(open(cfg))['width']\nx = torch.empty(width, 4)\n")
    assert r.error is None, r.error
    assert 32 * 4 * 4 in [e.nbytes for e in r.events if hasattr(e, "nbytes")]


def test_what_cannot_be_undone_is_listed(ns):
    r = dry(ns, "batch = next(it)\nprint('loss', lin(torch.randn(2, 64)).sum())\n")
    assert r.error is None
    moved = [n for n in r.notes if "advanced `it`" in n]
    printed = [n for n in r.notes if "printed 1 line" in n]
    assert len(moved) == 1 and len(printed) == 1
    assert next(ns.user_ns["it"]) == 2  # it really moved on: the report says so


def test_the_users_names_and_containers_are_as_they_were(ns):
    ns.run_cell("losses = [1.0]\nconfig = {'lr': 1e-3}")
    try:
        before = snapshot(ns)
        r = dry(
            ns,
            "losses.append(lin(torch.randn(2, 64)).sum())\n"
            "config['lr'] = 0\n"
            "lin = torch.nn.Linear(2, 2)\n"
            "new_name = 1\n",
        )
        assert r.error is None, r.error
        assert ns.user_ns["losses"] == [1.0] and ns.user_ns["config"] == {"lr": 1e-3}
        assert "new_name" not in ns.user_ns
        assert same(before, snapshot(ns))
    finally:
        ns.user_ns.pop("losses")
        ns.user_ns.pop("config")


def test_converting_a_real_module_in_place_is_refused_or_put_back(ns):
    before = snapshot(ns)
    r = dry(ns, "lin.half()\nlin(torch.randn(2, 64).half())\n")
    after = snapshot(ns)
    assert ns.user_ns["lin"].weight.dtype == torch.float32
    assert same(before, after)
    assert r.error is None or r.error.kind == "refused"


def test_a_scan_without_running_refuses_the_same_and_leaves_everything(ns, tmp_path):
    log = tmp_path / "log.csv"
    log.write_text("kept\n")
    ns.user_ns["log"] = str(log)
    before = snapshot(ns)
    body = "x = torch.empty(n, 64)\nwith open(log, 'a') as f:\n    f.write('row')\n"
    s = dry_scan(CellSource(ns, body), "n", (8, 16), True, parse_target("1GiB"), device_type="cpu")
    assert log.read_text() == "kept\n"
    assert same(before, snapshot(ns))
    assert s.largest is None and s.points and s.points[0].stopped is not None
    assert "writes no file" in s.points[0].stopped
    assert len(s.points) == 1  # the scan stopped at the first value that could not run


def test_dry_run_of_a_function_puts_back_what_its_closure_and_globals_hold(tmp_path):
    lin = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
    lin(torch.randn(2, 16)).sum().backward()
    opt.step()
    weight, grad = lin.weight.detach().clone(), lin.weight.grad.clone()
    momentum = opt.state[lin.weight]["momentum_buffer"].clone()
    losses: list[object] = []
    target = tmp_path / "out.pt"

    def step() -> None:
        loss = lin(torch.randn(4, 16)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss)
        torch.save(lin.state_dict(), target)

    r = dry_run(step, device_type="cpu")
    assert torch.equal(lin.weight, weight) and torch.equal(lin.weight.grad, grad)
    assert torch.equal(opt.state[lin.weight]["momentum_buffer"], momentum)
    assert losses == [] and not target.exists()
    assert r.stopped is not None and "torch.save" in r.stopped


def test_the_notebook_holds_what_the_cell_uses_and_the_report_names_it(ns):
    # GIVEN a model and its optimizer state made in earlier cells (real), a step planned
    lin, opt = ns.user_ns["lin"], ns.user_ns["opt"]
    params = sum(p.nbytes for p in lin.parameters())
    grads = sum(p.grad.nbytes for p in lin.parameters())
    states = sum(v.nbytes for s in opt.state.values() for v in s.values())  # step counts too
    r = dry_run(
        cell=CellSource(ns, "lin(torch.randn(8, 64)).sum().backward()\nopt.step()\n"),
        device_type="cpu",
    )
    assert r.stopped is None, r.notes
    # THEN what it found and used is held from the cell's start, named by who holds it
    owners = dict(r.held_by)
    assert owners["lin's parameters"] == params
    assert owners["lin's gradients"] == grads
    assert owners["opt's state"] == states
    assert r.held == params + grads + states
    assert r.devices[0].peak_allocated >= r.held


def test_the_real_objects_are_not_reached_after_the_run(ns):
    """No fake tensor is left in the user's objects (a gradient, a state, a parameter)."""
    from torch._subclasses.fake_tensor import FakeTensor

    dry(ns, "lin(torch.randn(8, 64)).sum().backward()\nopt.step()\nopt.zero_grad()\n")
    lin, opt = ns.user_ns["lin"], ns.user_ns["opt"]
    tensors = [*lin.parameters(), *(p.grad for p in lin.parameters())]
    tensors += [v for s in opt.state.values() for v in s.values()]
    assert not any(isinstance(x, FakeTensor) for x in tensors)
    assert "torch" in sys.modules and os.getcwd()


def test_resizing_a_real_storage_is_refused(ns):
    before = snapshot(ns)
    r = dry(ns, "lin.weight.untyped_storage().resize_(0)\n")
    assert same(before, snapshot(ns))
    assert r.error is not None and r.error.kind == "refused" and "resize_" in r.error.line


def test_a_module_first_imported_in_a_dry_run_writes_its_bytecode_cache(ns, tmp_path):
    (tmp_path / "fresh_module_for_dry_run.py").write_text("VALUE = 3\n")
    sys.path.insert(0, str(tmp_path))
    try:
        r = dry(
            ns, "import fresh_module_for_dry_run\nx = torch.empty(fresh_module_for_dry_run.VALUE)\n"
        )
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("fresh_module_for_dry_run", None)
    assert r.error is None, r.error


def test_libraries_may_make_their_own_temporary_files_but_not_touch_others(ns, tmp_path):
    import tempfile

    kept = tmp_path / "kept.txt"
    kept.write_text("kept")
    ns.user_ns["kept"] = str(kept)
    r = dry(
        ns,
        "import tempfile, shutil\n"
        "d = tempfile.mkdtemp()\n"
        "with open(os.path.join(d, 'cache.bin'), 'wb') as f:\n"
        "    f.write(b'x')\n"
        "with tempfile.NamedTemporaryFile() as f:\n"
        "    f.write(b'y')\n"
        "os.link(os.path.join(d, 'cache.bin'), os.path.join(d, 'probe-link'))\n"
        "shutil.rmtree(d)\n"
        "x = torch.empty(4)\n",
    )
    assert r.error is None, r.error
    linked = dry(ns, "os.link(kept, kept + '.link')\n")
    assert linked.error is not None and "os.link" in linked.error.line
    again = dry(ns, "import tempfile\nd = tempfile.mkdtemp()\nos.remove(kept)\n")
    assert kept.read_text() == "kept"
    assert again.error is not None and "os.remove" in again.error.line
    assert any("new temporary" in n for n in again.notes)
    assert tempfile.gettempdir()


def test_a_long_dry_run_shows_how_it_goes_and_its_own_output_is_not_the_cells(ns, monkeypatch):
    from jupyter_gpumem.collectors.dry_run import state as fake_state

    monkeypatch.setattr(fake_state, "PROGRESS_AFTER", 0.0)
    monkeypatch.setattr(fake_state, "PROGRESS_EVERY", 0.0)
    told = []

    def progress(ops, where, seconds):
        told.append((ops, where))
        print("progress", ops)  # the tool's own line: not counted as the cell's

    r = CellSource(ns, "x = torch.zeros(4)\nfor _ in range(2000):\n    x = x + 1\n").record(
        device_type="cpu", progress=progress
    )
    assert r.error is None, r.error
    assert told and told[0][0] >= 256 and told == sorted(told)
    assert told[-1][1] == cell_line(ns, 3)
    assert not any("printed" in n for n in r.notes)
