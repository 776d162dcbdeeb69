"""The server's app factory in process (FastAPI's TestClient) around a real tiny pair."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from fly_cpp import Fly
from fly_cpp.config import ServerSettings
from fly_cpp.server import create_app


@pytest.fixture(scope="module")
def fly(stories, stories_draft):
    # n_ubatch=1: batched verification equals one-token decoding, so greedy spd == target exactly
    with Fly(stories, stories_draft, n_ctx=256, n_ubatch=1, temperature=0) as llm:
        yield llm


@pytest.fixture(scope="module")
def client(fly):
    with TestClient(create_app(fly, api_key="k", settings=ServerSettings(metrics=True))) as c:
        c.headers["Authorization"] = "Bearer k"
        yield c


def complete(client, **body):
    r = client.post("/completion", json={"prompt": "Once upon a time", "n_predict": 24, **body})
    assert r.status_code == 200, r.text
    return r.json()


def sse(text: str) -> list[str]:
    """The data of each event; every event is one 'data: ' line followed by a blank line."""
    assert text.endswith("\n\n")
    events = text[:-2].split("\n\n")
    assert all(e.startswith("data: ") and "\n" not in e for e in events), text
    return [e[len("data: "):] for e in events]


def test_completion_fields_and_timings(client):
    out = complete(client, n_predict=20)
    assert out["content"] and out["stop"] is True and out["tokens_predicted"] == 20
    t = out["timings"]
    assert out["stop_type"] == "limit" and out["tokens_evaluated"] == t["prompt_n"] + t["cache_n"] > 0
    assert t["predicted_n"] == 20 and t["draft_n_accepted"] <= t["draft_n"] and 0 <= t["draft_n_loose"] <= t["draft_n_accepted"]
    assert out["fly"]["n_tokens"] == 20 and out["generation_settings"]["mode"] == "fly"


def test_per_request_spec_settings(client):
    target = complete(client, mode="target")
    spd = complete(client, mode="spd", k=4)
    assert target["timings"]["draft_n"] == 0 and spd["timings"]["draft_n"] > 0
    assert spd["content"] == target["content"]  # greedy exact-match speculation is lossless
    assert spd["generation_settings"]["k"] == 4
    paper = complete(client, mode="fly", fly_rule="paper", loose_min_ratio=0.9)
    assert paper["generation_settings"]["fly_rule"] == "paper"
    strict = complete(client, mode="fly", entropy_threshold="inf")
    assert strict["timings"]["draft_n_loose"] == 0 and strict["generation_settings"]["entropy_threshold"] == "inf"


def test_stop_word_and_eos_types(client):
    free = complete(client, mode="target", n_predict=40)["content"]
    word = free.split()[3]
    out = complete(client, mode="target", n_predict=40, stop=[word])
    assert out["stop_type"] == "word" and out["stopping_word"] == word
    assert out["content"] == free[: free.index(word)]


def test_n_probs_come_from_the_target(client):
    out = complete(client, mode="target", n_predict=8, n_probs=3)
    probs = out["completion_probabilities"]
    assert len(probs) == out["tokens_predicted"] == 8
    for entry in probs:
        tops = entry["top_logprobs"]
        assert len(tops) == 3 and [t["logprob"] for t in tops] == sorted((t["logprob"] for t in tops), reverse=True)
        assert tops[0]["id"] == entry["id"]  # greedy target-only: the top token is the one written
        assert entry["logprob"] <= 0 and bytes(entry["bytes"]).decode() == entry["token"]


def test_completion_stream_framing(client):
    whole = complete(client, mode="target")
    r = client.post("/completion", json={"prompt": "Once upon a time", "n_predict": 24, "mode": "target", "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(d) for d in sse(r.text)]
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == whole["content"]
    assert events[-1]["timings"]["predicted_n"] == 24


def test_openai_shapes(client):
    r = client.post("/v1/completions", json={"model": "any", "prompt": "Once upon a time", "max_tokens": 12})
    out = r.json()
    assert out["object"] == "text_completion" and out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 12 and out["choices"][0]["text"]
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12,
                                                  "stream": True, "mode": "spd"})
    events = sse(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["usage"]["completion_tokens"] == 12 and chunks[-1]["fly"]["mode"] == "spd"
    models = client.get("/v1/models").json()
    assert models["data"][0]["id"] == "stories260K.gguf"


def test_tokenize_roundtrip(client, fly):
    tokens = client.post("/tokenize", json={"content": "Once upon a time"}).json()["tokens"]
    assert tokens == fly.tokenize("Once upon a time", add_special=False)
    assert client.post("/detokenize", json={"tokens": tokens}).json()["content"].strip() == "Once upon a time"
    pieces = client.post("/tokenize", json={"content": "a cat", "with_pieces": True}).json()["tokens"]
    assert "".join(p["piece"] for p in pieces).strip() == "a cat"


def test_props_say_how_requests_are_served(client):
    props = client.get("/props").json()
    assert props["total_slots"] == 1 and "one generation at a time" in props["serving"]
    assert props["draft_model"] and props["n_ctx"] == 256
    assert {"mode", "k", "window", "entropy_threshold", "cross_round", "temperature"} <= set(props["per_request_settings"])


BAD = [
    ("/completion", b"{not json", "not valid JSON"),
    ("/completion", b"[1, 2]", "JSON object"),
    ("/completion", {"prompt": 5}, "prompt: expected"),
    ("/completion", {"n_predict": 4}, "missing field 'prompt'"),
    ("/completion", {"prompt": "a", "temperature": -0.5}, "temperature must be >= 0"),
    ("/completion", {"prompt": "a", "n_predict": -2}, "n_predict: Input should be greater than or equal to -1"),
    # JSON as Python reads it: NaN, Infinity and lone surrogate escapes are all accepted by the parser
    ("/completion", b'{"prompt": "a", "presence_penalty": NaN}', "presence_penalty must be a finite number"),
    ("/completion", b'{"prompt": "a", "frequency_penalty": -Infinity}', "frequency_penalty must be a finite number"),
    ("/completion", b'{"prompt": "a\\ud800b"}', "prompt: not valid Unicode"),
    ("/completion", b'{"prompt": "a", "stop": ["x", "\\udfff"]}', "stop.1: not valid Unicode"),
    ("/completion", {"prompt": "a", "logit_bias": [[1, "much"]]}, "logit_bias: the bias of 1 must be a number"),
    ("/completion", {"prompt": "a", "logit_bias": {"99999": 1}}, "logit_bias token 99999 is outside the vocabulary"),
    ("/completion", {"prompt": "a", "id_slot": 3}, "id_slot"),
    ("/completion", {"prompt": "a", "n_probs": 1000}, "n_probs"),
    ("/completion", {"prompt": "a", "k": "3"}, "k: "),
    ("/completion", {"prompt": "a", "k": -1}, "k must be >= 0"),
    ("/completion", {"prompt": "a", "mode": "fast"}, "mode must be one of"),
    ("/completion", {"prompt": "a", "fly_rule": "loose"}, "fly_rule must be one of"),
    ("/completion", {"prompt": "a", "loose_min_ratio": 1.5}, "loose_min_ratio must be in [0, 1]"),
    ("/completion", {"prompt": "once " * 400}, "longer than the context"),
    ("/completion", {"prompt": [1, 10**9]}, "outside the vocabulary"),
    ("/v1/completions", {"prompt": "a", "n": 17}, "n: "),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 2, "stream": True}, "n > 1"),
    ("/v1/chat/completions", {"messages": []}, "messages is empty"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "role must be one of"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud83d"}]}',
     "messages.0.content: not valid Unicode"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "needs logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"messages": 1}},
     "may not set 'messages'"),
    ("/detokenize", {"tokens": [-1]}, "outside the vocabulary"),
    ("/completion", b"", "the request has no body"),
    ("/v1/chat/completions", b"", "the request has no body"),
]


@pytest.mark.parametrize("path,body,message", BAD, ids=[m for _, _, m in BAD])
def test_bad_requests_are_400_with_an_openai_error(client, path, body, message):
    kwargs = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) else {"json": body}
    r = client.post(path, **kwargs)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    kind = "exceed_context_size_error" if "longer than the context" in message else "invalid_request_error"
    assert error["type"] == kind and error["code"] == 400 and message in error["message"]


def test_not_found_is_json(client):
    r = client.get("/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == 404


def test_api_key(fly):
    with TestClient(create_app(fly, api_key="secret")) as c:
        assert c.get("/health").status_code == 200
        r = c.get("/props")
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert c.get("/props", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/props", headers={"Authorization": "Bearer secret"}).status_code == 200
        assert c.get("/props", headers={"X-Api-Key": "secret"}).status_code == 200


def counters(client) -> dict[str, float]:
    lines = client.get("/metrics").text.splitlines()
    return {name: float(value) for name, value in (line.split() for line in lines if not line.startswith("#"))}


def test_metrics_move(client):
    before = counters(client)
    out = complete(client, n_predict=10)
    client.post("/completion", json={"prompt": "a", "top_k": -1})
    after = counters(client)
    assert after["fly_cpp_requests_total"] == before["fly_cpp_requests_total"] + 1
    assert after["fly_cpp_tokens_predicted_total"] == before["fly_cpp_tokens_predicted_total"] + 10
    assert after["fly_cpp_rounds_total"] == before["fly_cpp_rounds_total"] + out["fly"]["n_rounds"]
    accepted = out["timings"]["draft_n_accepted"]
    assert after["fly_cpp_accepted_total"] == before["fly_cpp_accepted_total"] + accepted
    assert after["fly_cpp_errors_total"] == before["fly_cpp_errors_total"] + 1
    assert "fly_cpp_loosely_accepted_total" in after and "fly_cpp_requests_deferred" in after


def test_json_body_without_json_content_type(client):
    """`curl -d '{...}'` sends a form content type; like llama-server, the body is read as JSON."""
    r = client.post("/completion", content=b'{"prompt": "Once upon a time", "n_predict": 5}',
                    headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 5
    bad = client.post("/completion", content=b'{"prompt": "a", "temperature": -1}',
                      headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert bad.status_code == 400 and "temperature must be >= 0" in bad.json()["error"]["message"]
