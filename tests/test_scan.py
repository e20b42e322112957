"""The largest value that fits (scanner.py, _ipython/scan_runs.py, ``%%gpumem --scan``) on
the CPU: the scan logic against a simulated allocator whose true limit is known, the
cell's runs in a real IPython namespace, and every bad input."""

from __future__ import annotations

import re

import pytest

from jupyter_gpumem.collectors import Collector
from jupyter_gpumem.collectors.readings import Reading
from jupyter_gpumem.core.scanner import Scanner
from jupyter_gpumem.errors import ScanStopped
from jupyter_gpumem.model import AllocatorStats, DeviceSample, Limit, Target
from tests.conftest import run

MiB, GiB = 1 << 20, 1 << 30


class OutOfMemoryError(RuntimeError):
    """Named as torch's, which is what the scanner recognises."""


class SimulatedGPU:
    """A device whose step at value v needs ``max(floor, a + b·v)`` bytes above the base
    (``floor``: a part of the step, such as the optimizer step, whose peak does not grow
    with v), of which the allocator wastes ``frag(v)`` in pieces it can't reclaim: the run
    fits under a cap exactly when ``base + max(floor, a + b·v) + frag(v) <= cap``. The
    first run may leave ``keeps`` bytes behind (optimizer state)."""

    def __init__(
        self,
        a=200 * MiB,
        b=4 * MiB,
        frag=lambda v: 32 * MiB,
        keeps=0,
        floor=0,
        total=80 * GiB,
        context=500 * MiB,
        base=1 * GiB,
    ):
        self.a, self.b, self.frag, self.keeps, self.floor = a, b, frag, keeps, floor
        self.total, self.context = total, context
        self.allocated = self.reserved = base
        self.peak_allocated = self.peak_reserved = base
        self.peak_frag = 0
        self.fraction = 1.0
        self.limit_calls: list[float] = []
        self.runs = 0

    # what the "cell" does
    def step(self, v: float) -> BaseException | None:
        self.runs += 1
        need = self.allocated + self.need(v)
        frag = self.frag(v)
        cap = int(self.fraction * self.total)
        if need + frag > cap:
            self.peak_allocated = max(self.peak_allocated, cap - frag)
            return OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        self.peak_allocated = max(self.peak_allocated, need)
        self.peak_reserved = max(self.peak_reserved, need + frag + 64 * MiB)
        self.peak_frag = max(self.peak_frag, frag)
        self.reserved = max(self.reserved, need + frag + 64 * MiB)
        if self.keeps:
            self.allocated += self.keeps
            self.keeps = 0
        return None

    def need(self, v: float) -> float:
        return max(self.floor, self.a + self.b * v)

    # the Backend protocol
    def read(self, with_process: bool = True, full: bool = True) -> Reading:
        stats = AllocatorStats(
            self.allocated,
            self.reserved,
            self.allocated,
            self.allocated,
            0,
            self.peak_allocated,
            self.peak_reserved,
            0,
            0,
            0,
            0,
            1,
            1,
            self.peak_frag,
        )
        used = self.reserved + self.context
        limit = Limit(self.fraction, int(self.fraction * self.total)) if self.fraction < 1 else None
        d = DeviceSample(0, "sim", "cuda", True, stats, self.total, used, used, limit)
        return Reading("ok", "", "2.11", True, (d,))

    def initialized_devices(self) -> list[int]:
        return [0]

    def device_count(self) -> int:
        return 1

    def reset_peaks(self, devices=None) -> None:
        self.peak_allocated, self.peak_reserved, self.peak_frag = (self.allocated, self.reserved, 0)

    def attach_oom_observer(self, callback) -> bool:
        return False

    def cuda_ready(self) -> bool:
        return True

    def empty_cache(self) -> None:
        self.reserved = self.allocated

    def set_limit(self, device: int, fraction: float) -> None:
        self.fraction = fraction
        self.limit_calls.append(fraction)

    def total_for_limit(self, device: int) -> int:
        return self.total

    def replay(self) -> None:
        return None  # a simulation standing for live figures


