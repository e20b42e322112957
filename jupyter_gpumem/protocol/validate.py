"""Requests checked against schema.json: the subset of JSON Schema the schema uses,
interpreted from the schema itself, so that the two cannot drift.

Why not a library: on the project's CI-like machine (2 cores, Python 3.11), importing
``jsonschema`` took 1.17 to 1.30 s, and ``fastjsonschema`` 8 to 12 ms to import plus 29 to
42 ms to compile this schema: both above the 20 ms the kernel may spend before its first
reply. This validator reads the schema in 0.3 to 0.5 ms on the first request and checks a
request in about 20 microseconds. ``tests/test_protocol_conformance.py`` checks that it and
``jsonschema`` agree on every request of a generated corpus.

Keywords: ``type`` (one or a list), ``const``, ``enum``, ``properties``, ``required``,
``additionalProperties``, ``items``, ``prefixItems``, ``minimum``, ``maximum``,
``exclusiveMinimum``, ``exclusiveMaximum``, ``minLength``, ``maxLength``, ``minItems``,
``maxItems``, ``oneOf``,
``anyOf``, ``$ref`` (``#/...`` in the same schema). Booleans are not numbers, as in JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import Invalid
from ..units import shown

_ARTICLE = {"integer": "an integer", "object": "an object", "array": "an array", "null": "null"}


def _is(kind: str, v: Any) -> bool:
    if kind == "integer":
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if kind == "boolean":
        return isinstance(v, bool)
    if kind == "string":
        return isinstance(v, str)
    if kind == "object":
        return isinstance(v, Mapping)
    if kind == "array":
        return isinstance(v, (list, tuple))
    if kind == "null":
        return v is None
    raise ValueError(f"the schema uses an unknown type {kind!r}")


def _same(a: Any, b: Any) -> bool:
    """JSON equality: ``True`` is not ``1``, ``1`` is ``1.0``."""
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    if _is("number", a) and _is("number", b):
        return bool(a == b)
    return type(a) is type(b) and bool(a == b)


class Validator:
    """Checks values against one schema document (``$ref`` resolves inside it)."""

    def __init__(self, document: Mapping[str, Any], noun: str = "key") -> None:
        self.document = document
        self.noun = noun  # what an object's keys are called in messages ("argument")

    def check(self, value: Any, schema: Mapping[str, Any], where: str = "") -> None:
        """Raise :class:`Invalid` when ``value`` does not match ``schema``."""
        if "$ref" in schema:
            self.check(value, self._resolve(schema["$ref"]), where)
        if "oneOf" in schema:
            matches = sum(self._ok(value, s, where) for s in schema["oneOf"])
            if matches != 1:
                raise Invalid(where, "matches none of the allowed forms")
        if "anyOf" in schema and not any(self._ok(value, s, where) for s in schema["anyOf"]):
            raise Invalid(where, "matches none of the allowed forms")
        if "type" in schema:
            kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            if not any(_is(k, value) for k in kinds):
                wanted = " or ".join(_ARTICLE.get(k, f"a {k}") for k in kinds)
                raise Invalid(where, f"must be {wanted}, got {shown(value)}")
        if "const" in schema and not _same(value, schema["const"]):
            raise Invalid(where, f"must be {schema['const']!r}, got {shown(value)}")
        if "enum" in schema and not any(_same(value, e) for e in schema["enum"]):
            choices = ", ".join(map(str, schema["enum"]))
            raise Invalid(where, f"must be one of {choices}, got {shown(value)}")
        if _is("number", value):
            self._bounds(value, schema, where)
        if isinstance(value, str):
            if "minLength" in schema and len(value) < schema["minLength"]:
                raise Invalid(where, f"is too short (at least {schema['minLength']} characters)")
            if "maxLength" in schema and len(value) > schema["maxLength"]:
                raise Invalid(where, f"is too long (at most {schema['maxLength']} characters)")
        if isinstance(value, Mapping):
            self._object(value, schema, where)
        if isinstance(value, (list, tuple)):
            self._array(value, schema, where)

    def _ok(self, value: Any, schema: Mapping[str, Any], where: str) -> bool:
        try:
            self.check(value, schema, where)
        except Invalid:
            return False
        return True

    def _resolve(self, ref: str) -> Mapping[str, Any]:
        if not ref.startswith("#/"):
            raise ValueError(f"the schema refers outside itself: {ref}")
        node: Any = self.document
        for part in ref[2:].split("/"):
            node = node[part]
        return node

    @staticmethod
    def _bounds(v: float, schema: Mapping[str, Any], where: str) -> None:
        if "minimum" in schema and v < schema["minimum"]:
            raise Invalid(where, f"must be >= {schema['minimum']}, got {shown(v)}")
        if "maximum" in schema and v > schema["maximum"]:
            raise Invalid(where, f"must be <= {schema['maximum']}, got {shown(v)}")
        if "exclusiveMinimum" in schema and v <= schema["exclusiveMinimum"]:
            raise Invalid(where, f"must be > {schema['exclusiveMinimum']}, got {shown(v)}")
        if "exclusiveMaximum" in schema and v >= schema["exclusiveMaximum"]:
            raise Invalid(where, f"must be < {schema['exclusiveMaximum']}, got {shown(v)}")

    def _object(self, value: Mapping[str, Any], schema: Mapping[str, Any], where: str) -> None:
        props: Mapping[str, Any] = schema.get("properties", {})
        for name in schema.get("required", ()):
            if name not in value:
                raise Invalid(where, f"missing {self.noun} {name!r}")
        extra = schema.get("additionalProperties", True)
        for name, v in value.items():
            inner = f"{where}.{name}" if where else str(name)
            if name in props:
                self.check(v, props[name], inner)
            elif extra is False:
                raise Invalid(where, f"unknown {self.noun} {shown(name)}")
            elif isinstance(extra, Mapping):
                self.check(v, extra, inner)

    def _array(self, value: Any, schema: Mapping[str, Any], where: str) -> None:
        if "minItems" in schema and len(value) < schema["minItems"]:
            raise Invalid(where, f"has {len(value)} items, at least {schema['minItems']} needed")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            raise Invalid(where, f"has {len(value)} items, at most {schema['maxItems']} allowed")
        prefix = schema.get("prefixItems", ())
        for i, (v, s) in enumerate(zip(value, prefix, strict=False)):
            self.check(v, s, f"{where}[{i}]")
        items = schema.get("items")
        if isinstance(items, Mapping):
            for i, v in enumerate(value[len(prefix) :], start=len(prefix)):
                self.check(v, items, f"{where}[{i}]")
        elif items is False and len(value) > len(prefix):
            raise Invalid(where, f"has {len(value)} items, at most {len(prefix)} allowed")
