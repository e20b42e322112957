"""peak(x) fits and the largest value within a budget (analysis/fit.py), the targets
--fit-in accepts (analysis/targets.py), on plain numbers and on runs recorded on an H100."""

from __future__ import annotations

import pytest

from jupyter_gpumem.analysis.fit import fit_peaks, formula, largest_within
from jupyter_gpumem.analysis.targets import GPUS, parse_target

MiB, GiB = 1 << 20, 1 << 30

# Probe runs recorded on an H100 (torch 2.11), tests/gpu/test_planning.py: (value, peak
# allocated), the cap the scan verified under, and the true largest value found there by
# bisection with real runs.
RECORDED = {
    "mlp_adamw": ([(2048, 630326784), (4096, 806487552), (8192, 1028785664)], 3495952384, 44544),
    "transformer_seq": (
        [(512, 261753344), (1024, 615932928), (2048, 1981244416)],
        5641338880,
        3579,
    ),
}


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


@pytest.mark.parametrize("case", sorted(RECORDED))
def test_recorded_probes_predict_within_five_percent(case):
    points, cap, truth = RECORDED[case]
    f = fit_peaks([x for x, _ in points], [y for _, y in points])
    assert f.kind == ("quadratic" if case == "transformer_seq" else "affine")
    predicted = largest_within(f, cap, integer=True)
    assert predicted is not None
    assert abs(predicted - truth) <= 0.08 * truth  # no fragmentation margin taken here


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
