"""Grammar-constrained generation with speculation and FLy (``fly_cpp.rounds.constrain``), on the
bundled stories260K pair: every emitted token, exact, loosely accepted, correction or bonus,
greedy or sampled, is one the grammar allows."""

from __future__ import annotations

import re

import pytest

from fly_cpp import Engine, ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.backend.grammar import Grammar
from fly_cpp.basics.errors import FlyError

WORDS = 'root ::= [a-z]+ (" " [a-z]+)*'
PROMPTS = ["Once upon a time", "Lily and Tom went to the park", "The little dog was sad because", "Mom said,"]
MODES = ("target", "spd", "fly")
WORDS_ONLY = SamplingSettings(temperature=0, grammar=WORDS)  # greedy


@pytest.fixture(scope="module")
def engine(stories, stories_draft):
    # n_ubatch=1: a verified row equals a one-token decode, so greedy spd == target exactly
    with Engine(ModelSettings(str(stories), n_ctx=512, n_ubatch=1), ModelSettings(str(stories_draft))) as e:
        yield e


def spec(mode: str, **more) -> SpecSettings:
    return SpecSettings(mode=mode, k=8, **more)


def obeys(engine: Engine, gbnf: str, tokens: list[int]) -> bool:
    """Whether the grammar allows each token in turn (a fresh state, fed the text)."""
    g = Grammar(engine.target_model, gbnf)
    for t in tokens:
        if not g.allows(t):
            return False
        g.accept(t)
    return True


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_words_grammar_holds_in_every_mode(engine, mode, temperature):
    for prompt in PROMPTS:
        gen = engine.generate(prompt, spec=spec(mode), sampling=SamplingSettings(temperature=temperature, seed=7, grammar=WORDS),
                              max_tokens=40).run()
        assert re.fullmatch(r"[a-z]+( [a-z]+)*", gen.text), gen.text
        assert obeys(engine, WORDS, gen.tokens)


def test_greedy_spd_under_a_grammar_is_the_target_under_it(engine):
    for prompt in PROMPTS:
        alone = engine.generate(prompt, spec=spec("target"), max_tokens=40, sampling=WORDS_ONLY).run().tokens
        assert engine.generate(prompt, spec=spec("spd"), max_tokens=40, sampling=WORDS_ONLY).run().tokens == alone


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("rule", ["paper", "guarded"])
def test_loose_accepts_under_a_grammar_are_grammar_valid(engine, temperature, rule):
    """A permissive gate so FLy loosens often; guarded also runs the cross-round window, whose
    refutations roll the grammar back with the text."""
    loose = refuted = 0
    for prompt in PROMPTS:
        gen = engine.generate(prompt, spec=spec("fly", fly_rule=rule, loosen="on", entropy_threshold=0.0, window=2,
                                                loose_min_ratio=0.0, cross_round=rule == "guarded"),
                              sampling=SamplingSettings(temperature=temperature, seed=11, grammar=WORDS), max_tokens=60)
        steps = list(gen)
        loose += sum(s.loose for s in steps)
        refuted += gen.stats.n_refuted
        # every token, each loose one included, is allowed where it stands
        assert obeys(engine, WORDS, [s.token for s in steps])
        # Stats count every loose accept emitted (and those the end of the text cut off)
        assert gen.stats.n_loose >= sum(s.loose for s in steps)
        assert re.fullmatch(r"[a-z]+( [a-z]+)*", gen.text), gen.text
    assert loose > 0  # the property was exercised
    assert refuted > 0 or rule == "paper"


def test_same_request_same_text(engine):
    once = [engine.generate(PROMPTS[0], spec=spec("fly"), sampling=SamplingSettings(temperature=0.8, seed=5, grammar=WORDS),
                            max_tokens=30).run().text for _ in range(2)]
    assert once[0] == once[1]


def test_invalid_grammar_is_refused_before_any_token(engine):
    with pytest.raises(FlyError, match="invalid grammar"):
        engine.generate(PROMPTS[0], sampling=SamplingSettings(grammar="root ::= ("))
    with pytest.raises(FlyError, match="not both"):
        SamplingSettings(grammar=WORDS, json_schema="{}")


def test_nothing_left_to_write_is_an_error_not_a_forbidden_token(engine):
    """With the end-of-text tokens banned, a grammar that has ended leaves nothing to write."""
    gen = engine.generate(PROMPTS[0], sampling=SamplingSettings(grammar='root ::= "a"', ignore_eos=True), max_tokens=8)
    with pytest.raises(FlyError, match="allows no token"):
        gen.run()