def true_largest(gpu: SimulatedGPU, cap: int) -> int:
    v = 0
    while gpu.allocated + gpu.need(v + 1) + gpu.frag(v + 1) <= cap:
        v += 1
    return v


EIGHT_GIB = Target(8 * GiB, "8 GiB", "t", True)


def scan(gpu: SimulatedGPU, values=(8, 16, 32), target=EIGHT_GIB, verify=True):
    s = Scanner(Collector(gpu), gpu.step, lambda: None)  # type: ignore[arg-type]
    return s.scan("batch", values, target, verify, integer=True)


def test_a_step_that_fits_the_model_is_verified_at_the_prediction():
    gpu = SimulatedGPU()
    r = scan(gpu)
    assert [x.kind for x in r.runs] == ["probe", "probe", "probe", "verify"]
    assert r.fit is not None and r.fit.kind == "affine"
    assert r.outside_torch == 500 * MiB and r.cap == 8 * GiB - 500 * MiB
    assert r.margin == 32 * MiB  # reserved beyond allocated (96 MiB) capped by the pieces
    truth = true_largest(gpu, r.cap)
    assert r.predicted == truth and r.verified == truth
    assert r.answer == f"largest batch that fits in 8 GiB: {truth} (verified)"
    assert gpu.limit_calls[-1] == 1.0  # the cap is gone again


