"""Tool calls through the Python API on real contexts: the bundled stories260K pair (given a
Hermes-style template) and the synthetic qwen35-tiny pair (the real Qwen tokenizer). A forced
call (required, a named function) in target, spd and fly modes, greedy and seeded, parses and
its arguments validate against the function's schema; auto is a lazy grammar; none renders no
tools; streamed deltas join to the same call; bad tools are refused with one line."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from fly_cpp import Fly, FlyError
from fly_cpp.api import tools as tool_calls
from fly_cpp.backend.grammar import Grammar
from fly_cpp.rounds.constrain import Lazy
from fly_cpp.api.tool_formats import detect

TEMPLATE = (Path(__file__).parent / "data" / "hermes-tools.jinja").read_text()
PET = {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}, "good": {"type": "boolean"}},
       "required": ["kind", "good"], "additionalProperties": False}
DAY = {"type": "object", "properties": {"day": {"type": "integer", "maximum": 31}}, "required": ["day"]}
TOOLS = [{"type": "function", "function": {"name": "pet", "description": "adopt a pet", "parameters": PET}},
         {"type": "function", "function": {"name": "day", "parameters": DAY}}]
SCHEMAS = {"pet": PET, "day": DAY}
HERMES = detect(TEMPLATE)
CHAT = [{"role": "user", "content": "Adopt a pet for me."}]


@pytest.fixture(scope="module")
def fly(stories, stories_draft):
    # n_ubatch=1: a verified row equals a one-token decode, so greedy spd == target exactly
    with Fly(stories, stories_draft, n_ctx=1024, n_ubatch=1, chat_format=TEMPLATE) as f:
        yield f


def calls(out, finish="tool_calls"):
    choice = out["choices"][0]
    assert choice["finish_reason"] == finish, choice
    if finish == "tool_calls":
        assert choice["message"]["content"] is None
    got = choice["message"]["tool_calls"]
    for c in got:
        assert c["type"] == "function" and c["id"].startswith("call_")
        jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[c["function"]["name"]])
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got]


@pytest.mark.parametrize("mode", ["target", "spd", "fly"])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "pet"}}])
def test_forced_call_in_every_mode(fly, mode, choice):
    greedy = calls(fly.create_chat_completion(CHAT, max_tokens=120, temperature=0, mode=mode, tools=TOOLS,
                                              tool_choice=choice))
    assert len(greedy) == 1
    if isinstance(choice, dict):
        assert greedy[0][0] == "pet"
    sampled = [calls(fly.create_chat_completion(CHAT, max_tokens=120, temperature=0.9, seed=7, mode=mode, tools=TOOLS,
                                                tool_choice=choice)) for _ in range(2)]
    assert sampled[0] == sampled[1]  # seeded: the same call again


def test_spd_writes_the_call_target_writes(fly):
    want = fly.create_chat_completion(CHAT, max_tokens=120, temperature=0, mode="target", tools=TOOLS,
                                      tool_choice="required")
    got = fly.create_chat_completion(CHAT, max_tokens=120, temperature=0, mode="spd", tools=TOOLS,
                                     tool_choice="required")
    assert calls(got) == calls(want)


def test_fly_loosens_tokens_inside_the_call_and_they_obey_the_grammar(fly):
    out = fly.create_chat_completion(CHAT, max_tokens=120, temperature=0, mode="fly", tools=TOOLS,
                                     tool_choice="required", entropy_threshold=float("inf"), window=0)
    calls(out)  # every token, loose ones included, kept the call valid


def test_parallel_calls(fly):
    out = fly.create_chat_completion(CHAT, max_tokens=250, temperature=0, tools=TOOLS, tool_choice="required",
                                     parallel_tool_calls=True, mode="spd")
    assert len(calls(out, "length")) >= 2  # the story model keeps calling until the limit


def test_streamed_deltas_join_to_the_same_call(fly):
    whole = calls(fly.create_chat_completion(CHAT, max_tokens=120, temperature=0, tools=TOOLS, tool_choice="required"))
    chunks = list(fly.create_chat_completion(CHAT, max_tokens=120, temperature=0, tools=TOOLS, tool_choice="required",
                                             stream=True))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    streamed = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert [(tc["function"]["name"], json.loads(tc["function"]["arguments"])) for tc in streamed] == whole
    assert [tc["index"] for tc in streamed] == list(range(len(streamed)))
    assert not any(d.get("content") for d in deltas)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_none_renders_no_tools_and_auto_renders_them(fly):
    assert "<tools>" not in fly.detokenize(fly.chat_turn(CHAT, tools=TOOLS, tool_choice="none")[0])
    tokens, settings, opts = fly.chat_turn(CHAT, tools=TOOLS)
    assert "<tools>" in fly.detokenize(tokens) and settings["grammar_trigger"] == "<tool_call>" and opts.calls
    out = fly.create_chat_completion(CHAT, max_tokens=30, temperature=0, tools=TOOLS, tool_choice="none")
    assert out["choices"][0]["finish_reason"] == "length" and "tool_calls" not in out["choices"][0]["message"]


def test_auto_is_free_text_until_the_trigger(fly):
    out = fly.create_chat_completion(CHAT, max_tokens=30, temperature=0, tools=TOOLS, tool_choice="auto")
    plain = fly.create_chat_completion(CHAT, max_tokens=30, temperature=0, tools=TOOLS, tool_choice="none")
    assert out["choices"][0]["message"]["content"]  # the story model never writes <tool_call>: free text
    assert "tool_calls" not in out["choices"][0]["message"]
    assert plain["choices"][0]["message"]["content"]


def test_lazy_grammar_starts_after_the_trigger(fly):
    model = fly.engine.target_model
    gbnf, trigger = tool_calls.grammar(tool_calls.check(TOOLS, "auto"), False, HERMES)
    lazy = Lazy(Grammar(model, gbnf), trigger, model.tokenize)
    seen = b""
    for t in model.tokenize('Hi <tool_call>\n{"name": "pe', add_special=False):
        assert lazy.allows(t)
        assert lazy.on == (b"<tool_call>" in seen)  # free text until the trigger is written
        lazy.accept(t)
        seen += model.piece(t)
    assert lazy.on
    ok, bad = (next(i for i in range(model.n_vocab) if model.piece(i) == s) for s in (b"t", b"x"))
    assert lazy.allows(ok) and not lazy.allows(bad)
    # a token that completes the trigger and carries text the grammar refuses does not start it
    # (llama.cpp's own lazy grammar would abort the process there): "all" completes "<tool_ca"
    other = Lazy(Grammar(model, gbnf), "<tool_ca", model.tokenize)
    for t in model.tokenize("Hi <tool_call", add_special=False):
        other.accept(t)
    assert model.piece(t) == b"all" and not other.on


@pytest.mark.parametrize("mode", ["target", "spd", "fly"])
def test_a_lazy_grammar_in_the_loop(fly, mode):
    """The text is free until the trigger word, then the grammar's, across drafts and rollbacks."""
    for temperature in (0, 0.8):
        gen = fly.generate("Once upon a time", max_tokens=80, mode=mode, temperature=temperature, seed=3,
                           grammar='root ::= ", THE END."', grammar_trigger=" named")
        text = gen.run().text
        assert text.endswith(" named, THE END.") and text.count(" named") == 1, text


