"""Budget expressions of `jupyter-gpumem run`: parsing, tags, and checking (no kernel)."""

from __future__ import annotations

import pytest

from jupyter_gpumem.run.budgets import (
    FORM,
    BudgetError,
    check,
    effective,
    parse_budget,
    tag_budgets,
)

GiB = 1 << 30


@pytest.mark.parametrize(
    ("text", "metric", "op", "limit", "normal"),
    [
        ("peak<=20GiB", "peak", "<=", 20 * GiB, "peak<=20GiB"),
        (" peak <= 20 GiB ", "peak", "<=", 20 * GiB, "peak<=20GiB"),
        ("PEAK<24GB", "peak", "<", 24 * 10**9, "peak<24GB"),
        ("kept<=1GiB", "kept", "<=", GiB, "kept<=1GiB"),
        ("kept<=0", "kept", "<=", 0, "kept<=0"),
        ("kept<=0B", "kept", "<=", 0, "kept<=0B"),
        ("reserved<=1.5GiB", "reserved", "<=", int(1.5 * GiB), "reserved<=1.5GiB"),
        ("allocated<512MiB", "allocated", "<", 512 << 20, "allocated<512MiB"),
        ("peak<=1000", "peak", "<=", 1000, "peak<=1000"),
    ],
)
def test_parse(text, metric, op, limit, normal):
    b = parse_budget(text)
    assert (b.metric, b.op, b.limit, b.text, b.scope) == (metric, op, limit, normal, "global")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "peak",
        "peak<=",
        "peak=4GiB",
        "peak>=4GiB",
        "peak<==4GiB",
        "peek<=4GiB",
        "peak<=4XB",
        "peak<=-1GiB",
        "peak<=0XB",
        "<=4GiB",
        "peak<=4GiB extra",
    ],
)
def test_bad_expressions_show_the_accepted_form(text):
    with pytest.raises(BudgetError) as e:
        parse_budget(text)
    assert FORM in str(e.value)
    assert "peak<=20GiB" in str(e.value)


def test_tags():
    tags = ["slow", "gpumem: peak<=4GiB", "gpumem:kept<=0; reserved<=8GiB", "raises-exception"]
    got = tag_budgets(tags)
    assert [(b.text, b.scope) for b in got] == [
        ("peak<=4GiB", "cell"),
        ("kept<=0", "cell"),
        ("reserved<=8GiB", "cell"),
    ]
    assert tag_budgets(["gpumem-nope", 3, None]) == []
    with pytest.raises(BudgetError, match="unknown metric 'peek'"):
        tag_budgets(["gpumem: peek<=4GiB"])
    with pytest.raises(BudgetError, match="empty budget tag"):
        tag_budgets(["gpumem:"])


def test_a_cell_budget_replaces_the_global_one_of_its_metric():
    glob = [parse_budget("peak<=20GiB"), parse_budget("kept<=1GiB")]
    own = tag_budgets(["gpumem: peak<=40GiB"])
    got = effective(glob, own)
    assert [(b.text, b.scope) for b in got] == [("peak<=40GiB", "cell"), ("kept<=1GiB", "global")]
    assert effective(glob, []) == glob


def test_check_per_device_and_boundaries():
    devices = [
        {
            "index": 0,
            "peak_allocated": 4 * GiB,
            "allocated_delta": 0,
            "allocated": 1,
            "reserved": 2,
        },
        {
            "index": 1,
            "peak_allocated": 5 * GiB,
            "allocated_delta": -GiB,
            "allocated": None,
            "reserved": None,
        },
    ]
    le, lt = parse_budget("peak<=4GiB"), parse_budget("peak<4GiB")
    r = check([le, lt, parse_budget("kept<=0"), parse_budget("allocated<=1B")], devices)
    assert [(x.budget.text, x.device, x.ok) for x in r] == [
        ("peak<=4GiB", 0, True),  # equal holds for <=
        ("peak<=4GiB", 1, False),
        ("peak<4GiB", 0, False),  # equal fails for <
        ("peak<4GiB", 1, False),
        ("kept<=0", 0, True),
        ("kept<=0", 1, True),  # freeing memory holds
        ("allocated<=1B", 0, True),  # device 1 has no figure: skipped
    ]
    assert r[1].describe() == ("peak 5.00 GiB (5368709120 B) > 4.00 GiB (4294967296 B) on cuda:1")
    assert r[2].describe().startswith("peak 4.00 GiB (4294967296 B) >= 4.00 GiB")
    unchecked = check([le], [])
    assert [(x.device, x.value, x.ok) for x in unchecked] == [(None, None, None)]
    assert "not checked" in unchecked[0].describe()
    kept = check([parse_budget("kept<=1MiB")], [{"index": 0, "allocated_delta": 3 << 20}])
    assert kept[0].describe() == "kept +3.00 MiB (3145728 B) > 1.00 MiB (1048576 B) on cuda:0"
    assert kept[0].to_dict() == {
        "expression": "kept<=1MiB",
        "scope": "global",
        "metric": "kept",
        "op": "<=",
        "limit": 1 << 20,
        "device": 0,
        "value": 3 << 20,
        "ok": False,
    }


@pytest.mark.parametrize(
    "text",
    [
        "x" * 10_000,  # not a budget
        "p" * 10_000 + "<=4GiB",  # an unknown metric
        "peak<==" + "4" * 10_000,  # not a budget
        "peak<=4" + "X" * 10_000,  # a bad size
        "peak<=" + "9" * 10_000 + "GiB",  # a size too large
        "peak<=0" + "X" * 10_000,  # a zero with a bad unit
    ],
)
def test_a_long_argument_is_echoed_short(text):
    """An error repeats at most 60 characters of what it was given, with an ellipsis."""
    with pytest.raises(BudgetError) as e:
        parse_budget(text)
    message = str(e.value)
    assert FORM in message
    assert len(message) < len(FORM) + 250, message
    assert "…" in message


def test_a_long_tag_is_echoed_short():
    with pytest.raises(BudgetError) as e:
        tag_budgets(["gpumem: " + ";" * 10_000])
    assert len(str(e.value)) < len(FORM) + 150 and "…" in str(e.value)
    with pytest.raises(BudgetError) as e:
        tag_budgets("t" * 10_000)
    assert len(str(e.value)) < 200 and "…" in str(e.value)
