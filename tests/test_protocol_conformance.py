"""The kernel's request checks agree with JSON Schema itself.

``protocol/validate.py`` interprets ``schema.json`` with a small validator (the libraries
cost the kernel too much to import; see its docstring). Here ``jsonschema`` is the judge:
on a corpus generated from the schema (every action; for every argument its bounds, one
past them and values of every JSON type; required arguments missing; unknown arguments;
the envelope's ``protocol``, ``action`` and ``args`` mutated; unknown top-level keys), a
request passes ``check_request`` exactly when ``jsonschema`` accepts it, and a refused
request carries the error code the protocol names for its fault.

One documented difference: an integer is a Python ``int``. JSON Schema also calls ``1.0``
an integer; Python's ``json`` reads ``1.0`` as a float and the kernel refuses it, so the
judge is told the same.
"""

from __future__ import annotations

import itertools
from typing import Any

import jsonschema
import pytest

from jupyter_gpumem.errors import ProtocolError
from jupyter_gpumem.protocol import check_request, schema

S = schema()
ACTIONS = S["actions"]

_types = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
    "integer", lambda _, v: isinstance(v, int) and not isinstance(v, bool)
)
Judge = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=_types)
ENVELOPE = Judge({**S, "$ref": "#/$defs/request"})
ARGS = {name: Judge({**S, **spec}) for name, spec in ACTIONS.items()}

ANY_TYPE: list[Any] = [None, True, False, 0, -1, 7, 2.5, 1.0, "", "x", [], [1], {}, {"a": 1}]


def values_for(spec: dict[str, Any]) -> list[Any]:
    """An argument's interesting values: its bounds, one past them, every JSON type."""
    out = list(ANY_TYPE)
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if key in spec:
            b = spec[key]
            out += [b, b - 1, b + 1]
            if spec.get("type") == "number":
                out += [b - 0.5, b + 0.5, b * 0.999, float(b)]
    if "minLength" in spec:
        out += ["a" * spec["minLength"], "a" * max(0, spec["minLength"] - 1)]
    if "maxLength" in spec:
        out += ["a" * spec["maxLength"], "a" * (spec["maxLength"] + 1)]
    if spec.get("type") == "array":
        item = _valid(spec.get("items", {}))
        low, high = spec.get("minItems", 0), spec.get("maxItems")
        out += [[item] * low, [item] * max(0, low - 1)]
        if high is not None:
            out += [[item] * high, [item] * (high + 1)]
        out += [[v] for v in values_for(spec.get("items", {}))]  # each item's values
    return out


def args_corpus(action: str) -> list[Any]:
    spec = ACTIONS[action]
    props: dict[str, Any] = spec.get("properties", {})
    required = spec.get("required", [])
    base = {name: _valid(props[name]) for name in required}
    corpus: list[Any] = [base, dict(base, unknown=1), dict(base, __class__="x")]
    corpus += [{k: v for k, v in base.items() if k != r} for r in required]
    for name, p in props.items():
        for v in values_for(p):
            corpus.append(dict(base, **{name: v}))
    for a, b in itertools.combinations(props, 2):  # pairs of valid arguments
        corpus.append(dict(base, **{a: _valid(props[a]), b: _valid(props[b])}))
    corpus += [[], None, "x", 1, True]  # args that are not an object
    return corpus


def _valid(spec: dict[str, Any]) -> Any:
    kind = spec.get("type")
    if kind == "boolean":
        return True
    if kind == "string":
        return "c" * max(1, spec.get("minLength", 1))
    if kind == "number":
        return 0.5
    if kind == "array":
        return [_valid(spec.get("items", {}))] * max(1, spec.get("minItems", 1))
    return spec.get("minimum", 1)


def corpus() -> list[Any]:
    requests: list[Any] = []
    for action in ACTIONS:
        for args in args_corpus(action):
            requests.append({"protocol": 1, "action": action, "args": args})
        requests.append({"protocol": 1, "action": action})  # args left out
    envelope_protocols = [1, 1.0, True, 2, 0, 2.0, 1.5, "1", None, [1]]
    envelope_actions = ["hello", "set_caching", "exec", "", 1, None, ["hello"], "HELLO"]
    for p, a in itertools.product(envelope_protocols, envelope_actions):
        requests.append({"protocol": p, "action": a, "args": {}})
    requests += [
        {"action": "hello"},  # protocol missing
        {"protocol": 1},  # action missing
        {"protocol": 1, "action": "hello", "args": {}, "id": 3},  # unknown top-level key
        {"protocol": 1, "action": "hello", "extra": None},
        {"protocol": 2, "action": "hello", "extra": None},  # another version, a bad shape
        {"protocol": 1, "action": "hello", "args": []},
        {"protocol": 2, "action": "hello", "args": "x"},
        "hello",
        None,
        [],
        42,
    ]
    return requests


