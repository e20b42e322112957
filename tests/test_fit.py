"""peak(x) fits and the largest value within a budget (analysis/fit.py), the targets
--fit-in accepts (analysis/targets.py), on plain numbers and on runs recorded on an H100."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jupyter_gpumem.analysis.fit import fit_peaks, formula, largest_within
from jupyter_gpumem.analysis.scan_predict import fit_probes, predict
from jupyter_gpumem.analysis.targets import GPUS, parse_target
from jupyter_gpumem.model import ScanRun
from tests.gpu.planning_cases import CASES

MiB, GiB = 1 << 20, 1 << 30

# The scans of the four accuracy cases, recorded on an H100 (torch 2.11) by
# tests/gpu/test_planning.py::test_scan_finds_the_largest_value: every run (probes, the
# repeat, verifications), the cap, and the true largest value found there by bisection
# with real runs under the same cap. From benchmarks/results/h100-planning-tests.jsonl.
RECORDED = json.loads((Path(__file__).parent / "fixtures" / "h100_scans.json").read_text())


def test_affine_peaks_fit_exactly():
    xs = [16, 32, 64]
    ys = [int(500 * MiB + 3 * MiB * x) for x in xs]
    f = fit_peaks(xs, ys)
    assert f.kind == "affine"
    assert f.a == pytest.approx(500 * MiB) and f.b == pytest.approx(3 * MiB)
    assert max(abs(r) for r in f.residuals) < 1


def test_small_wobble_stays_affine_and_curvature_goes_quadratic():
    xs = [512, 1024, 2048]
    wobble = [int(1 * GiB + 100 * x + d) for x, d in zip(xs, (0, 300_000, 0), strict=True)]
    assert fit_peaks(xs, wobble).kind == "affine"  # under 1 MiB off: allocator rounding
    attention = [int(200 * MiB + 2000 * x + 64 * x * x) for x in xs]
    f = fit_peaks(xs, attention)
    assert f.kind == "quadratic"
    assert f.c == pytest.approx(64, rel=1e-6)


def test_largest_within_a_budget():
    f = fit_peaks([10, 20], [1000 + 10 * 10, 1000 + 10 * 20])  # 1000 + 10 x
    assert largest_within(f, 1555, integer=True) == 55
    assert largest_within(f, 1000 + 10 * 55, integer=True) == 55  # exactly at the budget
    assert largest_within(f, 999, integer=True) is None  # not even 0 fits
    assert largest_within(f, 1555, integer=False) == pytest.approx(55.5)
    flat = fit_peaks([10, 20], [1000, 1000])
    assert largest_within(flat, 5000, integer=True) is None  # no largest: it never grows


def test_bad_inputs_to_the_fit():
    with pytest.raises(ValueError, match="two different values"):
        fit_peaks([8, 8], [1, 2])
    with pytest.raises(ValueError):
        fit_peaks([8, 16], [1])


def test_formula_in_the_users_units():
    f = fit_peaks([1, 2], [GiB + 36 * MiB, GiB + 72 * MiB])
    assert formula(f, "batch") == "peak(batch) = 1.00 GiB + 36.00 MiB × batch"


def recorded_runs(case: str) -> list[ScanRun]:
    rec = RECORDED["cases"][case]
    runs = []
    for row in rec["runs"]:
        r = dict(zip(RECORDED["columns"], row, strict=True))
        runs.append(
            ScanRun(
                value=r["value"],
                kind=r["kind"],
                ok=r["ok"],
                error=None if r["ok"] else "OutOfMemoryError: CUDA out of memory",
                oom=r["oom"],
                base=r["base"],
                peak_allocated=r["peak_allocated"],
                peak_reserved=r["peak_reserved"],
                kept=r["kept"],
                cap=r["cap"],
                wall_time=0.0,
                fragmentation=r["fragmentation"],
            )
        )
    return runs


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_recorded_probes_predict_within_five_percent(case):
    # all four cases of the issue: MLP + AdamW, CNN + BatchNorm, TransformerEncoder over
    # seq_len (quadratic), inference under no_grad
    assert {c.name for c in CASES} == set(RECORDED["cases"])
    rec = RECORDED["cases"][case.name]
    runs = recorded_runs(case.name)
    target = parse_target(case.fit_in)
    cap = target.bytes - rec["outside"]
    assert cap == rec["cap"]  # the recording's cap: the target less the context measured
    probes = fit_probes(runs)
    assert [p.value for p in probes] == sorted(case.probes)
    assert len([r for r in runs if r.kind != "verify"]) <= 4
    r = predict(case.var, 0, probes, runs, target, cap, rec["outside"], integer=True)
    assert r.fit is not None and r.fit.kind == rec["fit"]
    assert (r.fit.kind == "quadratic") == case.quadratic
    assert r.margin == rec["margin"]
    # the scanner's prediction from these runs is the one the GPU run made
    assert r.predicted == rec["predicted"]
    truth = rec["true"]
    assert abs(r.predicted - truth) <= 0.05 * truth  # the bound, either way
    # the verified value ran under the cap, at most 5 % below the true value
    checks = [x for x in runs if x.kind == "verify"]
    assert 1 <= len(checks) <= 3
    assert any(x.ok and x.value == rec["verified"] for x in checks)
    assert 0.95 * truth <= rec["verified"] <= truth


# -- targets -----------------------------------------------------------------------------
def test_gpu_names_and_sizes():
    t4 = parse_target("T4")
    assert t4.bytes == 15360 * MiB and t4.whole_card and "15360 MiB" in t4.label
    assert parse_target("a100").bytes == GPUS["a100-80gb"][0] * MiB
    assert parse_target("NVIDIA L4").bytes == 23034 * MiB
    assert parse_target("RTX 4090").bytes == 24564 * MiB
    assert parse_target("24GiB").bytes == 24 * GiB
    assert parse_target("24GB").bytes == 24 * 10**9
    assert parse_target("1MiB").bytes == MiB  # the smallest taken
    assert parse_target("25769803776").bytes == 24 * GiB  # bytes, when they are a card's


@pytest.mark.parametrize(
    "text,message",
    [
        ("X100", "neither a size"),
        ("24 parsecs", "not a size"),
        ("9" * 400 + "GiB", "size too large"),
        ("0GiB", "at least one byte"),
        # a bare number is bytes to parse_size (as %gpumem limit takes it); no card is 24 B
        ("24", r"'24' is 24 B \(a number without a unit is bytes\).*e\.g\. 24GiB, 24GB or T4"),
        ("1048575B", "at least 1 MiB"),
    ],
)
def test_bad_targets_say_what_is_accepted(text, message):
    with pytest.raises(ValueError, match=message) as e:
        parse_target(text)
    assert len(str(e.value)) < 300  # the bad value is not echoed whole
