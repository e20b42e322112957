"""A cap as a person types it (core/actions.parse_limit), on the inputs the panel's own
reading (labextension/src/present/cap.ts) is tested on too: tests/fixtures/cap_inputs.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jupyter_gpumem.core.actions import CapRequest, parse_limit
from jupyter_gpumem.errors import ActionRefused

CASES = json.loads((Path(__file__).parent / "fixtures" / "cap_inputs.json").read_text())["cases"]


def expected(case: dict) -> CapRequest | None:
    if case.get("error"):
        return None
    if case.get("off"):
        return CapRequest(None, None)
    if "bytes" in case:
        return CapRequest(None, case["bytes"])
    return CapRequest(case["fraction"], None)


@pytest.mark.parametrize("case", CASES, ids=lambda c: repr(c["text"][:20]))
def test_parse_limit_agrees_with_the_shared_inputs(case):
    want = expected(case)
    if want is None:
        with pytest.raises(ActionRefused):
            parse_limit(case["text"])
    else:
        assert parse_limit(case["text"]) == want


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", 'type a cap such as 24 GiB or 0.3, or "off"'),
        ("12XB", "not a size: '12XB'"),
        ("1.5", "a plain number is a fraction of the device, in (0, 1]; got '1.5'"),
        ("150%", "a fraction of the device must be above 0 and at most 1 (100%)"),
        ("0", "a fraction of the device must be above 0"),
    ],
)
def test_refusals_say_what_is_accepted(text, message):
    with pytest.raises(ActionRefused) as e:
        parse_limit(text)
    assert message in str(e.value)


def test_a_long_input_is_echoed_short():
    with pytest.raises(ActionRefused) as e:
        parse_limit("1" * 100_000)
    assert len(str(e.value)) < 200
