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
from jupyter_gpumem.protocol.convert import WIRES, to_protocol
from jupyter_gpumem.protocol.wire import Wire, keys, record_fields
from tests.protocol_samples import samples

EXPECTED = json.loads(
    (Path(__file__).parent / "fixtures/protocol_convert_expected.json").read_text()
)

# The schema object each sample converts to.
DEFS = {
    "measurement": "sample",
    "measurement_bare": "sample",
    "device_uninitialized": "device",
    "limit": "limit",
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
    "process_memory": "postmortem/properties/other_processes/items",
    "history_row": "history_cell",
    "segment_map": "segment_map",
    "free_report": "free_report",
    "free_let_go": "free_let_go",
    "free_holder": "free_holder",
    "free_device": "free_device",
    "breakdown": "breakdown",
}


@pytest.fixture(autouse=True)
def _no_torch(monkeypatch):
    # A replay's sentence names this kernel's torch when it was imported.
    monkeypatch.delitem(sys.modules, "torch", raising=False)


def test_samples_cover_every_registered_type():
    # (the demo's player registers its recorded markers, which are recorded protocol dicts)
    registered = {
        t
        for t in to_protocol.registry
        if t is not object and not t.__module__.startswith("jupyter_gpumem.testing")
    }
    assert registered <= {type(r) for r in samples().values()}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_json_is_what_it_was(name):
    assert json.dumps(to_protocol(samples()[name])) == EXPECTED[name]


@pytest.mark.parametrize("name", sorted(DEFS))
def test_objects_validate(name):
    jsonschema.validate(to_protocol(samples()[name]), {**schema(), "$ref": f"#/$defs/{DEFS[name]}"})


# Records that no message carries alone: no schema object to check them against.
NOT_IN_SCHEMA = {"site"}
# Keys a view writes beside the record's own fields (convert.py says where).
WRITTEN_BY_VIEWS = {"segment_map.segments": {"blocks"}}


def properties(path: str) -> dict:
    """The properties of the schema object at ``path``: a ``$defs`` name, then property
    names (an array's items, a nullable object's object)."""
    defs = schema()["$defs"]
    first, *rest = path.split(".")
    node = defs[first]
    for name in rest:
        node = node["properties"][name]
        node = node.get("items", node)
    return node["properties"]


def unsent(cls: type, wire: Wire, props: dict) -> list[str]:
    """Fields of ``cls`` that the schema object lacks, under their wire names, and that
    ``wire`` does not leave out by name."""
    sent = {key: name for key, name, _ in keys(cls, wire)}
    return [f"{sent[k]} (as {k!r})" for k in sent if k not in props]


@pytest.mark.parametrize("path", sorted(set(WIRES) - NOT_IN_SCHEMA))
def test_every_field_is_in_the_schema_or_left_out_by_name(path):
    cls, wire = WIRES[path]
    props = properties(path)
    assert not unsent(cls, wire, props), (
        f"{cls.__name__} has fields {path} in schema.json lacks: add them to the schema, "
        "or to the record's omit in protocol/convert.py"
    )
    fields = set(record_fields(cls))
    for name in (*wire.omit, *wire.rename, *wire.value, *wire.when, *wire.spread):
        assert name in fields, f"{path}: {name} is no field of {cls.__name__}"
    made = {key for key, _, _ in keys(cls, wire)} | WRITTEN_BY_VIEWS.get(path, set())
    assert set(props) <= made, f"schema.json's {path} has keys nothing writes"


def test_a_forgotten_field_fails():
    from dataclasses import make_dataclass

    cls, wire = WIRES["forecast"]
    grown = make_dataclass("Grown", [("new_figure", int, 0)], bases=(cls,), frozen=True)
    assert unsent(grown, wire, properties("forecast")) == ["new_figure (as 'new_figure')"]


def test_last_cell_carries_peak_reserved_every_kept_line_and_the_breakdown():
    """The ``last_cell`` action's object (what ``jupyter-gpumem run --save`` records):
    the kept lines are all of them, not the marker's first three."""
    from dataclasses import replace

    from jupyter_gpumem.protocol.convert import last_cell
    from tests.protocol_samples import BREAKDOWN, cell

    report = replace(cell(), breakdowns=(BREAKDOWN,), breakdown_note=None)
    obj = last_cell(report, tracking=True)
    jsonschema.validate(obj, {**schema(), "$ref": "#/$defs/last_cell"})
    (d,) = obj["devices"]
    assert (d["index"], d["peak_reserved"], d["peak_exact"]) == (0, 6 << 30, True)
    assert len(d["kept_lines"]) == len(report.attribution[0].lines) == 4
    assert len(to_protocol(report)["devices"][0]["kept_at"]) == 3  # the marker's
    assert d["breakdown"] == to_protocol(BREAKDOWN)
    bare = replace(cell(), attribution=(), breakdowns=(), breakdown_note="no GPU")
    assert last_cell(bare, tracking=True)["devices"][0]["kept_lines"] == []  # kept nothing
    bare = last_cell(bare, tracking=False)
    jsonschema.validate(bare, {**schema(), "$ref": "#/$defs/last_cell"})
    assert bare["devices"][0]["kept_lines"] is None and bare["devices"][0]["breakdown"] is None
    assert bare["breakdown_note"] == "no GPU"
