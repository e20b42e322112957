"""The kernel side of the panel protocol: its constants, the schema, request checking.

``schema.json`` beside this file is the single source of truth: requests are checked
against it (``validate.py``), the model's records become its objects through one
conversion (``convert.py``), the panel's TypeScript types are generated from it, and
tests validate every reply and comm message against it. ``handler.py`` answers requests;
the transport (control channel, comm) is the kernel front end's (``_kernel.py``). The
kernel never evaluates code sent to it: an action is a name looked up in a table.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from ..errors import Invalid, ProtocolError
from ..units import shown
from .validate import Validator

PROTOCOL_VERSION = 1
# Additions an older peer can ignore (new actions, new optional fields) raise the revision
# (schema.json's ``protocol_revision``, the one place it is written: ``PROTOCOL_REVISION``
# reads it when first asked for, see ``__getattr__``) and keep the protocol version; what
# each revision added is listed in docs/protocol.md.
REQUEST = "gpumem_request"
REPLY = "gpumem_reply"
COMM_TARGET = "jupyter_gpumem"


@cache
def schema() -> dict[str, Any]:
    # Beside this file (a path, not importlib.resources: that import alone cost 11 ms)
    text = Path(__file__).with_name("schema.json").read_text(encoding="utf-8")
    return dict(json.loads(text))


def __getattr__(name: str) -> Any:
    if name == "PROTOCOL_REVISION":  # read when asked for: importing reads no file
        return schema()["protocol_revision"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@cache
def _validator(noun: str) -> Validator:
    return Validator(schema(), noun)


@cache
def _envelope() -> dict[str, Any]:
    """schema.json's ``request`` with only the types of ``protocol`` and ``action``: its
    shape. Which version and which action are checked after it, each with its own code."""
    request = schema()["$defs"]["request"]
    properties = dict(request["properties"])
    properties["protocol"] = {"type": "number"}
    properties["action"] = {"type": "string"}
    return {**request, "properties": properties}


def check_request(content: Any) -> tuple[str, dict[str, Any]]:
    """(action, args) of a request that schema.json accepts; :class:`ProtocolError`
    with the error code it names otherwise: ``bad_request`` for a request of the wrong
    shape (not an object, a key missing or unknown, a value of the wrong type), then
    ``unsupported_protocol`` for a well-formed request of another version, then
    ``unknown_action``, then ``bad_request`` for the action's arguments."""
    if not isinstance(content, Mapping):
        raise ProtocolError("bad_request", "the request content must be an object")
    envelope = _envelope()
    for name in envelope["required"]:
        if name not in content:
            raise ProtocolError("bad_request", f"missing {name}")
    try:
        _validator("key").check(content, envelope, "")
    except Invalid as e:
        raise ProtocolError("bad_request", str(e)) from None
    protocol = content["protocol"]
    if protocol != PROTOCOL_VERSION:
        whole = isinstance(protocol, int) or (isinstance(protocol, float) and protocol.is_integer())
        raise ProtocolError(
            "unsupported_protocol" if whole else "bad_request",
            f"this kernel speaks protocol {PROTOCOL_VERSION}, got {shown(protocol)}",
        )
    action = content["action"]
    actions = schema()["actions"]
    if action not in actions:
        raise ProtocolError("unknown_action", f"unknown action {shown(action)}")
    try:
        _validator("key").check(content, schema()["$defs"]["request"], "")
        args = content.get("args", {})
        _validator("argument").check(args, actions[action], f"{action}")
    except Invalid as e:
        raise ProtocolError("bad_request", str(e)) from None
    return action, dict(args)


def error_reply(action: str | None, code: str, message: str) -> dict[str, Any]:
    return {
        "protocol": PROTOCOL_VERSION,
        "action": action if isinstance(action, str) and len(action) <= 64 else None,
        "status": "error",
        "error": {"code": code, "message": message},
    }


BUSY = "busy: available when the cell ends"

__all__ = [
    "BUSY",
    "COMM_TARGET",
    "PROTOCOL_REVISION",  # noqa: F822 (given by the module's __getattr__, read when asked)
    "PROTOCOL_VERSION",
    "REPLY",
    "REQUEST",
    "ProtocolError",
    "check_request",
    "error_reply",
    "schema",
]
