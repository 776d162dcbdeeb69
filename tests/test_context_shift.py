"""Context shift (``fly_cpp.rounds.shift``, ``serve --context-shift``) and the full context without it,
on the bundled stories260K pair with a 64-token context: the text goes on past a full context,
the speculative modes stay exact across shifts, and the server reports what llama-server does."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from fly_cpp import Fly
from fly_cpp.config import ModelSettings, ServerSettings
from fly_cpp.engine.engine import Engine
from fly_cpp.rounds.request import Shift
from fly_cpp.server import create_app

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def fly(stories, stories_draft):
    with Fly(stories, stories_draft, n_ctx=64, n_threads=1) as llm:
        yield llm


def test_span_is_llama_servers():
    assert Shift().span(256, 255) == (1, 127)  # keep BOS, drop half of the rest
    assert Shift(300).span(256, 255) == (252, 1)  # n_keep at most n_ctx - 4, one token left after the drop
    assert Shift(1, 500).span(256, 255) == (1, 253)
    assert Shift(10, 3).span(64, 63) == (10, 3)


def test_a_shift_goes_on_past_the_full_context(fly):
    prompt = fly.engine.tokenize(PROMPT)
    ended = fly.generate(prompt, max_tokens=150, temperature=0).run()
    assert ended.context_full and len(prompt) + len(ended.tokens) == 64 and ended.stats.n_shifts == 0
    gen = fly.generate(prompt, max_tokens=150, shift=Shift(3), temperature=0).run()
    assert len(gen.tokens) == 150 and not gen.context_full and gen.stats.n_shifts >= 2
    held = fly.engine.target.tokens
    assert held[:3] == prompt[:3] and len(held) < 64 and held[-8:] == (prompt + gen.tokens)[-9:-1]


def test_exact_modes_stay_the_targets_text_across_shifts(fly):
    prompt = fly.engine.tokenize(PROMPT)
    want = fly.generate(prompt, max_tokens=150, mode="target", shift=Shift(), temperature=0).run().tokens
    for k in (1, 4):
        assert fly.generate(prompt, max_tokens=150, mode="spd", k=k, shift=Shift(), temperature=0).run().tokens == want
    sampled = {mode: fly.generate(prompt, max_tokens=150, mode=mode, k=3, shift=Shift(), temperature=0.8,
                                  seed=5).run().tokens for mode in ("target", "spd")}
    assert sampled["target"] == sampled["spd"]  # draws keep counting from where they were


def test_a_shift_in_a_slot_is_the_same_text(stories, stories_draft, fly):
    prompt = fly.engine.tokenize(PROMPT)
    want = fly.generate(prompt, max_tokens=120, mode="target", shift=Shift(), temperature=0).run().tokens
    engine = Engine(ModelSettings(str(stories), n_ctx=128, n_threads=1),
                    ModelSettings(str(stories_draft), n_threads=1), n_seq=2)  # 64 positions per slot
    with Fly.from_engine(engine) as slots:
        gen = slots.generate(prompt, max_tokens=120, mode="spd", shift=Shift(), slot=1, temperature=0).run()
        assert gen.stats.n_shifts >= 1 and gen.tokens == want


def test_the_grammar_holds_across_shifts(fly):
    gen = fly.generate(PROMPT, max_tokens=150, mode="spd", shift=Shift(), grammar="root ::= [a-z ]+",
                       temperature=0).run()
    assert gen.stats.n_shifts >= 2 and len(gen.tokens) == 150 and re.fullmatch(r"[a-z ]+", gen.text)


@pytest.mark.parametrize("shift", [False, True])
def test_server_reports_the_full_context_as_llama_server(fly, shift):
    with TestClient(create_app(fly, settings=ServerSettings(context_shift=shift))) as client:
        n_prompt = len(fly.engine.tokenize(PROMPT))
        short = client.post("/completion", json={"prompt": PROMPT, "n_predict": 8, "temperature": 0}).json()
        assert short["timings"]["predicted_n"] == 8 and short["truncated"] is False
        out = client.post("/completion", json={"prompt": PROMPT, "n_predict": 100, "temperature": 0}).json()
        assert out["truncated"] is True and out["timings"]["prompt_n"] + out["timings"]["cache_n"] == n_prompt
        assert out["timings"]["predicted_n"] == (100 if shift else 64 - n_prompt)
        assert out["generation_settings"]["n_discard"] == 0
