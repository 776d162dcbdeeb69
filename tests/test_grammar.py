"""The grammar wrapper over llama.cpp's grammar sampler (real vocabulary: stories260K)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fly_cpp.backend.grammar import Grammar, json_schema_grammar
from fly_cpp.backend.model import Model
from fly_cpp.basics.errors import FlyError

WORDS = 'root ::= [a-z]+ (" " [a-z]+)*'


@pytest.fixture(scope="module")
def model(stories):
    with Model(stories) as m:
        yield m


def test_mask_keeps_only_allowed_tokens(model):
    g = Grammar(model, WORDS)
    row = np.zeros(model.n_vocab, dtype=np.float32)
    g.mask(row)
    allowed = np.flatnonzero(np.isfinite(row))
    assert allowed.size and all(model.piece(int(t)).isalpha() and model.piece(int(t)).islower() for t in allowed)
    assert all(g.allows(int(t)) for t in allowed[:20])
    assert not g.allows(model.eos)  # the grammar needs a word first


def test_accept_advances_and_copy_forks(model):
    g = Grammar(model, 'root ::= "{" "}"')
    brace = next(t for t in range(model.n_vocab) if model.piece(t) == b"{")
    fork = g.copy()
    g.accept(brace)
    assert not g.allows(brace) and fork.allows(brace)


def test_bad_grammar_and_schema_are_one_line_errors(model):
    for text in ("root ::= foo(", "root ::= bar", 'x ::= "a"'):
        with pytest.raises(FlyError, match="invalid grammar") as e:
            Grammar(model, text)
        assert "\n" not in str(e.value)
    with pytest.raises(FlyError, match="invalid JSON schema"):
        json_schema_grammar("{bad")
    Grammar(model, json_schema_grammar(json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}})))


def test_constraint_cuts_drafts_and_follows_rollbacks(model):
    from fly_cpp.rounds.constrain import Constraint

    piece = {model.piece(t): t for t in range(model.n_vocab)}
    a, b, space, dot = piece[b"a"], piece[b"b"], piece[b" "], piece[b"."]
    prompt = [1, 2, 3]
    c = Constraint(Grammar(model, WORDS), len(prompt))
    assert c.usable(prompt, [a, space, b, dot, a]) == [a, space, b]  # the first forbidden token ends the draft
    assert c.usable(prompt, [dot, a]) == []
    c.sync([*prompt, a, space, b])
    assert len(c.states) == 4 and not c.states[-2].allows(space) and c.states[-1].allows(space)
    c.sync([*prompt, a])  # a rollback cuts the states with the text
    assert c.tokens == [a] and c.states[-1].allows(space)
    rows = np.zeros((3, model.n_vocab), dtype=np.float32)
    c.mask(rows, [*prompt, a], [space, b])
    assert np.isfinite(rows[0, space]) and not np.isfinite(rows[1, space]) and np.isfinite(rows[2, space])