def feeds(grammar, model, text):
    """Whether ``grammar`` takes ``text``, one single-character token at a time."""
    by_piece = {model.piece(i): i for i in range(model.n_vocab)}
    for ch in text.encode():
        token = by_piece[bytes([ch])]
        if not grammar.allows(token):
            return False
        grammar.accept(token)
    return True


@pytest.mark.parametrize("opened", [False, True])
def test_forced_grammar_after_an_opened_reasoning_block(fly, opened):
    """A template whose generation prompt opens <think> gets a grammar that lets the reasoning
    close first; without one the call starts the answer."""
    model = fly.engine.target_model
    gbnf, trigger = tool_calls.grammar(tool_calls.check(TOOLS, {"type": "function", "function": {"name": "pet"}}),
                                       opened, HERMES)
    assert trigger == ""
    call = '<tool_call>\n{"name": "pet", "arguments": {"kind": "dog", "good": true}}\n</tool_call>'
    thought = "Dogs are good.\n</think>\n\n"
    assert feeds(Grammar(model, gbnf), model, thought + call) == opened
    assert feeds(Grammar(model, gbnf), model, call) == (not opened)
    assert not feeds(Grammar(model, gbnf), model, call.replace("dog", "cow"))
    assert tool_calls.think_open("<|im_start|>assistant\n<think>\n") and not tool_calls.think_open("x</think>\n")


