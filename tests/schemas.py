"""Fifty JSON schemas for structured-output tests (``tests/test_json_schema.py`` on the bundled
pair, ``tests/test_real_structured.py`` on the real one): nested objects, arrays, enums, numbers,
integers with bounds, booleans, required and optional fields, ``anyOf``, nullable, tuples.

Strings carry a maxLength and arrays a maxItems, and objects forbid other keys, so that a tiny
story model, which would write a story inside any open string, still ends its answer."""

from __future__ import annotations

from typing import Any

S = {"type": "string", "maxLength": 10}


def obj(required: list[str] | None = None, **props: Any) -> dict[str, Any]:
    """An object of ``props`` with no other keys; ``required``: all of them unless given."""
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False}


def ints(lo: int | None = None, hi: int | None = None) -> dict[str, Any]:
    bounds = {"minimum": lo, "maximum": hi}
    return {"type": "integer", **{k: v for k, v in bounds.items() if v is not None}}


BOOL, INT, NUM = {"type": "boolean"}, {"type": "integer"}, {"type": "number"}
SCHEMAS: list[dict[str, Any]] = [
    obj(a=INT),
    obj(ok=BOOL),
    obj(pet={"enum": ["cat", "dog", "bird"]}),
    obj(name=S, age=INT),
    obj(x=NUM, y=NUM),
    {"type": "array", "items": INT, "minItems": 1, "maxItems": 4},
    {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
    obj(tags={"type": "array", "items": S, "maxItems": 3}),
    obj(user=obj(id=INT, name=S)),
    obj(a=obj(b=obj(c=BOOL))),
    {"enum": ["yes", "no"]},
    {"const": "fixed"},
    INT,
    {"type": "string", "maxLength": 8},
    obj(mood={"enum": ["happy", "sad"]}, score={"enum": [1, 2, 3, 4, 5]}),
    obj(items={"type": "array", "items": obj(n=INT, ok=BOOL), "maxItems": 2}),
    obj(v={"anyOf": [INT, BOOL]}),
    obj(note={"anyOf": [S, {"type": "null"}]}),
    obj(["a"], a=INT, b=INT),
    {"type": "array", "prefixItems": [INT, {"enum": ["x", "y"]}], "items": False},
    # integers with bounds (enforced by fly_cpp.basics.int_bounds: the converter ignores them)
    obj(n=ints(1, 10)),
    obj(year=ints(1900, 2100)),
    obj(celsius=ints(-20, 45)),
    {"type": "array", "items": ints(0, 100), "minItems": 2, "maxItems": 3},
    obj(count={"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 1000}),
    ints(1, 6),
    obj(code=ints(100, 599), status={"enum": ["ok", "error"]}, message=S, required=["code", "status"]),
    obj(kind={"const": "point"}, x=ints(-10, 10), y=ints(-10, 10)),
    obj(ids={"type": "array", "items": ints(1, 9999), "maxItems": 4}),
    obj(below=ints(None, -1)),
    # strings with enums, booleans
    obj(color={"type": "string", "enum": ["red", "green", "blue"]}),
    obj(size={"type": "string", "enum": ["S", "M", "L", "XL"]}, qty=ints(1, 9)),
    {"type": "string", "enum": ["north", "south", "east", "west"]},
    obj(a=BOOL, b=BOOL, c=BOOL),
    BOOL,
    {"type": "array", "items": BOOL, "maxItems": 4},
    obj(answer={"enum": [True, False, None]}),
    obj(days={"type": "array", "items": {"enum": ["mon", "tue", "wed", "thu", "fri"]}, "minItems": 1, "maxItems": 3}),
    # numbers
    NUM,
    obj(price=NUM, currency={"enum": ["USD", "EUR"]}),
    {"type": "array", "items": NUM, "minItems": 1, "maxItems": 3},
    obj(rating=NUM, stars=ints(1, 5), liked=BOOL, required=["stars", "liked"]),
    # optional fields, nesting
    obj(name=S, nick=S, age=ints(0, 120), required=["name"]),
    obj(first=S, last=S, email=S, required=["first", "last"]),
    obj(point=obj(x=ints(0, 9), y=ints(0, 9))),
    obj(book=obj(title=S, pages=ints(1, 999)), read=BOOL),
    obj(level={"enum": ["low", "mid", "high"]}, detail=obj(ok=BOOL, n=ints(0, 3), required=["ok"])),
    {"type": "array", "items": {"type": "array", "items": ints(0, 9), "maxItems": 3}, "minItems": 1, "maxItems": 2},
    obj(people={"type": "array", "items": obj(name=S, age=ints(0, 99)), "minItems": 1, "maxItems": 2}),
    obj(ok=BOOL, reason={"anyOf": [S, {"type": "null"}]}, score=NUM, required=["ok"]),
]
assert len(SCHEMAS) == 50