def judged(request: Any) -> bool:
    """JSON Schema's verdict: the envelope, then the named action's arguments."""
    if not ENVELOPE.is_valid(request):
        return False
    return ARGS[request["action"]].is_valid(request.get("args", {}))


def expected_code(request: Any) -> str:
    """The envelope's shape first (an object of the schema's keys, a number as ``protocol``,
    a string as ``action``, an object as ``args``): ``bad_request``; then another version
    (a whole number): ``unsupported_protocol``; then the action: ``unknown_action``."""
    if not isinstance(request, dict):
        return "bad_request"
    p, a = request.get("protocol"), request.get("action")
    number = isinstance(p, (int, float)) and not isinstance(p, bool)
    shaped = (
        {"protocol", "action"} <= set(request) <= {"protocol", "action", "args"}
        and number
        and isinstance(a, str)
        and isinstance(request.get("args", {}), dict)
    )
    if not shaped:
        return "bad_request"
    if p != 1:
        return "unsupported_protocol" if float(p).is_integer() else "bad_request"
    if a not in ACTIONS:
        return "unknown_action"
    return "bad_request"


CORPUS = corpus()


def test_the_corpus_is_large_and_mixed():
    verdicts = [judged(r) for r in CORPUS]
    assert len(CORPUS) > 400
    assert 50 < sum(verdicts) < len(CORPUS) - 200  # many of each


@pytest.mark.parametrize("action", list(ACTIONS))
def test_check_request_agrees_with_jsonschema(action):
    mine = [r for r in CORPUS if isinstance(r, dict) and r.get("action") == action]
    assert mine
    for request in mine:
        _agree(request)


def test_envelopes_agree_with_jsonschema():
    for request in CORPUS:
        named = isinstance(request, dict) and isinstance(request.get("action"), str)
        if not (named and request["action"] in ACTIONS):
            _agree(request)


def _agree(request: Any) -> None:
    valid = judged(request)
    try:
        action, args = check_request(request)
    except ProtocolError as e:
        assert not valid, f"refused a request the schema accepts: {request!r}: {e.message}"
        assert e.code == expected_code(request), (request, e.code, e.message)
        assert len(e.message) < 300  # a bad value is echoed short
        return
    assert valid, f"accepted a request the schema refuses: {request!r}"
    assert action == request["action"] and args == request.get("args", {})


@pytest.mark.parametrize(
    "request_",
    [
        {"protocol": True, "action": "hello"},
        {"protocol": "1", "action": "hello"},
        {"protocol": None, "action": "hello"},
        {"protocol": [1], "action": "hello"},
        {"protocol": 1.5, "action": "hello"},
        {"action": "hello"},
        {"protocol": 1},
        {"protocol": 1, "action": 1},
        {"protocol": 1, "action": None},
        {"protocol": 1, "action": "hello", "args": []},
        {"protocol": 1, "action": "hello", "id": 3},
        {"protocol": 2, "action": "hello", "id": 3},
    ],
)
def test_a_request_of_the_wrong_shape_is_a_bad_request(request_):
    """What schema.json refuses for its shape is ``bad_request``, whatever its version."""
    assert not judged(request_)
    with pytest.raises(ProtocolError) as e:
        check_request(request_)
    assert e.value.code == "bad_request", e.value.message


def test_a_well_formed_request_of_another_version_is_unsupported():
    for p in (2, 0, 2.0):
        with pytest.raises(ProtocolError) as e:
            check_request({"protocol": p, "action": "hello", "args": {}})
        assert e.value.code == "unsupported_protocol"
        assert e.value.message == f"this kernel speaks protocol 1, got {p!r}"


def test_a_long_bad_value_is_echoed_short():
    args = {"interval_ms": 1000, "client": "x" * 10_000}
    with pytest.raises(ProtocolError) as e:
        check_request({"protocol": 1, "action": "subscribe", "args": args})
    assert e.value.code == "bad_request" and "too long" in e.value.message
    assert len(e.value.message) < 200
    with pytest.raises(ProtocolError) as e:
        check_request({"protocol": 1, "action": "y" * 10_000})
    assert e.value.code == "unknown_action" and len(e.value.message) < 100