def test_round_trip_messages_render(fly):
    call = {"id": "call_1", "type": "function", "function": {"name": "pet", "arguments": '{"kind": "cat", "good": true}'}}
    messages = [*CHAT, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "adopted"}]
    text = fly.detokenize(fly.chat_turn(messages, tools=TOOLS)[0])
    assert '{"name": "pet", "arguments": {"kind": "cat", "good": true}}' in text
    assert "<tool_response>\nadopted\n</tool_response>" in text
    out = fly.create_chat_completion(messages, max_tokens=10, temperature=0, tools=TOOLS, tool_choice="none")
    assert out["choices"][0]["message"]["content"]


@pytest.mark.parametrize("kwargs,says", [
    ({"tools": "pet"}, "tools must be a list"),
    ({"tools": [{"type": "function"}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "name"),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "fly"}}}, "not among the tools"),
    ({"tool_choice": "required"}, "needs tools"),
    ({"tools": TOOLS, "json_schema": "{}"}, "cannot be combined"),
    ({"tools": TOOLS, "reasoning_format": "maybe"}, "reasoning_format"),
])
def test_bad_tools_are_refused(fly, kwargs, says):
    with pytest.raises(FlyError, match=says.replace("[", r"\[").replace("]", r"\]")):
        fly.create_chat_completion(CHAT, max_tokens=5, **kwargs)


def test_a_default_schema_gives_way_to_a_forced_call(stories):
    with Fly(stories, n_ctx=1024, chat_format=TEMPLATE, json_schema=json.dumps(DAY)) as f:
        assert calls(f.create_chat_completion(CHAT, max_tokens=120, temperature=0, tools=TOOLS, tool_choice="required"))
        out = f.create_chat_completion(CHAT, max_tokens=40, temperature=0, tools=TOOLS, tool_choice="none")
        assert out["choices"][0]["message"]["content"].startswith("{")  # the default schema holds without tools


def test_a_reasoning_block_the_prompt_opens_goes_to_reasoning_content(stories):
    thinking = TEMPLATE + "{% if add_generation_prompt %}{{- '<think>\\n' }}{% endif %}"
    with Fly(stories, n_ctx=512, chat_format=thinking) as f:
        out = f.create_chat_completion(CHAT, max_tokens=12, temperature=0)["choices"][0]
        assert out["message"]["reasoning_content"] and out["message"]["content"] == ""  # cut inside the block
        kept = f.create_chat_completion(CHAT, max_tokens=12, temperature=0, reasoning_format="none")["choices"][0]
        assert kept["message"]["content"] == out["message"]["reasoning_content"]
        assert "reasoning_content" not in kept["message"]
        deltas = [c["choices"][0]["delta"] for c in f.create_chat_completion(CHAT, max_tokens=12, temperature=0,
                                                                             stream=True)]
        assert "".join(d.get("reasoning_content", "") for d in deltas) == out["message"]["reasoning_content"]


def test_a_template_without_tool_calls_is_refused(stories):
    with Fly(stories, chat_format="chatml", n_ctx=256) as f:
        with pytest.raises(FlyError, match="no tool-call format"):
            f.create_chat_completion(CHAT, max_tokens=5, tools=TOOLS)


def test_real_qwen_tokenizer_forced_call_in_fly_mode(qwen35_pair):
    target, draft = qwen35_pair
    with Fly(target, draft, n_ctx=1024, chat_format=TEMPLATE) as f:
        for mode in ("fly", "target"):
            out = f.create_chat_completion(CHAT, max_tokens=60, temperature=0, mode=mode, tools=TOOLS,
                                           tool_choice={"type": "function", "function": {"name": "pet"}})
            assert calls(out)[0][0] == "pet"
