"""The tool-call formats (fly_cpp.api.tool_formats): each read back from the text a model writes
(whole and as streamed deltas), each recognised from llama.cpp's real chat templates, and each
driving real generations on the bundled stories260K model under its template: a forced call
in every mode validates against its schema, and the call and its result render back through
the template."""

from __future__ import annotations

import json

import jsonschema
import pytest
from fastapi.testclient import TestClient

from fly_cpp import Fly, FlyError
from fly_cpp.api import tools as tool_calls
from fly_cpp.backend.grammar import Grammar
from fly_cpp.rounds.constrain import Lazy
from fly_cpp.api.reply import Options, Splitter, split
from fly_cpp.server import create_app
from fly_cpp.api.tool_formats import FORMATS, detect

BY_NAME = {f.name: f for f in FORMATS}
ARGS = {"kind": "cat", "good": True}
WRITTEN = {  # format -> a call to pet as the model writes it, and the id it names (if any)
    "hermes": ('<tool_call>\n{"name": "pet", "arguments": {"kind": "cat", "good": true}}\n</tool_call>', None),
    "llama-3": ('{"name": "pet", "parameters": {"kind": "cat", "good": true}}', None),
    "mistral-nemo": ('[TOOL_CALLS][{"name": "pet", "arguments": {"kind": "cat", "good": true}, "id": "a1b2c3d4e"}]',
                     "a1b2c3d4e"),
    "mistral-small": ('[TOOL_CALLS]pet[CALL_ID]a1b2c3d4e[ARGS]{"kind": "cat", "good": true}', "a1b2c3d4e"),
    "mistral": ('[TOOL_CALLS]pet[ARGS]{"kind": "cat", "good": true}', None),
}
TEMPLATES = {  # llama.cpp's template file -> the format fly-cpp reads its calls in
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama-3",
    "meta-llama-Llama-3.2-3B-Instruct.jinja": "llama-3",
    "meta-llama-Llama-3.3-70B-Instruct.jinja": "llama-3",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "mistral-nemo",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": "mistral-small",
    "unsloth-mistral-Devstral-Small-2507.jinja": "mistral",
    "Qwen-Qwen2.5-7B-Instruct.jinja": "hermes",
    "Qwen-Qwen3-0.6B.jinja": "hermes",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "hermes",
    "google-gemma-2-2b-it.jinja": None,
}
PET = {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}, "good": {"type": "boolean"}},
       "required": ["kind", "good"], "additionalProperties": False}
DAY = {"type": "object", "properties": {"day": {"type": "integer", "minimum": 1, "maximum": 31}}, "required": ["day"]}
TOOLS = [{"type": "function", "function": {"name": "pet", "description": "adopt a pet", "parameters": PET}},
         {"type": "function", "function": {"name": "day", "parameters": DAY}}]
SCHEMAS = {"pet": PET, "day": DAY}
CHAT = [{"role": "user", "content": "Adopt a pet for me."}]
REAL = ["meta-llama-Llama-3.1-8B-Instruct.jinja", "meta-llama-Llama-3.2-3B-Instruct.jinja",
        "mistralai-Mistral-Nemo-Instruct-2407.jinja", "Mistral-Small-3.2-24B-Instruct-2506.jinja",
        "Qwen-Qwen2.5-7B-Instruct.jinja"]


def opts(name: str) -> Options:
    return Options(calls=BY_NAME[name], names=("pet", "day"))


@pytest.mark.parametrize("name", sorted(WRITTEN))
def test_a_written_call_is_read_with_its_id(name):
    text, ident = WRITTEN[name]
    got = split(text, opts(name))
    assert got.content == "" and len(got.calls) == 1
    call = got.calls[0]
    assert call["function"]["name"] == "pet" and json.loads(call["function"]["arguments"]) == ARGS
    if ident:
        assert call["id"] == ident
    elif BY_NAME[name].short_ids:
        assert len(call["id"]) == 9 and call["id"].isalnum()
    else:
        assert call["id"].startswith("call_")
    assert split(text, Options()).calls == []  # no tools given: nothing read
    before = split("Sure, adopting one. " + text, opts(name))
    assert before.content == "Sure, adopting one." and len(before.calls) == 1


