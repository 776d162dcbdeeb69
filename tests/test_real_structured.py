"""Structured output and tool calls on the real pair (Qwen2.5-Coder 1.5B + 0.5B, marked
``real_pair``: skipped unless built, as in tests/test_real_pair.py), two threads:

- the fifty schemas of ``tests/schemas.py`` spread over fly, spd and target, greedy and sampled
  (each schema once, about eight per combination): every answer ends, parses and validates;
- a lower-case-words grammar holds in every mode; FLy's loose accepts under a grammar (a wide
  open gate) and under a schema are counted and every token is allowed where it stands;
- a tool call round trip with the official ``openai`` client on ``fly-cpp serve``: a request
  with tools -> ``tool_calls`` -> a ``role: tool`` message -> an answer in text. The first
  request forces the call (``required``): asked with ``auto``, Qwen2.5-Coder 1.5B writes its call
  as a fenced ```json block, not ``<tool_call>``, and that form is not read as a call; the last
  says ``none``: offered the tools again after the result, it repeats the call as plain JSON.
"""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest
from schemas import SCHEMAS
from serving import Server

from fly_cpp import Fly
from fly_cpp.backend.grammar import Grammar, json_schema_grammar

pytestmark = pytest.mark.real_pair

THREADS = 2
K = 6  # a fixed draft length: k auto would first calibrate the pair (a minute or more per session)
COMBOS = [(mode, temperature) for mode in ("fly", "spd", "target") for temperature in (0.0, 0.7)]
MAX_TOKENS = 120  # the longest answer here is about 60 tokens
WORDS = 'root ::= [a-z]+ (" " [a-z]+)*'
OPEN_GATE = {"mode": "fly", "k": K, "fly_rule": "paper", "loosen": "on", "entropy_threshold": 0.0, "window": 1,
             "loose_min_ratio": 0.0}  # FLy keeps nearly every mismatch the target is unsure of


@pytest.fixture(scope="module")
def fly(qwen_pair):
    with Fly(str(qwen_pair.target), str(qwen_pair.draft), n_ctx=1024, draft_n_ctx=1024, n_threads=THREADS,
             draft_n_threads=THREADS) as llm:
        yield llm


def asking(schema: dict) -> list[dict]:
    return [{"role": "user", "content": f"Make up a short example that matches this JSON schema, as JSON only: "
                                        f"{json.dumps(schema)}"}]


def obeys(fly: Fly, gbnf: str, tokens: list[int]) -> bool:
    """Whether the grammar allows each token in turn (a fresh state)."""
    g = Grammar(fly.engine.target_model, gbnf)
    try:
        for t in tokens:
            if not g.allows(t):
                return False
            g.accept(t)
        return True
    finally:
        g.close()


@pytest.mark.parametrize("combo", range(len(COMBOS)), ids=[f"{m}-t{t}" for m, t in COMBOS])
def test_fifty_schemas_parse_and_validate(fly, combo):
    mode, temperature = COMBOS[combo]
    for i in range(combo, len(SCHEMAS), len(COMBOS)):
        schema = SCHEMAS[i]
        out = fly.create_chat_completion(asking(schema), max_tokens=MAX_TOKENS, temperature=temperature, seed=i,
                                         mode=mode, k=K, response_format={"type": "json_schema", "json_schema": {
                                             "name": "example", "schema": schema, "strict": True}})
        choice = out["choices"][0]
        assert choice["finish_reason"] == "stop", (i, schema, choice)  # ended, not cut by max_tokens
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)


@pytest.mark.parametrize("combo", range(len(COMBOS)), ids=[f"{m}-t{t}" for m, t in COMBOS])
def test_words_grammar_holds_in_every_mode(fly, combo):
    mode, temperature = COMBOS[combo]
    gen = fly.generate_chat([{"role": "user", "content": "Describe a cat."}], max_tokens=16, grammar=WORDS,
                            mode=mode, k=K, temperature=temperature, seed=3)
    steps = list(gen)
    assert re.fullmatch(r"[a-z]+( [a-z]+)* ?", gen.text), gen.text  # " ?": a text cut by max_tokens
    assert obeys(fly, WORDS, [s.token for s in steps])


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_loose_accepts_under_a_grammar_are_counted_and_grammar_valid(fly, temperature):
    schema = SCHEMAS[48]  # people: an array of objects
    loose = 0
    for gbnf, settings in ((WORDS, {"grammar": WORDS}), (json_schema_grammar(json.dumps(schema)),
                                                        {"json_schema": json.dumps(schema)})):
        gen = fly.generate_chat(asking(schema) if "json_schema" in settings else
                                [{"role": "user", "content": "Tell me about the sea."}],
                                max_tokens=40 if "grammar" in settings else MAX_TOKENS, temperature=temperature,
                                seed=5, **OPEN_GATE, **settings)
        steps = list(gen)
        loose += sum(s.loose for s in steps)
        assert gen.stats.n_loose >= sum(s.loose for s in steps)  # every one emitted is counted
        assert obeys(fly, gbnf, [s.token for s in steps])  # each one, loose or not, allowed where it stands
        if "json_schema" in settings:
            assert gen.finish_reason == "stop", gen.text
            jsonschema.validate(json.loads(gen.text), schema)
    assert loose > 0  # the property was exercised


WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
           "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                           "parameters": WEATHER}}]


def test_openai_client_tool_call_round_trip(qwen_pair, tmp_path):
    server = Server(tmp_path, "-m", str(qwen_pair.target), "-d", str(qwen_pair.draft), "-t", str(THREADS),
                    "-td", str(THREADS), "-c", "2048", "--temp", "0", "--k", str(K))
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
        chat = [{"role": "user", "content": "What is the weather in Paris right now?"}]
        first = client.chat.completions.create(model="any", messages=chat, tools=TOOLS, tool_choice="required",
                                               max_tokens=60)
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        call = choice.message.tool_calls[0]
        assert call.type == "function" and call.function.name == "get_weather"
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, WEATHER)
        assert "paris" in args["city"].lower()
        chat += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}]
        # tools stay in the request, not in the prompt (none): offered them again after the result,
        # the 1.5B model writes the same call once more, as plain JSON
        final = client.chat.completions.create(model="any", messages=chat, tools=TOOLS, tool_choice="none",
                                               max_tokens=60)
        answer = final.choices[0]
        assert answer.finish_reason == "stop" and not answer.message.tool_calls, answer
        assert "18" in answer.message.content or "sunny" in answer.message.content.lower(), answer.message.content
    finally:
        assert server.stop() == 0, server.stderr()
