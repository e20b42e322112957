"""The conversion from records to protocol objects (``protocol/convert.py``): the JSON it
makes for one record of every registered type is byte-for-byte what it was when the
conversion was written out by hand (``fixtures/protocol_convert_expected.json``), and every
object validates against schema.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import pytest

from jupyter_gpumem.protocol import schema
from jupyter_gpumem.protocol.convert import to_protocol
from tests.protocol_samples import samples

EXPECTED = json.loads(
    (Path(__file__).parent / "fixtures/protocol_convert_expected.json").read_text()
)

# The schema object each sample converts to.
DEFS = {
    "measurement": "sample",
    "measurement_bare": "sample",
    "device_uninitialized": "device",
    "replay": "replay",
    "replay_undated": "replay",
    "worker": "worker",
    "cell": "cell_marker",
    "forecast": "forecast",
    "line_share": "line_share",
    "who_row": "who_row",
    "who_report": "who_report",
    "fix": "fix",
    "postmortem": "postmortem",
    "history_row": "history_cell",
    "segment_map": "segment_map",
}


@pytest.fixture(autouse=True)
def _no_torch(monkeypatch):
    # A replay's sentence names this kernel's torch when it was imported.
    monkeypatch.delitem(sys.modules, "torch", raising=False)


def test_samples_cover_every_registered_type():
    registered = {t for t in to_protocol.registry if t is not object}
    assert registered <= {type(r) for r in samples().values()}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_json_is_what_it_was(name):
    assert json.dumps(to_protocol(samples()[name])) == EXPECTED[name]


@pytest.mark.parametrize("name", sorted(DEFS))
def test_objects_validate(name):
    jsonschema.validate(to_protocol(samples()[name]), {**schema(), "$ref": f"#/$defs/{DEFS[name]}"})
