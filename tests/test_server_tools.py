"""Tool calls through the server: in process on the stories260K pair (a Hermes-style template
given), and a real ``fly-cpp serve`` process with the official ``openai`` client: request with
tools -> tool_calls -> a role:tool message -> a final answer, on the synthetic qwen35-tiny pair
(the real Qwen tokenizer) and, for each other format, on the stories260K pair under llama.cpp's
real Llama 3.x and Mistral templates. Bad tools are 400s with a JSON body."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import openai
import pytest
from fastapi.testclient import TestClient
from serving import Server

from fly_cpp import Fly
from fly_cpp.config import ServerSettings
from fly_cpp.server import create_app

TEMPLATE_FILE = Path(__file__).parent / "data" / "hermes-tools.jinja"
PET = {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}, "good": {"type": "boolean"}},
       "required": ["kind", "good"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "pet", "description": "adopt a pet", "parameters": PET}}]
CHAT = [{"role": "user", "content": "Adopt a pet for me."}]
NAMED = {"type": "function", "function": {"name": "pet"}}


@pytest.fixture(scope="module")
def client(stories, stories_draft):
    with Fly(stories, stories_draft, n_ctx=1024, chat_format=TEMPLATE_FILE.read_text()) as fly, \
            TestClient(create_app(fly, settings=ServerSettings(reasoning="off"))) as c:
        yield c


def post(client, status=200, **body):
    r = client.post("/v1/chat/completions", json={"messages": CHAT, **body})
    assert r.status_code == status, r.text
    return r.json()


def check_call(call):
    assert call["type"] == "function" and call["id"].startswith("call_") and call["function"]["name"] == "pet"
    args = json.loads(call["function"]["arguments"])
    jsonschema.validate(args, PET)
    return args


@pytest.mark.parametrize("mode", ["target", "spd", "fly"])
def test_forced_call_on_the_openai_endpoint(client, mode):
    out = post(client, tools=TOOLS, tool_choice="required", max_tokens=120, temperature=0, mode=mode)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    check_call(choice["message"]["tool_calls"][0])


def test_streamed_deltas_join_to_the_same_call(client):
    whole = post(client, tools=TOOLS, tool_choice=NAMED, max_tokens=120, temperature=0)["choices"][0]["message"]
    with client.stream("POST", "/v1/chat/completions", json={"messages": CHAT, "tools": TOOLS, "tool_choice": NAMED,
                                                            "max_tokens": 120, "temperature": 0, "stream": True}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    calls = [tc for e in events for tc in e["choices"][0]["delta"].get("tool_calls", [])]
    assert [check_call(c) for c in calls] == [json.loads(c["function"]["arguments"]) for c in whole["tool_calls"]]
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_none_and_template_variables(client):
    shown = client.post("/apply-template", json={"messages": CHAT, "tools": TOOLS}).json()["prompt"]
    hidden = client.post("/apply-template", json={"messages": CHAT, "tools": TOOLS, "tool_choice": "none"}).json()
    assert "<tools>" in shown and "<tools>" not in hidden["prompt"]
    out = post(client, tools=TOOLS, tool_choice="none", max_tokens=8, temperature=0)
    assert out["choices"][0]["finish_reason"] == "length" and "tool_calls" not in out["choices"][0]["message"]
    # --reasoning off: the template gets enable_thinking false (this one then closes an empty
    # block), unless the request's chat_template_kwargs say otherwise
    assert shown.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    on = client.post("/apply-template", json={"messages": CHAT, "chat_template_kwargs": {"enable_thinking": True}})
    assert on.json()["prompt"].endswith("<|im_start|>assistant\n")
    out = post(client, max_tokens=8, temperature=0)
    assert "<think>" not in out["choices"][0]["message"]["content"]


@pytest.mark.parametrize("body,says", [
    ({"tools": "pet"}, "tools"),
    ({"tools": [{"type": "function"}]}, "tools[0]"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "cat"}}}, "not among the tools"),
    ({"tool_choice": "required"}, "needs tools"),
    ({"tools": TOOLS, "grammar": 'root ::= "a"'}, "cannot be combined"),
    ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "cannot be combined"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"reasoning_format": "xml"}, "reasoning_format"),
    ({"chat_template_kwargs": {"enable_thinking": "no"}}, "enable_thinking"),
])
def test_bad_tools_are_400(client, body, says):
    out = post(client, status=400, max_tokens=4, **body)
    assert says in out["error"]["message"] and "\n" not in out["error"]["message"]


def test_openai_client_round_trip(qwen35_pair, tmp_path):
    target, draft = qwen35_pair
    server = Server(tmp_path, "-m", str(target), "-d", str(draft), "-t", "1", "-c", "2048", "--mode", "fly",
                    "--chat-template-file", str(TEMPLATE_FILE), "--temp", "0")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
        first = client.chat.completions.create(model="any", messages=CHAT, tools=TOOLS, tool_choice="required",
                                               max_tokens=60)
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        call = choice.message.tool_calls[0]
        jsonschema.validate(json.loads(call.function.arguments), PET)
        followed = [*CHAT, choice.message.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": call.id, "content": "adopted"}]
        final = client.chat.completions.create(model="any", messages=followed, tools=TOOLS, max_tokens=12)
        assert final.choices[0].message.content and final.choices[0].finish_reason in ("stop", "length")
        assert not final.choices[0].message.tool_calls
        stream = client.chat.completions.create(model="any", messages=CHAT, tools=TOOLS, tool_choice="required",
                                                max_tokens=60, stream=True)
        deltas = [tc for chunk in stream if chunk.choices for tc in (chunk.choices[0].delta.tool_calls or [])]
        assert [(d.function.name, d.function.arguments) for d in deltas] == [(call.function.name, call.function.arguments)]
    finally:
        assert server.stop() == 0, server.stderr()


def test_forced_call_on_the_anthropic_and_responses_endpoints(client):
    """The surfaces converted to a chat body read the answer as the chat endpoint does: a forced
    call comes back as Anthropic's tool_use block and as a Responses function_call item."""
    tool = {"name": "pet", "description": "adopt a pet", "input_schema": PET}
    r = client.post("/v1/messages", json={"messages": CHAT, "tools": [tool], "tool_choice": {"type": "any"},
                                          "max_tokens": 120, "temperature": 0})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["stop_reason"] == "tool_use"
    use = [b for b in out["content"] if b["type"] == "tool_use"]
    assert use and use[0]["name"] == "pet"
    jsonschema.validate(use[0]["input"], PET)
    r = client.post("/v1/responses", json={"input": CHAT[0]["content"], "tool_choice": "required",
                                           "tools": [{"type": "function", "name": "pet", "parameters": PET}],
                                           "max_output_tokens": 120, "temperature": 0})
    assert r.status_code == 200, r.text
    calls = [item for item in r.json()["output"] if item["type"] == "function_call"]
    assert calls and calls[0]["name"] == "pet"
    jsonschema.validate(json.loads(calls[0]["arguments"]), PET)