def test_llama_3_reads_the_python_tag_and_mistral_parallel_calls():
    got = split('<|python_tag|>{"name": "day", "parameters": {"day": 3}}', opts("llama-3"))
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in got.calls] == [("day", '{"day": 3}')]
    two = WRITTEN["mistral-small"][0] + '[TOOL_CALLS]day[CALL_ID]zzzzzzzz9[ARGS]{"day": 4}'
    assert [c["id"] for c in split(two, opts("mistral-small")).calls] == ["a1b2c3d4e", "zzzzzzzz9"]
    nemo = '[TOOL_CALLS][{"name": "pet", "arguments": {}, "id": "x"}, {"name": "day", "arguments": {"day": 4}}]'
    calls = split(nemo, opts("mistral-nemo")).calls
    assert [c["function"]["name"] for c in calls] == ["pet", "day"]
    assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in calls)  # "x" is no Mistral id: a new one


@pytest.mark.parametrize("text", ['[TOOL_CALLS]not a call', '[TOOL_CALLS][{"nam": 1}]', '{"name": 3}'])
def test_text_that_is_no_call_stays_content(text):
    for name in ("mistral-nemo", "mistral", "llama-3"):
        assert split(text, opts(name)).content == text


def test_a_fenced_json_call_is_read_when_it_is_the_whole_answer():
    fenced = '```json\n{"name": "pet", "arguments": {"kind": "cat", "good": true}}\n```'
    got = split(fenced, opts("hermes"))
    assert got.content == "" and json.loads(got.calls[0]["function"]["arguments"]) == ARGS
    assert split("Here: " + fenced, opts("hermes")).calls == []  # not the whole answer
    assert split(fenced.replace("pet", "cow"), opts("hermes")).calls == []  # not a given function
    assert split(fenced, Options(calls=BY_NAME["hermes"])).calls == []


@pytest.mark.parametrize("name,text", [
    *[(n, "Let me call it. " + t) for n, (t, _) in WRITTEN.items()],
    ("hermes", '```json\n{"name": "pet", "arguments": {}}\n```'),
    ("hermes", "```json\n[1, 2]\n```"),
    ("mistral", "A [TOOL_CALL is not [TOOL_CALLS"),
    ("llama-3", 'Say {"nam": 1} or {"name'),
])
def test_streamed_deltas_join_to_the_whole_split(name, text):
    for size in (1, 4):
        s = Splitter(opts(name))
        content = "".join(s.feed(text[i:i + size]).get("content", "") for i in range(0, len(text), size))
        last, whole = s.finish()
        want = split(text, opts(name))
        assert content + last.get("content", "") == want.content
        assert [c["function"] for c in whole.calls] == [c["function"] for c in want.calls]


def test_ids_map_to_what_mistral_templates_accept():
    nemo = BY_NAME["mistral-nemo"]
    mapped = nemo.message_id("call_0123456789abcdef")
    assert len(mapped) == 9 and mapped.isalnum() and mapped == nemo.message_id("call_0123456789abcdef")
    assert nemo.message_id("a1b2c3d4e") == "a1b2c3d4e" and BY_NAME["hermes"].message_id("call_1") == "call_1"


def test_each_format_is_recognised_in_llamas_templates(llama_templates):
    for file, name in TEMPLATES.items():
        found = detect((llama_templates / file).read_text())
        assert (found.name if found else None) == name, file


def test_an_unknown_template_is_refused_with_the_formats_named(stories, llama_templates):
    with Fly(stories, n_ctx=512, chat_format=(llama_templates / "google-gemma-2-2b-it.jinja").read_text()) as f:
        with pytest.raises(FlyError, match="no tool-call format fly-cpp knows .*Mistral"):
            f.create_chat_completion(CHAT, max_tokens=4, tools=TOOLS)


@pytest.fixture(scope="module", params=REAL)
def fly(request, stories, stories_draft, llama_templates):
    with Fly(stories, stories_draft, n_ctx=2048, chat_format=(llama_templates / request.param).read_text()) as f:
        yield f


def calls(out, finish="tool_calls"):
    choice = out["choices"][0]
    assert choice["finish_reason"] == finish, choice
    got = choice["message"]["tool_calls"]
    for c in got:
        jsonschema.validate(json.loads(c["function"]["arguments"]), SCHEMAS[c["function"]["name"]])
    return got


@pytest.mark.parametrize("mode", ["target", "spd", "fly"])
def test_forced_calls_in_every_mode_validate(fly, mode):
    fmt = detect(fly.chat_format.template)
    for choice in ("required", {"type": "function", "function": {"name": "day"}}):
        for temperature in (0, 0.9):
            got = calls(fly.create_chat_completion(CHAT, max_tokens=150, temperature=temperature, seed=5, mode=mode,
                                                   tools=TOOLS, tool_choice=choice))
            assert len(got) == 1
            assert isinstance(choice, str) or got[0]["function"]["name"] == "day"
            assert (len(got[0]["id"]) == 9) == fmt.short_ids