def test_a_prediction_that_runs_out_of_memory_steps_down_and_says_by_how_much():
    # fragmentation grows with the batch: the probes' margin is too small up there
    gpu = SimulatedGPU(frag=lambda v: 32 * MiB + int(v) * (MiB // 4))
    r = scan(gpu)
    truth = true_largest(gpu, r.cap)
    assert r.predicted is not None and r.predicted > truth
    assert r.verified is not None and r.verified <= truth
    assert r.verified >= 0.95 * truth
    assert 2 <= len(r.verifications) <= 3  # the prediction, then at most 2 more
    assert not r.verifications[0].ok and r.verifications[0].oom
    assert f"(verified; predicted {int(r.predicted)})" in r.answer
    assert "too high" in r.verify_note
    assert gpu.limit_calls[-1] == 1.0


# Fragmentation that grows with the value, of several shapes: the probes' margin is too
# small at the prediction, which runs out of memory, and the scan steps down.
# (shape, how close to the true largest value the answer must be: a jump that the probes
# could not see, a little below the prediction, leaves the last run a bracket of 1370 to
# 1609 around 1450, where one run more can only guess)
GROWING = {
    "linear": (lambda v: 32 * MiB + int(v * MiB), 0.95),
    "quadratic": (lambda v: 32 * MiB + int(v * v / 1000 * MiB), 0.95),
    "a jump": (lambda v: 32 * MiB + (1500 * MiB if v > 1200 else 0), 0.95),
    "a late jump": (lambda v: 32 * MiB + (800 * MiB if v > 1450 else 0), 0.94),
}


@pytest.mark.parametrize("shape", sorted(GROWING))
def test_verification_makes_three_runs_at_most_and_answers_a_value_that_ran(shape):
    frag, bound = GROWING[shape]
    gpu = SimulatedGPU(frag=frag)
    r = scan(gpu)
    truth = true_largest(gpu, r.cap)
    checks = r.verifications
    assert gpu.runs == len(r.runs) == 3 + len(checks)  # three probes, nothing unrecorded
    assert 2 <= len(checks) <= 3  # the prediction ran out of memory; at most 2 step-downs
    assert not checks[0].ok and checks[0].value == r.predicted > truth
    assert all(c.cap == r.cap for c in checks)
    # the answer is a value that ran under the cap, the largest that did
    assert r.verified == max(c.value for c in checks if c.ok)
    assert all(c.ok == (c.value <= truth) for c in checks)  # each run's fate is the truth's
    assert truth * bound <= r.verified <= truth
    assert f"(verified; predicted {int(r.predicted)})" in r.answer
    assert gpu.limit_calls[-1] == 1.0


def test_after_a_step_down_that_runs_the_last_run_aims_between_the_two():
    # fragmentation linear in the value: the run that ran and the one that failed give its
    # slope, and the third run lands on the true largest value (bisection alone: 1170,
    # 9 % short)
    gpu = SimulatedGPU(frag=GROWING["linear"][0])
    r = scan(gpu)
    truth = true_largest(gpu, r.cap)
    assert [c.ok for c in r.verifications] == [False, True, True]
    low = r.verifications[1].value
    assert low < 0.95 * truth  # the step down from the fit alone is not enough
    assert r.verified == truth


def test_when_every_verification_runs_out_of_memory_nothing_is_called_a_fit():
    # As recorded on an H100 (oom_need_after_scan): the probes run where the activations
    # make the peak; at small batches the optimizer step's peak (3 GiB above the base, flat)
    # makes it, which the fit can't see. Its prediction, and every value below it, runs out
    # of memory under the cap, and no probe stayed under it.
    gpu = SimulatedGPU(floor=3 * GiB)
    r = scan(gpu, values=(1024, 1536, 2048), target=Target(4 * GiB, "4 GiB", "t", True))
    assert true_largest(gpu, r.cap) == 0  # nothing fits
    checks = r.verifications
    assert r.predicted is not None and checks[0].value == r.predicted
    assert 1 <= len(checks) <= 3 and all(c.oom and not c.ok for c in checks)
    assert r.verified is None and r.verify_failed and r.largest is None
    low = min(c.value for c in checks)
    assert r.smallest_failed == low < r.predicted
    assert not re.search(r"fits in 4 GiB: \d|\d+ fits", r.answer)
    assert "largest batch" not in r.answer
    assert r.answer.startswith(
        f"no batch found that fits in 4 GiB: every value tried ran out of memory under the "
        f"3.51 GiB cap, down to {int(low)} (the prediction was {int(r.predicted)}); "
        "scan smaller values, e.g. --scan batch="
    )
    suggested = [int(v) for v in r.answer.rsplit("=", 1)[1].split(",")]
    assert len(suggested) == 3 and max(suggested) < low
    assert "verification found no value that fits" in r.verify_note
    assert gpu.limit_calls[-1] == 1.0


def test_smaller_values_to_scan_after_a_failure():
    from jupyter_gpumem.analysis.fit import smaller_values

    assert smaller_values(779, True) == [97, 194, 389]
    assert smaller_values(5, True) == [1, 2]
    assert smaller_values(3, True) == [1, 2]
    assert smaller_values(2, True) == [1]
    assert smaller_values(1, True) == []
    assert smaller_values(0.5, False) == [0.0625, 0.125, 0.25]


@pytest.mark.parametrize("cap", [12 * GiB, 2757 * MiB + 12345])
def test_the_scan_an_oom_suggests_has_the_cap_as_its_budget(cap):
    # A cell capped with %gpumem limit (PyTorch's cap) fails; the post-mortem suggests a
    # scan. --fit-in is a card's whole memory, from which the scan takes what this process
    # holds outside PyTorch: the scan it suggests must leave PyTorch the current cap.
    from jupyter_gpumem.analysis.scan_hint import scan_knowledge
    from jupyter_gpumem.analysis.targets import parse_target

    gpu = SimulatedGPU(context=812 * MiB)
    code = "x = torch.randn(batch, 2048, device='cuda')"
    _, hint = scan_knowledge(code, 0, {"batch": 64}, [], cap, outside=812 * MiB)
    size = re.search(r"--fit-in (\S+)`", hint).group(1)
    assert "the current cap of" in hint and "plus the 812.00 MiB held outside it" in hint
    r = scan(gpu, target=parse_target(size))
    assert r.outside_torch == 812 * MiB
    assert cap - MiB < r.cap <= cap  # the same cap, rounded down to whole MiB


def test_a_first_run_that_keeps_state_is_measured_again():
    gpu = SimulatedGPU(keeps=300 * MiB)  # the optimizer's state, made by the first step
    r = scan(gpu)
    kinds = [x.kind for x in r.runs]
    assert kinds[:4] == ["probe", "probe", "probe", "repeat"]
    assert len(r.probes) == 4
    # the fit uses the repeated run: all its points share the state as their base
    assert r.fit is not None and max(abs(e) for e in r.fit.residuals) < MiB
    assert r.verified == true_largest(gpu, r.cap)


def test_no_verify_predicts_only():
    gpu = SimulatedGPU()
    r = scan(gpu, verify=False)
    assert not r.verifications and r.verified is None
    assert "(predicted; not verified (--no-verify))" in r.answer
    assert gpu.limit_calls == []


def test_a_target_larger_than_what_this_gpu_has_is_predicted_not_verified():
    gpu = SimulatedGPU(total=16 * GiB)
    r = scan(gpu, target=Target(80 * GiB, "A100 80GB", "t", True))
    assert r.verified is None and "not verified: this GPU has" in r.verify_note
    assert gpu.limit_calls == []


def test_by_default_the_target_is_what_this_gpu_has_free_now():
    gpu = SimulatedGPU(total=16 * GiB)
    r = scan(gpu, target=None)
    assert not r.target.whole_card and "has free now" in r.target.label
    assert r.cap == 16 * GiB - 500 * MiB  # free memory plus PyTorch's own cache
    assert r.verified == true_largest(gpu, r.cap)


def test_a_probe_that_runs_out_of_memory_stops_the_scan():
    gpu = SimulatedGPU(total=2 * GiB)
    with pytest.raises(ScanStopped, match="does not fit on this GPU even without a cap"):
        scan(gpu, values=(8, 16, 512))


def test_a_probe_that_fails_otherwise_stops_the_scan_with_its_error():
    gpu = SimulatedGPU()
    boom = ValueError("shape mismatch")
    s = Scanner(Collector(gpu), lambda v: boom if v == 16 else gpu.step(v), lambda: None)  # type: ignore[arg-type]
    with pytest.raises(ScanStopped) as e:
        s.scan("batch", (8, 16, 32), None, True, True)
    assert e.value.error is boom
    assert [r.value for r in e.value.runs] == [8, 16]


def test_a_flat_peak_is_called_out():
    gpu = SimulatedGPU(a=2 * GiB, b=1024)  # the optimizer step makes the peak
    r = scan(gpu)
    assert any("grows little" in n for n in r.notes)


# -- the cell's runs in a real IPython namespace -------------------------------------------
def test_runs_bind_the_name_and_leave_the_namespace_as_it_was(shell):
    from jupyter_gpumem._ipython.scan_runs import CellRuns

    shell.user_ns.update({"kept": [1], "rebound": "old", "gone": 3})
    shell.user_ns.pop("batch", None)
    runs = CellRuns(shell, "batch", "new = batch * 2\nrebound = batch\ndel gone\n", True)
    assert runs.run(16) is None
    assert shell.user_ns["new"] == 32 and shell.user_ns["rebound"] == 16
    runs.cleanup()
    assert "new" not in shell.user_ns and shell.user_ns["rebound"] == "old"
    assert shell.user_ns["gone"] == 3 and "batch" not in shell.user_ns
    runs.run(8)
    runs.finish()
    assert "batch" not in shell.user_ns and "new" not in shell.user_ns
    assert shell.user_ns["kept"] == [1] and shell.user_ns["gone"] == 3


def test_an_error_in_a_run_names_the_cells_own_line(shell):
    from jupyter_gpumem._ipython.scan_runs import CellRuns

    runs = CellRuns(shell, "batch", "a = 1\nraise ValueError(batch)\n", True)
    e = runs.run(4)
    assert isinstance(e, ValueError) and e.args == (4,)
    tb = e.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert tb.tb_lineno == 3  # line 1 of the cell is the magic's
    count = shell.compile._filename_map[tb.tb_frame.f_code.co_filename]
    assert count == shell.execution_count
    runs.finish()


# -- bad input: a UsageError, and the cell does not run -------------------------------------
@pytest.mark.parametrize(
    "args,message",
    [
        ("--scan batch=", "no values"),
        ("--scan batch=16", "two different values"),
        ("--scan batch=16,16", "two different values"),
        ("--scan batch=16,a", "'a' is not a number"),
        ("--scan batch=16,nan", "not a finite number"),
        ("--scan batch=16,-2", "must be positive"),
        ("--scan 1batch=16,32", "not a Python variable name"),
        ("--scan for=16,32", "Python keyword"),
        ("--scan batch", "needs NAME=V1,V2,V3"),
        ("--scan batch=1,2,3,4,5,6,7,8,9", "at most 8 values"),
        ("--scan batch=16,32 --fit-in X100", "neither a size"),
        ("--scan batch=16,32 --fit-in 12parsec", "not a size"),
        ("--scan batch=16,32 --fit-in " + "9" * 400 + "GiB", "size too large"),
        ("--scan batch=16,32 --fit-in 24", "a number without a unit is bytes"),
        ("--fit-in T4", "goes with --scan"),
        ("--no-verify", "with --scan"),
        ("--scan batch=16,32 --breakdown", "--breakdown measures one run"),
        ("--scan batch=16,32 --trace", "--trace measures one run"),
    ],
)
def test_bad_scan_arguments_are_usage_errors_and_the_cell_does_not_run(ip, args, message):
    ip.user_ns.pop("ran", None)
    res, _, cap = run(ip, f"%%gpumem {args}\nran = True\n")
    assert type(res.error_in_exec).__name__ == "UsageError" or "UsageError" in cap.stderr
    assert message in str(res.error_in_exec) + cap.stderr
    assert "ran" not in ip.user_ns
    assert len(str(res.error_in_exec) + cap.stderr) < 600  # the bad value is not echoed whole


@pytest.fixture
def simulated(ip, monkeypatch):
    """The session's GPU simulated (CUDA started, 500 MiB outside PyTorch): the magic's
    scan runs on the CPU; the cell calls ``gpu.step(batch)``."""
    from jupyter_gpumem._ipython import load, scan_cell, unload

    gpu = SimulatedGPU()
    monkeypatch.setattr(scan_cell, "_no_gpu_for_scan", lambda: None)
    unload(ip)  # the session composed again, over the simulated GPU
    load(ip, Collector(gpu))  # type: ignore[arg-type]
    ip.user_ns["gpu"] = gpu
    yield gpu
    ip.user_ns.pop("gpu", None)


def test_a_target_within_what_the_process_holds_outside_pytorch_is_refused(ip, simulated):
    ip.user_ns.pop("ran", None)
    res, _, cap = run(ip, "%%gpumem --scan batch=8,16,32 --fit-in 500MiB\nran = gpu.step(batch)\n")
    said = str(res.error_in_exec) + cap.stderr
    assert type(res.error_in_exec).__name__ == "UsageError" or "UsageError" in cap.stderr
    assert (
        "--fit-in 500.00 MiB is no more than the 500.00 MiB this process already holds on "
        "cuda:0 outside PyTorch" in said
    )
    assert "e.g. 24GiB, 24GB or a card name" in said
    assert "ran" not in ip.user_ns and simulated.runs == 0  # the cell did not run
    # a little more leaves PyTorch something: the scan runs, through the magic
    res, _, _ = run(
        ip, "%%gpumem --scan batch=8,16,32 --fit-in 8GiB -o res\nran = gpu.step(batch)\n"
    )
    assert res.error_in_exec is None and simulated.runs >= 4
    assert ip.user_ns["res"].verified == true_largest(simulated, 8 * GiB - 500 * MiB)
    assert "ran" not in ip.user_ns and "batch" not in ip.user_ns
    ip.user_ns.pop("res", None)


def test_scan_function_refuses_a_target_within_what_the_process_holds(ip, simulated, monkeypatch):
    import jupyter_gpumem

    ip.run_cell("import torch")
    # scan() wants a CUDA build of torch first; the simulated GPU is the one it measures
    monkeypatch.setattr(ip.user_ns["torch"].version, "cuda", "12.8")
    with pytest.raises(ValueError, match=r"no more than the 500\.00 MiB this process"):
        jupyter_gpumem.scan(simulated.step, [8, 16], fit_in="400MiB")
    assert simulated.runs == 0
    r = jupyter_gpumem.scan(simulated.step, [8, 16, 32], fit_in="8GiB", name="batch")
    assert r.verified == true_largest(simulated, 8 * GiB - 500 * MiB)


def test_without_a_gpu_the_scan_says_so_in_one_line(ip):
    ip.user_ns.pop("ran", None)
    ip.run_cell("import torch")
    res, _, cap = run(ip, "%%gpumem --scan batch=16,32\nran = True\n")
    lines = cap.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("UsageError: --scan needs torch and a CUDA GPU")
    assert lines[0].endswith("; the cell did not run") and cap.stdout == ""
    assert type(res.error_in_exec).__name__ == "UsageError"  # the cell failed: nothing checked
    assert "ran" not in ip.user_ns


def test_without_a_gpu_the_breakdown_says_so_in_one_line(ip):
    ip.run_cell("import torch")
    _, texts, _ = run(ip, "%%gpumem --breakdown\nran = torch.ones(3)\n")
    notes = [line for line in texts[0].splitlines() if "breakdown" in line]
    assert notes == [
        (
            "  breakdown: --breakdown needs torch and a CUDA GPU: torch "
            f"{ip.user_ns['torch'].__version__} is a CPU-only build"
        )
    ]
    assert ip.user_ns["ran"].shape == (3,)  # the cell ran as usual


# -- the functions ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "values,fit_in,message",
    [
        ([16], None, "two different values"),
        ([16, "a"], None, "is not a number"),
        ([16, -1], None, "positive, finite"),
        ([16, 32], "X100", "neither a size"),
    ],
)
def test_scan_function_bad_input(values, fit_in, message):
    import jupyter_gpumem

    with pytest.raises(ValueError, match=message):
        jupyter_gpumem.scan(lambda v: None, values, fit_in=fit_in)


def test_scan_function_without_a_gpu_says_so(ip):
    import jupyter_gpumem

    ip.run_cell("import torch")
    refused = r"^scan\(\) needs torch and a CUDA GPU: torch \S+ is a CPU-only build$"
    with pytest.raises(jupyter_gpumem.NoGpuError, match=refused):
        jupyter_gpumem.scan(lambda v: None, [1, 2])


def test_breakdown_function_before_any_breakdown(ip):
    import jupyter_gpumem

    # where no breakdown can be made, it says why (a CPU-only torch here, or none)
    with pytest.raises(jupyter_gpumem.NoGpuError, match=r"^breakdown\(\) needs "):
        jupyter_gpumem.breakdown()


@pytest.mark.parametrize(
    "fit_in,message",
    [
        # a number without a unit is bytes, as "--fit-in 5" is: no card has 5 bytes
        (
            5,
            (
                "fit_in: 5 is 5 B (a number without a unit is bytes); a target is a card's "
                "memory, at least 1 MiB: give a unit or a card, e.g. 24GiB, 24GB or T4"
            ),
        ),
        (
            24.5,
            (
                "fit_in: 24.5 is a float: give a size such as '24GiB', a card such as 'T4', "
                "or a whole number of bytes"
            ),
        ),
        (
            True,
            (
                "fit_in: True is a bool: give a size such as '24GiB', a card such as 'T4', "
                "or a whole number of bytes"
            ),
        ),
    ],
)
def test_scan_function_fit_in_not_a_string_says_what_to_pass(fit_in, message):
    import jupyter_gpumem

    with pytest.raises(ValueError) as e:
        jupyter_gpumem.scan(lambda v: None, [16, 32], fit_in=fit_in)
    assert str(e.value) == message


def test_fit_in_a_whole_number_is_bytes():
    from jupyter_gpumem.analysis.targets import parse_target

    t = parse_target(24 * GiB, "fit_in")
    assert (t.bytes, t.label, t.source, t.whole_card) == (
        24 * GiB,
        "24.00 GiB",
        "--fit-in 25769803776",
        True,
    )
    assert parse_target(" 24GiB ", "fit_in").source == "--fit-in 24GiB"  # as before