@pytest.mark.parametrize("template", ["meta-llama-Llama-3.2-3B-Instruct.jinja", "mistralai-Mistral-Nemo-Instruct-2407.jinja",
                                      "Mistral-Small-3.2-24B-Instruct-2506.jinja"])
def test_openai_client_round_trip_in_each_format(stories, stories_draft, llama_templates, template, tmp_path):
    server = Server(tmp_path, "-m", str(stories), "-d", str(stories_draft), "-t", "1", "-c", "2048", "--mode", "fly",
                    "--chat-template-file", str(llama_templates / template), "--temp", "0")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
        first = client.chat.completions.create(model="any", messages=CHAT, tools=TOOLS, tool_choice=NAMED,
                                               max_tokens=160)
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        call = choice.message.tool_calls[0]
        assert call.function.name == "pet"
        jsonschema.validate(json.loads(call.function.arguments), PET)
        followed = [*CHAT, choice.message.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": call.id, "content": "adopted"}]
        final = client.chat.completions.create(model="any", messages=followed, tools=TOOLS, tool_choice="none",
                                               max_tokens=12)
        assert final.choices[0].message.content and not final.choices[0].message.tool_calls
        stream = client.chat.completions.create(model="any", messages=CHAT, tools=TOOLS, tool_choice=NAMED,
                                                max_tokens=160, stream=True)
        deltas = [tc for chunk in stream if chunk.choices for tc in (chunk.choices[0].delta.tool_calls or [])]
        assert [(d.function.name, d.function.arguments) for d in deltas] == [(call.function.name,
                                                                              call.function.arguments)]
    finally:
        assert server.stop() == 0, server.stderr()
