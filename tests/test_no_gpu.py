"""Without a GPU every entry point answers plainly: the public functions raise the
package's public errors with one sentence that says what is missing (or give a documented
empty result), and ``%gpumem history --plot`` says why there is no plot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import jupyter_gpumem
from jupyter_gpumem import GpuMemError, NoGpuError, NotLoadedError
from jupyter_gpumem._ipython import current
from tests.conftest import run
from tests.fakes import ScriptedBackend, scenario


def test_the_public_errors_are_exported():
    for error in (GpuMemError, NoGpuError, NotLoadedError):
        assert error.__name__ in jupyter_gpumem.__all__
        assert issubclass(error, RuntimeError)
    assert issubclass(NoGpuError, GpuMemError) and issubclass(NotLoadedError, GpuMemError)


@pytest.mark.parametrize("call", ["history", "who", "breakdown"])
def test_functions_of_the_session_say_the_extension_is_not_loaded(call):
    assert current() is None
    with pytest.raises(NotLoadedError) as e:
        getattr(jupyter_gpumem, call)()
    assert str(e.value) == (
        f"{call}() needs the gpumem extension, which is not loaded in this kernel: "
        "run %load_ext jupyter_gpumem"
    )


def test_report_worker_outside_a_worker_does_nothing(monkeypatch):
    monkeypatch.delenv("JUPYTER_GPUMEM_WORKERS", raising=False)
    assert jupyter_gpumem.report_worker() is False


# -- a CPU-only build of torch (this test environment's) ----------------------------------
@pytest.fixture
def cpu_torch(ip):
    torch = pytest.importorskip("torch")
    if torch.version.cuda or torch.version.hip:
        pytest.skip("this torch has a GPU allocator")
    from jupyter_gpumem.collectors.allocator import TorchBackend

    current().collector.backend = TorchBackend()
    return torch.__version__


@pytest.mark.parametrize(
    ("call", "args"),
    [("who", ()), ("breakdown", ()), ("scan", (lambda v: None, [1, 2]))],
)
def test_functions_that_need_a_gpu_say_this_torch_is_cpu_only(cpu_torch, call, args):
    with pytest.raises(NoGpuError) as e:
        getattr(jupyter_gpumem, call)(*args)
    assert (
        str(e.value)
        == f"{call}() needs torch and a CUDA GPU: torch {cpu_torch} is a CPU-only build"
    )


def test_history_of_a_cpu_only_kernel_has_its_cells_without_figures(ip, cpu_torch):
    ip.run_cell("%%gpumem -q\nx = 1", store_history=True)
    df = jupyter_gpumem.history()
    assert list(df["first_line"]) == ["x = 1"]
    assert df["device"].isna().all() and df["allocated"].isna().all()


def test_report_to_store_in_a_cpu_only_rank_says_so(cpu_torch):
    with pytest.raises(NoGpuError) as e:
        jupyter_gpumem.report_to_store(store=object(), rank=1)
    assert str(e.value) == (
        f"report_to_store() needs torch and a CUDA GPU: torch {cpu_torch} is a CPU-only build"
    )


def test_watch_store_without_a_process_group_says_what_to_do(cpu_torch):
    with pytest.raises(GpuMemError) as e:
        jupyter_gpumem.watch_store()
    assert str(e.value).startswith(
        "watch_store(): no process group: call torch.distributed.init_process_group first"
    )


def test_report_worker_in_the_kernel_itself_is_refused(ip):
    ip.run_cell("%%gpumem -q\nx = 1")  # a measured cell opens the workers' channel
    with pytest.raises(GpuMemError, match=r"^report_worker\(\) is for the kernel's worker"):
        jupyter_gpumem.report_worker()


# -- the session's state, from its readings ------------------------------------------------
def test_who_before_cuda_starts_has_no_rows(ip):
    pytest.importorskip("pandas")
    raw = {**scenario("context_created")[0], "state": "not_initialized"}
    current().collector.backend = ScriptedBackend(raw)
    df = jupyter_gpumem.who()
    assert len(df) == 0
    assert list(df.columns) == [
        "device",
        "by",
        "key",
        "detail",
        "bytes",
        "blocks",
        "example",
        "kind",
        "site",
    ]


def test_who_turns_a_refusal_into_a_public_error(ip, monkeypatch):
    from jupyter_gpumem.errors import ActionRefused

    current().collector.backend = ScriptedBackend(scenario("keep_n_bytes")[1])

    def refuse(*args):
        raise ActionRefused("CUDA is not initialised in this kernel")

    monkeypatch.setattr(current().who, "who", refuse)
    with pytest.raises(GpuMemError) as e:
        jupyter_gpumem.who()
    assert type(e.value) is GpuMemError
    assert str(e.value) == "who(): CUDA is not initialised in this kernel"


def test_breakdown_before_any_breakdown_cell_on_a_gpu(ip):
    current().collector.backend = ScriptedBackend(scenario("keep_n_bytes")[1])
    with pytest.raises(
        GpuMemError, match=r"^no breakdown yet: run a cell with %%gpumem --breakdown$"
    ):
        jupyter_gpumem.breakdown()


# -- %gpumem history --plot ----------------------------------------------------------------
def test_history_plot_without_gpu_figures_says_why(ip, cpu_torch):
    ip.run_cell("%%gpumem -q\nx = 1", store_history=True)
    res, _, cap = run(ip, "%gpumem history --plot")
    assert res.success
    assert cap.stdout == (
        "gpumem: no plot: no measured cell has GPU figures "
        f"(torch {cpu_torch} is a CPU-only build)\n"
    )
    (shown,) = cap.outputs
    assert "x = 1" in shown.data["text/plain"]
    assert "<table" in shown.data["text/html"] and "<svg" not in shown.data["text/html"]


def test_history_plot_of_a_device_no_cell_touched_says_so(ip):
    before, after, _ = scenario("transient_spike")
    current().collector.backend = ScriptedBackend(before, after)
    ip.run_cell("%%gpumem -q\nv = 1", store_history=True)
    _, _, cap = run(ip, "%gpumem history --plot -d 3")
    assert cap.stdout == "gpumem: no plot: no measured cell has GPU figures on cuda:3\n"
    assert "<table" in cap.outputs[0].data["text/html"]
    _, _, cap = run(ip, "%gpumem history --plot")
    assert cap.stdout == "" and "<svg" in cap.outputs[0].data["text/html"]


# -- torch never imported ------------------------------------------------------------------
NO_TORCH = textwrap.dedent(
    """
    import json, sys
    import jupyter_gpumem
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    def answer(fn, *args, **kwargs):
        try:
            result = fn(*args, **kwargs)
        except Exception as e:
            return [type(e).__name__, str(e)]
        return ["returned", repr(result) if not hasattr(result, "shape") else list(result.shape)]

    out = {"before_load": answer(jupyter_gpumem.who)}
    out["worker"] = answer(jupyter_gpumem.report_worker)
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_gpumem")
    ip.run_cell("%%gpumem -q\\nx = 1", store_history=True)
    out["who"] = answer(jupyter_gpumem.who)
    out["breakdown"] = answer(jupyter_gpumem.breakdown)
    out["scan"] = answer(jupyter_gpumem.scan, lambda v: None, [1, 2])
    out["history"] = answer(jupyter_gpumem.history)
    out["report_to_store"] = answer(jupyter_gpumem.report_to_store)
    out["watch_store"] = answer(jupyter_gpumem.watch_store)
    out["report_worker_in_kernel"] = answer(jupyter_gpumem.report_worker)
    with capture_output() as cap:
        ip.run_cell("%gpumem history --plot")
    out["plot"] = cap.stdout
    out["torch_imported"] = "torch" in sys.modules
    print(json.dumps(out))
    """
)


def test_without_torch_every_function_answers_in_one_sentence():
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER_GPUMEM_")}
    done = subprocess.run(
        [sys.executable, "-c", NO_TORCH], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    needs = "needs torch and a CUDA GPU: torch is not imported in this"
    assert out.pop("torch_imported") is False  # no answer imported it
    kind, shape = out.pop("history")
    assert kind == "returned" and shape[0] == 1  # the measured cell, without figures
    assert out == {
        "before_load": [
            "NotLoadedError",
            (
                "who() needs the gpumem extension, which is not loaded in this kernel: "
                "run %load_ext jupyter_gpumem"
            ),
        ],
        "worker": ["returned", "False"],
        "who": ["NoGpuError", f"who() {needs} kernel"],
        "breakdown": ["NoGpuError", f"breakdown() {needs} kernel"],
        "scan": ["NoGpuError", f"scan() {needs} kernel"],
        "report_to_store": ["NoGpuError", f"report_to_store() {needs} process"],
        "watch_store": [
            "GpuMemError",
            (
                "watch_store(): no process group: call torch.distributed.init_process_group "
                "first, or pass the job's store (store=...)"
            ),
        ],
        "report_worker_in_kernel": [
            "GpuMemError",
            (
                "report_worker() is for the kernel's worker processes: this is the kernel, whose "
                "own GPU memory measured cells show already"
            ),
        ],
        "plot": "gpumem: no plot: no measured cell has GPU figures "
        "(torch is not imported in this kernel)\n",
    }
