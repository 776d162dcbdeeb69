"""The JSON-schema converter's gaps that fly-cpp closes (``fly_cpp.backend.grammar.json_schema_grammar``):
integer bounds as digit-by-digit ranges (``fly_cpp.basics.int_bounds``), and no raw control character
inside a string."""

from __future__ import annotations

import json
import random
import re

import pytest

from fly_cpp.backend.grammar import Grammar, json_schema_grammar
from fly_cpp.backend.model import Model
from fly_cpp.basics.errors import FlyError
from fly_cpp.basics.int_bounds import bounds, integer_range


def as_regex(gbnf: str) -> re.Pattern[str]:
    """integer_range's GBNF (quoted digits and minus, digit classes, groups, ``*``) as a regex."""
    return re.compile(re.sub(r'"(-|\d+)"', r"\1", gbnf).replace(" ", ""))


RANGES = [(0, None), (None, None), (None, -1), (-5, 5), (1, 5), (10, 99), (37, 1234), (-1234, -37), (None, 42),
          (-42, None), (0, 0), (-3, -3), (7, 7), (100, 100), (1900, 2100), (0, 10 ** 6)]
rng = random.Random(0)
RANGES += [(a, a + rng.choice([0, 5, 50, 5000])) for a in (rng.randint(-3000, 3000) for _ in range(40))]


@pytest.mark.parametrize("lo,hi", RANGES)
def test_integer_range_is_exactly_the_range(lo, hi):
    pattern = as_regex(integer_range(lo, hi))
    for x in range(-6000, 9000):
        assert bool(pattern.fullmatch(str(x))) == ((lo is None or x >= lo) and (hi is None or x <= hi)), x
    for spelled in ("01", "-0", "00", "-01", "007", "+1", ""):  # only JSON's own spelling
        assert not pattern.fullmatch(spelled)


def test_bounds_read_every_keyword():
    assert bounds({"minimum": 1, "maximum": 5}) == (1, 5)
    assert bounds({"exclusiveMinimum": 0, "exclusiveMaximum": 10}) == (1, 9)
    assert bounds({"minimum": 1.5, "maximum": 4.5}) == (2, 4)
    assert bounds({"minimum": 0, "exclusiveMinimum": True, "maximum": 9, "exclusiveMaximum": True}) == (1, 8)
    assert bounds({"minimum": 0, "exclusiveMinimum": 3}) == (4, None)
    with pytest.raises(FlyError, match="minimum above maximum"):
        bounds({"minimum": 5, "maximum": 3})
    with pytest.raises(FlyError, match="maximum must be a number"):
        json_schema_grammar(json.dumps({"type": "integer", "maximum": "9"}))


@pytest.fixture(scope="module")
def model(stories):
    with Model(stories) as m:
        yield m


def allows_text(model: Model, gbnf: str, text: str) -> bool:
    """Whether the grammar takes ``text``, one character's token at a time."""
    single = {model.piece(t): t for t in range(model.n_vocab)}  # a token spelling each character
    g = Grammar(model, gbnf)
    try:
        for ch in text:
            token = single[ch.encode()]
            if not g.allows(token):
                return False
            g.accept(token)
        return True
    finally:
        g.close()


def test_bounded_integers_in_the_grammar(model):
    gbnf = json_schema_grammar(json.dumps({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1,
                                                                                   "maximum": 12}},
                                           "required": ["n"], "additionalProperties": False}))
    assert allows_text(model, gbnf, '{"n": 12}') and allows_text(model, gbnf, '{"n": 7}')
    assert not allows_text(model, gbnf, '{"n": 13') and not allows_text(model, gbnf, '{"n": 0')
    assert not allows_text(model, gbnf, '{"n": 120')


def test_strings_take_no_raw_control_characters(model):
    gbnf = json_schema_grammar(json.dumps({"type": "string", "maxLength": 20}))
    assert allows_text(model, gbnf, '"a b\\n"')
    assert not allows_text(model, gbnf, '"a\n') and not allows_text(model, gbnf, '"a\t')
