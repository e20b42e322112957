"""``docs/protocol.md`` documents the protocol that ``schema.json`` defines.

The schema is the source; the document explains it. Each action's row starts with the
arguments as the schema spells them (names, types, optional or required, bounds,
defaults), every field and every closed value of every message type is named, the error
codes are listed and the revision in the title is the kernel's. The handler's defaults
are the schema's.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpumem import protocol
from jupyter_gpumem.protocol import PROTOCOL_REVISION, PROTOCOL_VERSION, schema
from jupyter_gpumem.protocol.handler import ACTIONS as HANDLERS

S = schema()
DOC = (Path(__file__).parent.parent / "docs" / "protocol.md").read_text()
TYPE_NAMES = {"int": "integer"}
SHORT = {"integer": "int", "boolean": "bool", "string": "str", "number": "number"}


def _bounds(spec: dict[str, Any]) -> str:
    if spec.get("type") == "array":
        count = f"{spec.get('minItems', 0)}..{spec.get('maxItems', '')} items"
        each = _bounds(spec["items"])
        return f"{count}, each {each}" if each else count
    low = ""
    if "minimum" in spec:
        low = str(spec["minimum"])
    elif "exclusiveMinimum" in spec:
        low = f">{spec['exclusiveMinimum']}"
    if "minLength" in spec:
        return f"{spec['minLength']}..{spec.get('maxLength', '')} chars"
    if "maximum" in spec:
        return f"{low}..{spec['maximum']}"
    return f">={low}" if low and not low.startswith(">") else low


def signature(action: str) -> str:
    """An action's arguments as docs/protocol.md writes them, from the schema."""
    spec = S["actions"][action]
    required = set(spec.get("required", ()))
    parts = []
    for name, p in spec.get("properties", {}).items():
        kind = f"[{SHORT[p['items']['type']]}]" if p["type"] == "array" else SHORT[p["type"]]
        text = f'"{name}": {kind}' + ("" if name in required else "?")
        notes = [n for n in (_bounds(p),) if n]
        if "default" in p:
            notes.append(f"default {str(p['default']).lower()}")
        if notes:
            text += f" ({', '.join(notes)})"
        parts.append(text)
    return "`{" + ", ".join(parts) + "}`"


def rows() -> dict[str, str]:
    """Action -> its args cell in the table of requests."""
    out = {}
    for m in re.finditer(r"^\| `(\w+)` \| (.*?) \| ", DOC, re.MULTILINE):
        out[m.group(1)] = m.group(2)
    return out


def test_the_title_names_the_version_and_revision():
    first = DOC.splitlines()[0]
    assert f"version {PROTOCOL_VERSION}, revision {PROTOCOL_REVISION})" in first
    assert S["protocol_revision"] == PROTOCOL_REVISION


def test_the_revision_is_written_once():
    """schema.json holds the revision; the kernel reads it from there, its text names none."""
    assert not re.search(r"revision \d", S["description"])
    source = Path(protocol.__file__).read_text()
    assert "PROTOCOL_REVISION =" not in source
    assert protocol.PROTOCOL_REVISION == S["protocol_revision"]


def test_every_action_has_a_row_and_only_those():
    assert list(rows()) == list(S["actions"])


@pytest.mark.parametrize("action", list(S["actions"]))
def test_each_row_spells_the_arguments_as_the_schema_does(action):
    cell = rows()[action]
    assert cell.startswith(signature(action)), (cell, signature(action))


@pytest.mark.parametrize("action", list(S["actions"]))
def test_handler_defaults_are_the_schemas(action):
    props = S["actions"][action].get("properties", {})
    params = inspect.signature(HANDLERS[action]).parameters
    for name, p in props.items():
        default = params[name].default
        if "default" in p:
            assert default == p["default"], name
        elif name not in S["actions"][action].get("required", ()):
            assert default in (None, ""), (name, default)  # absent: "not given"


def _objects(node: Any) -> list[dict[str, Any]]:
    """Every object schema under ``node`` (properties, items, refs not followed)."""
    found = []
    if isinstance(node, dict):
        if "properties" in node:
            found.append(node)
        for v in node.values():
            found += _objects(v)
    elif isinstance(node, list):
        for v in node:
            found += _objects(v)
    return found


DOCUMENTED = [k for k in S["$defs"] if k not in ("request", "reply", "results", "error")]


@pytest.mark.parametrize("name", DOCUMENTED)
def test_every_field_and_closed_value_is_named(name):
    missing = []
    for obj in _objects(S["$defs"][name]):
        for field, spec in obj["properties"].items():
            if f'"{field}"' not in DOC and f"`{field}`" not in DOC:
                missing.append(field)
            for value in spec.get("enum", ()):
                if isinstance(value, str) and f'"{value}"' not in DOC:
                    missing.append(f"{field}={value}")
    assert not missing, f"docs/protocol.md does not name {missing} of {name}"


def test_every_error_code_is_listed():
    codes = S["$defs"]["error"]["properties"]["code"]["enum"]
    section = DOC[DOC.index("## Reply content") : DOC.index("## Comm messages")]
    for code in codes:
        assert f'"{code}"' in section, code


def test_every_comm_message_type_is_listed():
    section = DOC[DOC.index("## Comm messages") : DOC.index("## Types")]
    for obj in S["$defs"]["comm_message"]["oneOf"]:
        kind = obj["properties"]["type"]["const"]
        assert f'"type": "{kind}"' in section, kind
