"""Anthropic's Messages API on fly-cpp serve (in process, a real tiny pair): the conversion to a
chat body, whole and streamed messages, stop sequences, usage, token counting, refusals."""

from __future__ import annotations


import pytest
from fastapi.testclient import TestClient
from serving import named_events

from fly_cpp import Fly
from fly_cpp.basics.errors import FlyError
from fly_cpp.server import create_app
from fly_cpp.server.anthropic import to_chat

USER = [{"role": "user", "content": "Once upon a time"}]


@pytest.fixture(scope="module")
def client(stories, stories_draft):
    with Fly(stories, stories_draft, n_ctx=256, temperature=0) as fly, TestClient(create_app(fly)) as c:  # greedy
        yield c


def test_conversion_to_a_chat_body():
    chat = to_chat({"system": [{"type": "text", "text": "Be brief."}], "stop_sequences": ["END"], "top_k": 5,
                    "messages": [
                        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"},
                                                          {"type": "tool_use", "id": "t1", "name": "f",
                                                           "input": {"a": 1}}]},
                        {"role": "user", "content": [{"type": "text", "text": "ok"},
                                                     {"type": "tool_result", "tool_use_id": "t1",
                                                      "content": [{"type": "text", "text": "42"}]}]}],
                    "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}]})
    assert chat["messages"][0] == {"role": "system", "content": "Be brief."}
    assistant = chat["messages"][2]
    assert assistant["content"] == "" and assistant["reasoning_content"] == "hm"
    assert assistant["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert chat["messages"][3:] == [{"role": "user", "content": [{"type": "text", "text": "ok"}]},
                                    {"role": "tool", "tool_call_id": "t1", "content": "42"}]
    assert chat["tools"][0]["function"]["parameters"] == {"type": "object"}
    assert chat["stop"] == ["END"] and chat["top_k"] == 5 and chat["max_tokens"] == 4096
    assert to_chat({"messages": []})["messages"] == [{"role": "user", "content": ""}]
    with pytest.raises(FlyError, match="'messages' is required"):
        to_chat({"max_tokens": 5})


def test_message_and_usage(client):
    r = client.post("/v1/messages", json={"model": "x", "max_tokens": 8, "system": "You tell stories.",
                                          "messages": USER, "metadata": {"user_id": "u"}})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["type"] == "message" and out["role"] == "assistant" and out["id"].startswith("msg_")
    assert out["content"][0]["type"] == "text" and out["stop_reason"] in ("end_turn", "max_tokens")
    usage = out["usage"]
    assert usage["output_tokens"] > 0 and usage["input_tokens"] + usage["cache_read_input_tokens"] > 0
    assert "timings" not in out and "choices" not in out
    # the same greedy request through the chat endpoint says the same
    chat = client.post("/v1/chat/completions", json={"max_tokens": 8, "messages": [
        {"role": "system", "content": "You tell stories."}, *USER]}).json()
    assert out["content"][0]["text"] == chat["choices"][0]["message"]["content"]


def test_stop_sequences(client):
    whole = client.post("/v1/messages", json={"max_tokens": 30, "messages": USER}).json()["content"][0]["text"]
    word = whole.split()[2]
    out = client.post("/v1/messages", json={"max_tokens": 30, "messages": USER, "stop_sequences": [word]}).json()
    assert out["stop_reason"] == "end_turn" and out["stop_sequence"] == word
    assert word not in out["content"][0]["text"]


def test_stream_events(client):
    r = client.post("/v1/messages", json={"max_tokens": 10, "messages": USER, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = named_events(r.text)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[1] == "content_block_start"
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert events[0]["message"]["content"] == [] and events[0]["message"]["usage"]["output_tokens"] == 0
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    whole = client.post("/v1/messages", json={"max_tokens": 10, "messages": USER}).json()
    assert text == whole["content"][0]["text"]
    assert events[-2]["usage"]["output_tokens"] == whole["usage"]["output_tokens"]
    assert all("timings" not in e for e in events)


def test_count_tokens(client):
    plain = client.post("/v1/messages/count_tokens", json={"messages": USER})
    assert plain.status_code == 200 and set(plain.json()) == {"input_tokens"}
    system = client.post("/v1/messages/count_tokens", json={"system": "Be brief.", "messages": USER}).json()
    assert system["input_tokens"] > plain.json()["input_tokens"] > 0
    out = client.post("/v1/messages", json={"max_tokens": 1, "messages": USER}).json()["usage"]
    assert out["input_tokens"] + out["cache_read_input_tokens"] == plain.json()["input_tokens"]


def test_refusals(client):
    r = client.post("/v1/messages", json={"max_tokens": 5})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    r = client.post("/v1/messages", json={"max_tokens": "five", "messages": USER})
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    r = client.post("/v1/messages", json={"max_tokens": 5, "messages": [{"role": "user", "content": [image]}]})
    assert r.status_code == 500 and "image input is not supported" in r.json()["error"]["message"]
    assert client.post("/v1/messages", json={"max_tokens": 5, "messages": []}).status_code == 200
