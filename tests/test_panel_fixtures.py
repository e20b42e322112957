"""The panel's recorded fixtures are what the kernel answers for the H200 recording."""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "fixtures"))

import make_panel_fixtures  # noqa: E402


def test_segments_fixture_is_current() -> None:
    assert make_panel_fixtures.OUT.read_text() == make_panel_fixtures.render(), (
        "run python tests/fixtures/make_panel_fixtures.py"
    )


def test_segments_fixture_holds_the_planted_fragmentation() -> None:
    data = json.loads(make_panel_fixtures.OUT.read_text())
    truth = data["truth"]
    (m,) = data["reply"]["devices"]
    biggest = m["segments"][0]
    pieces = [b for b in biggest["blocks"] if b[2] == "piece"]
    # The recording freed every other one of 16 equal 64 MiB blocks in one segment.
    assert len(pieces) == truth["pieces_64mib"] == 8
    assert {b[1] for b in pieces} == {64 << 20}
    assert m["summary"]["largest_free_block"] == truth["largest_free_block"]
