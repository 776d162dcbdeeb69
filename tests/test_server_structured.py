"""Structured output through the server (in process, real stories260K pair): grammar and
json_schema on /completion, response_format on the OpenAI endpoints; bad ones are 400s."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from fastapi.testclient import TestClient

from fly_cpp import Fly
from fly_cpp.server import create_app

WORDS = 'root ::= [a-z]+ (" " [a-z]+)*'
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "pet": {"enum": ["cat", "dog"]}},
          "required": ["name", "pet"], "additionalProperties": False}
CHAT = [{"role": "user", "content": "Tell me about a pet."}]


@pytest.fixture(scope="module")
def client(stories, stories_draft):
    with Fly(stories, stories_draft, n_ctx=512) as fly, TestClient(create_app(fly)) as c:
        yield c


def post(client, path, status=200, **body):
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    return r.json()


@pytest.mark.parametrize("mode", ["fly", "spd", "target"])
def test_completion_grammar_and_json_schema(client, mode):
    out = post(client, "/completion", prompt="Once upon a time", n_predict=30, grammar=WORDS, mode=mode)
    # a text the token limit cuts may end inside the grammar: after a word's space (sampled by
    # default, with a fresh seed each time, so now and then it does)
    assert re.fullmatch(r"[a-z]+( [a-z]+)* ?", out["content"]), out["content"]
    out = post(client, "/completion", prompt="Once upon a time", n_predict=200, json_schema=SCHEMA, mode=mode)
    jsonschema.validate(json.loads(out["content"]), SCHEMA)


def test_openai_response_format(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA, "strict": True}}
    out = post(client, "/v1/chat/completions", messages=CHAT, max_tokens=200, response_format=fmt)
    jsonschema.validate(json.loads(out["choices"][0]["message"]["content"]), SCHEMA)
    out = post(client, "/v1/completions", prompt="Once upon a time", max_tokens=200, response_format=fmt, temperature=0.8,
               seed=4)
    jsonschema.validate(json.loads(out["choices"][0]["text"]), SCHEMA)
    out = post(client, "/v1/chat/completions", messages=CHAT, max_tokens=20, response_format={"type": "json_object"})
    assert out["choices"][0]["message"]["content"].startswith("{")
    out = post(client, "/v1/chat/completions", messages=CHAT, max_tokens=8, response_format={"type": "text"})
    assert out["choices"][0]["message"]["content"]


@pytest.mark.parametrize("path,body,says", [
    ("/completion", {"prompt": "a", "grammar": "root ::= ("}, "invalid grammar"),
    ("/completion", {"prompt": "a", "json_schema": "{bad"}, "invalid JSON schema"),
    ("/completion", {"prompt": "a", "grammar": WORDS, "json_schema": SCHEMA}, "not both"),
    ("/v1/chat/completions", {"messages": CHAT, "response_format": {"type": "yaml"}}, "response_format"),
    ("/v1/chat/completions", {"messages": CHAT, "response_format": {"type": "json_schema"}}, "json_schema.schema"),
])
def test_bad_constraints_are_400(client, path, body, says):
    out = post(client, path, 400, **body)
    assert says in out["error"]["message"] and "\n" not in out["error"]["message"]


def test_python_api(stories, stories_draft):
    with Fly(stories, stories_draft, n_ctx=512) as fly:
        out = fly.create_completion("Once upon a time", max_tokens=30, grammar=WORDS)
        assert re.fullmatch(r"[a-z]+( [a-z]+)* ?", out["choices"][0]["text"])  # sampled: may stop after a space
        fmt = {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA}}
        out = fly.create_chat_completion(CHAT, max_tokens=200, response_format=fmt, temperature=0.7, seed=1)
        jsonschema.validate(json.loads(out["choices"][0]["message"]["content"]), SCHEMA)
        out = fly.create_completion("Once upon a time", max_tokens=200, json_schema=json.dumps(SCHEMA), mode="spd")
        jsonschema.validate(json.loads(out["choices"][0]["text"]), SCHEMA)


def test_streamed_answer_obeys_the_schema(client):
    r = client.post("/completion", json={"prompt": "Once upon a time", "n_predict": 200, "json_schema": SCHEMA,
                                         "stream": True, "temperature": 0.8, "seed": 2})
    assert r.status_code == 200
    events = [json.loads(e[len("data: "):]) for e in r.text.strip().split("\n\n") if e.startswith("data: {")]
    jsonschema.validate(json.loads("".join(e.get("content", "") for e in events)), SCHEMA)
