"""OpenAI's Responses API and the token-counting endpoints on fly-cpp serve (in process, a real
tiny pair): the conversion of ``input``, whole and streamed responses, progress and timings."""

from __future__ import annotations


import pytest
from fastapi.testclient import TestClient
from serving import named_events

from fly_cpp import Fly
from fly_cpp.basics.errors import FlyError
from fly_cpp.server import create_app
from fly_cpp.server.responses import to_chat

INPUT = [{"role": "developer", "content": "You tell stories."},
         {"role": "user", "content": [{"type": "input_text", "text": "Once upon a time"}]}]


@pytest.fixture(scope="module")
def client(stories, stories_draft):
    with Fly(stories, stories_draft, n_ctx=256, temperature=0) as fly, TestClient(create_app(fly)) as c:  # greedy
        yield c


def test_conversion_to_a_chat_body():
    chat = to_chat({"instructions": "Be brief.", "max_output_tokens": 7, "temperature": 0.5, "input": [
        *INPUT,
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"}]})
    assert chat["messages"][:3] == [{"role": "system", "content": "Be brief."},
                                    {"role": "system", "content": "You tell stories."},
                                    {"role": "user", "content": "Once upon a time"}]
    assert chat["messages"][3]["tool_calls"][0]["function"] == {"name": "f", "arguments": "{}"}
    assert chat["messages"][4] == {"role": "tool", "tool_call_id": "c1", "content": "42"}
    assert chat["max_tokens"] == 7 and chat["temperature"] == 0.5 and "input" not in chat
    assert to_chat({"input": "hi"})["messages"] == [{"role": "user", "content": "hi"}]
    with pytest.raises(FlyError, match="'input' is required"):
        to_chat({})


def test_response(client):
    r = client.post("/v1/responses", json={"model": "x", "input": INPUT, "max_output_tokens": 8})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["id"].startswith("resp_") and out["object"] == "response" and out["status"] == "completed"
    item = out["output"][0]
    assert item["id"].startswith("msg_") and item["type"] == "message" and item["content"][0]["type"] == "output_text"
    assert out["usage"]["output_tokens"] == 8
    chat = client.post("/v1/chat/completions", json={"max_tokens": 8, "messages": [
        {"role": "system", "content": "You tell stories."}, {"role": "user", "content": "Once upon a time"}]}).json()
    assert item["content"][0]["text"] == chat["choices"][0]["message"]["content"]


def test_stream(client):
    body = {"input": "Once upon a time", "max_output_tokens": 8, "stream": True, "timings_per_token": True,
            "return_progress": True}
    events = named_events(client.post("/responses", json=body).text)
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    reports = [e["prompt_progress"] for e in events if "prompt_progress" in e]
    assert all(e["type"] == "response.in_progress" for e in events if "prompt_progress" in e)
    assert reports[0] == events[1]["prompt_progress"] and reports[0]["processed"] == reports[0]["cache"]
    assert reports[-1]["total"] > 0 and reports[-1]["processed"] == reports[-1]["total"]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and all("timings" in e for e in deltas)
    done = events[-1]
    assert "".join(e["delta"] for e in deltas) == done["response"]["output"][0]["content"][0]["text"]
    assert done["response"]["usage"]["output_tokens"] == 8 and "timings" in done
    whole = client.post("/responses", json={**body, "stream": False}).json()
    assert whole["output"][0]["content"][0]["text"] == done["response"]["output"][0]["content"][0]["text"]


def test_input_tokens(client):
    messages = [{"role": "user", "content": "Once upon a time"}]
    chat = client.post("/chat/completions/input_tokens", json={"messages": messages}).json()
    resp = client.post("/v1/responses/input_tokens", json={"input": "Once upon a time"}).json()
    msgs = client.post("/v1/messages/count_tokens", json={"messages": messages}).json()
    assert chat["input_tokens"] == resp["input_tokens"] == msgs["input_tokens"] > 0
    assert resp["object"] == "response.input_tokens"
    r = client.post("/v1/responses", json={"input": 5})
    assert r.status_code == 400 and "input" in r.json()["error"]["message"]