def test_the_call_and_its_result_render_back_through_the_template(fly):
    fmt = detect(fly.chat_format.template)
    msg = calls(fly.create_chat_completion(CHAT, max_tokens=150, temperature=0, tools=TOOLS,
                                           tool_choice="required"))
    call = msg[0]
    followed = [*CHAT, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "content": "adopted"}]
    text = fly.detokenize(fly.chat_turn(followed, tools=TOOLS)[0])
    assert "adopted" in text and call["function"]["name"] in text
    if fmt.short_ids:
        assert text.count(call["id"]) >= 2  # Mistral's templates name the id in the call and the result
    # an id from another format's conversation is mapped, not refused
    other = json.loads(json.dumps(followed).replace(call["id"], "call_abcdefabcdefabcdef"))
    assert "adopted" in fly.detokenize(fly.chat_turn(other, tools=TOOLS)[0])
    out = fly.create_chat_completion(followed, max_tokens=10, temperature=0, tools=TOOLS, tool_choice="none")
    assert out["choices"][0]["message"]["content"]


def test_parallel_calls_where_the_format_allows_them(fly):
    fmt = detect(fly.chat_format.template)
    out = fly.create_chat_completion(CHAT, max_tokens=250, temperature=0, tools=TOOLS, tool_choice="required",
                                     parallel_tool_calls=True)
    if fmt.parallel and fmt.name != "mistral-nemo":  # a cut-off list of calls reads as none
        assert len(calls(out, "length")) >= 2
    elif not fmt.parallel:
        assert len(calls(out)) == 1  # Llama 3.x templates render one call a turn


def test_auto_starts_the_grammar_at_the_formats_trigger(fly):
    fmt = detect(fly.chat_format.template)
    model = fly.engine.target_model
    gbnf, trigger = tool_calls.grammar(tool_calls.check(TOOLS, "auto"), False, fmt)
    assert trigger == fmt.trigger
    lazy = Lazy(Grammar(model, gbnf), trigger, model.tokenize)
    written = WRITTEN[fmt.name][0]
    for t in model.tokenize("Well. " + written[: written.index("pet") + 2], add_special=False):
        assert lazy.allows(t)
        lazy.accept(t)
    assert lazy.on
    ok, bad = (next(i for i in range(model.n_vocab) if model.piece(i) == s) for s in (b"t", b"x"))
    assert lazy.allows(ok) and not lazy.allows(bad)  # "pet" goes on, "pex" names no function
    out = fly.create_chat_completion(CHAT, max_tokens=20, temperature=0, tools=TOOLS)
    assert out["choices"][0]["message"]["content"]  # the story model writes no call: free text


def test_a_calls_special_tokens_reach_the_text(llama3_target):
    """In real vocabularies a call's marks are special tokens ([TOOL_CALLS] in Mistral's,
    <|python_tag|> in Llama 3's), which the grammar takes for their text but which render as
    nothing: the format's preserved tokens are written out, so the call can be read. A special
    token of the Llama 3 vocabulary stands in for them here (the bias makes the model pick it)."""
    with Fly(llama3_target, n_ctx=256) as f:
        mark = "<|start_header_id|>"
        [tag] = f.tokenize(mark, add_special=False, parse_special=True)
        kw = {"max_tokens": 4, "temperature": 0, "mode": "target", "logit_bias": ((tag, 100.0),)}
        hidden = f.generate("hi", grammar=f'root ::= {json.dumps(mark)} "ok"', **kw).run()
        assert hidden.tokens[0] == tag and hidden.text == "ok"
        kept = f.generate("hi", grammar=f'root ::= {json.dumps(mark)} "ok"', preserved_tokens=(mark,), **kw).run()
        assert kept.tokens[0] == tag and kept.text == mark + "ok"
        lazy = f.generate("hi", grammar='root ::= "ok"', grammar_trigger=mark, preserved_tokens=(mark,), **kw).run()
        assert lazy.text == mark + "ok"  # the special token wrote the trigger
        with TestClient(create_app(f)) as client:  # llama-server's field, a JSON list
            r = client.post("/completion", json={"prompt": "hi", "n_predict": 4, "temperature": 0, "mode": "target",
                                                 "grammar": f'root ::= {json.dumps(mark)} "ok"',
                                                 "logit_bias": [[tag, 100]], "preserved_tokens": [mark]})
            assert r.status_code == 200 and r.json()["content"] == mark + "ok", r.text
    assert all(t in BY_NAME["mistral-small"].preserved for t in ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"))
