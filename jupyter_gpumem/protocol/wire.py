"""A record's protocol object, derived from its fields: :class:`Wire` says what differs
from the fields (the few that stay home, a name, a rounding), :func:`converter` makes the
function that writes the object.

A field the record gains travels under its own name with no edit here; schema.json must
then name it (``tests/test_protocol_convert.py`` checks every field of every record is
either in the schema or in its ``omit``).

The function is generated once per record type (as ``dataclasses`` writes ``__init__``):
one dict literal reading the attributes, as fast as the hand-written conversion it
replaced, which runs for every panel sample and every cell.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Convert = Callable[[Any], Any]
When = Literal["truthy", "not_none"]


@dataclass(frozen=True)
class Wire:
    """How one record type travels. Its fields, in their order, under their own names,
    with their values as they are, except:

    ``omit``: fields the protocol does not carry; ``rename``: field -> key; ``value``:
    field -> a function of the field's value (a nested record's conversion, a rounding);
    ``when``: field -> sent only when its value is truthy / not None; ``extra``: keys
    computed from the whole record (a property; a key that is a field's name replaces
    that field's value); ``spread``: field -> (record type, its fields left out): the
    nested record's fields travel in this object, None each when it is None; ``order``:
    keys in the order sent, ``...`` standing for the others in field order (extra keys
    after the fields)."""

    omit: tuple[str, ...] = ()
    rename: Mapping[str, str] = field(default_factory=dict)
    value: Mapping[str, Convert] = field(default_factory=dict)
    when: Mapping[str, When] = field(default_factory=dict)
    extra: Mapping[str, Convert] = field(default_factory=dict)
    spread: Mapping[str, tuple[type, tuple[str, ...]]] = field(default_factory=dict)
    order: tuple[Any, ...] = (...,)


def record_fields(cls: type) -> tuple[str, ...]:
    """A dataclass's or a named tuple's fields, in order."""
    if dataclasses.is_dataclass(cls):
        return tuple(f.name for f in dataclasses.fields(cls))
    named = getattr(cls, "_fields", None)
    if named is None:
        raise TypeError(f"{cls.__name__} is neither a dataclass nor a named tuple")
    return tuple(named)


def keys(cls: type, wire: Wire) -> list[tuple[str, str, str | None]]:
    """The object's keys in the order sent: (key, field or extra name, spread field),
    the last None but for a spread record's fields."""
    out: list[tuple[str, str, str | None]] = []
    for f in record_fields(cls):
        if f in wire.omit:
            continue
        if f in wire.spread:
            nested, left_out = wire.spread[f]
            out += [(g, g, f) for g in record_fields(nested) if g not in left_out]
        else:
            out.append((wire.rename.get(f, f), f, None))
    named = {k for k, _, _ in out}
    out += [(k, k, None) for k in wire.extra if k not in named]
    if wire.order == (...,):
        return out
    by_key = {k[0]: k for k in out}
    unknown = [k for k in wire.order if k is not ... and k not in by_key]
    if unknown:
        raise ValueError(f"{cls.__name__}: order names no key {unknown}")
    listed = [k for k in wire.order if k is not ...]
    rest = [k for k in out if k[0] not in listed]
    at = wire.order.index(...) if ... in wire.order else len(wire.order)
    head, tail = listed[:at], listed[at:]
    return [by_key[k] for k in head] + rest + [by_key[k] for k in tail]


def converter(cls: type, wire: Wire) -> Convert:
    """The function that writes a ``cls`` record's object (generated, see the module)."""
    env: dict[str, Any] = {}
    prelude: list[str] = []
    items: list[str] = []  # the dict literal's entries, up to the first optional key
    after: list[str] = []  # statements, from the first optional key on
    for n, (key, name, spread) in enumerate(keys(cls, wire)):
        if spread is not None:
            holder = f"s_{spread}"
            if f"    {holder} = r.{spread}" not in prelude:
                prelude.append(f"    {holder} = r.{spread}")
            expr = f"(None if {holder} is None else {holder}.{name})"
        elif name in wire.extra:
            env[f"x{n}"] = wire.extra[name]
            expr = f"x{n}(r)"
        else:
            expr = f"r.{name}"
            if name in wire.value:
                env[f"v{n}"] = wire.value[name]
                expr = f"v{n}({expr})"
        when = wire.when.get(name) if spread is None else None
        if when is None and not after:
            items.append(f"{key!r}: {expr}")
        elif when is None:
            after.append(f"    out[{key!r}] = {expr}")
        else:
            test = "v" if when == "truthy" else "v is not None"
            value = f"v{n}(v)" if name in wire.value else "v"
            after += [f"    v = r.{name}", f"    if {test}:", f"        out[{key!r}] = {value}"]
    body = "\n".join(prelude)
    literal = "{" + ", ".join(items) + "}"
    if after:
        text = f"def convert(r):\n{body}\n    out = {literal}\n" + "\n".join(after)
        text += "\n    return out\n"
    else:
        text = f"def convert(r):\n{body}\n    return {literal}\n"
    exec(compile(text, f"<protocol object of {cls.__name__}>", "exec"), env)
    fn: Convert = env["convert"]
    fn.__doc__ = f"The protocol object of a {cls.__name__}.\n\n{text}"
    return fn
