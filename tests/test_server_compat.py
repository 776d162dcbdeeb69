"""What llama-server and OpenAI clients expect of fly-cpp serve (in process, FastAPI's
TestClient around a real tiny pair): unknown fields, the fields fly-cpp honours, timings,
/health while loading, CORS, llama-server's metrics."""

from __future__ import annotations

import json
import logging
import math
import threading

import pytest
from fastapi.testclient import TestClient

from fly_cpp import Fly
from fly_cpp.config import ServerSettings
from fly_cpp.server import create_app

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def fly(stories, stories_draft):
    # n_ubatch=1: batched verification equals one-token decoding (probabilities comparable exactly);
    # greedy unless a request says otherwise (a sampled answer may keep nothing loosely, or end early)
    with Fly(stories, stories_draft, n_ctx=256, n_ubatch=1, temperature=0) as llm:
        yield llm


@pytest.fixture(scope="module")
def client(fly):
    with TestClient(create_app(fly, settings=ServerSettings(metrics=True))) as c:
        yield c


def sse(text: str) -> list[str]:
    return [e[len("data: "):] for e in text[:-2].split("\n\n")]


def completion(client, **body):
    r = client.post("/completion", json={"prompt": PROMPT, "n_predict": 16, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_unknown_fields_are_ignored_and_logged_once(client, caplog):
    caplog.set_level(logging.WARNING, "fly_cpp.server")
    for _ in range(3):
        out = completion(client, no_such_field=1, mirostat=2, typical_p=1.0, dry_multiplier=0)
        assert out["tokens_predicted"] == 16
    notes = [r.getMessage() for r in caplog.records if r.name == "fly_cpp.server"]
    assert sum("'no_such_field'" in n for n in notes) == 1 and sum("'mirostat'" in n for n in notes) == 1
    assert not any("typical_p" in n or "dry_multiplier" in n for n in notes)  # neutral values change nothing
    props = client.get("/props").json()
    assert {"no_such_field", "mirostat"} <= set(props["ignored_fields_seen"]) and "typical_p" in props["ignored_fields"]


def test_wrong_types_of_known_fields_still_fail(client):
    r = client.post("/completion", json={"prompt": PROMPT, "cache_prompt": "yes"})
    assert r.status_code == 400 and "cache_prompt" in r.json()["error"]["message"]


def test_strict_refuses_unused_fields(fly):
    with TestClient(create_app(fly, settings=ServerSettings(strict=True))) as c:
        r = c.post("/completion", json={"prompt": PROMPT, "bogus": 1})
        assert r.status_code == 400 and "unknown field 'bogus'" in r.json()["error"]["message"]
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "tools": [{"x": 1}]})
        assert r.status_code == 400 and "tools[0] must be" in r.json()["error"]["message"]  # checked, not ignored
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "functions": [{}]})
        assert r.status_code == 400 and "field 'functions' is not supported" in r.json()["error"]["message"]
        # honoured and neutral fields are fine under --strict too
        ok = c.post("/completion", json={"prompt": PROMPT, "n_predict": 4, "cache_prompt": True, "mirostat": 0})
        assert ok.status_code == 200


def test_max_tokens_is_n_predict_on_completion(client):
    assert completion(client, n_predict=None, max_tokens=5)["tokens_predicted"] == 5
    assert completion(client, n_predict=7, max_tokens=5)["tokens_predicted"] == 7  # n_predict wins, as there


def test_cache_prompt_off_gives_the_same_text(client):
    warm = completion(client, mode="target", temperature=0)  # greedy: the same text, cached or not
    cold = completion(client, mode="target", temperature=0, cache_prompt=False)
    assert cold["content"] == warm["content"] and cold["timings"]["cache_n"] == 0


def test_return_tokens(client, fly):
    out = completion(client, return_tokens=True, mode="target")
    assert len(out["tokens"]) == 16 and fly.detokenize(out["tokens"]) == out["content"]
    assert completion(client)["tokens"] == []


def test_logit_bias_reaches_target_and_draft(client, fly):
    free = completion(client, mode="fly", return_tokens=True)
    first = free["tokens"][0]
    for bias in ([[first, False]], {str(first): -100}, [[first, "-inf"]]):
        out = completion(client, mode="fly", return_tokens=True, logit_bias=bias)
        assert first not in out["tokens"] and out["generation_settings"]["logit_bias"]
    piece = fly.detokenize([first])
    out = completion(client, mode="spd", return_tokens=True, logit_bias=[[piece, False]])  # by text, as llama-server
    assert first not in out["tokens"]


def test_ignore_eos(client, fly, period_is_eos):
    with Fly(period_is_eos, n_ctx=256) as eos_fly, TestClient(create_app(eos_fly)) as c:
        ends = c.post("/completion", json={"prompt": PROMPT, "n_predict": 200, "mode": "target"}).json()
        assert ends["stop_type"] == "eos" and ends["tokens_predicted"] < 200
        on = c.post("/completion", json={"prompt": PROMPT, "n_predict": 60, "mode": "target", "ignore_eos": True}).json()
        assert on["stop_type"] == "limit" and on["tokens_predicted"] == 60


def test_n_keep_truncates_like_llama_server(client):
    long = " ".join(["the cat sat on the mat"] * 80)  # far more than n_ctx=256 tokens
    refused = client.post("/completion", json={"prompt": long, "n_predict": 4})
    assert refused.status_code == 400 and "longer than the context" in refused.json()["error"]["message"]
    out = completion(client, prompt=long, n_predict=4, n_keep=8)
    assert out["truncated"] is True and out["tokens_evaluated"] < 256 and out["tokens_predicted"] == 4


def test_n_probs_stream_per_token(client):
    r = client.post("/completion", json={"prompt": PROMPT, "n_predict": 12, "n_probs": 3, "stream": True, "mode": "target",
                                         "temperature": 0})
    events = [json.loads(e) for e in sse(r.text)]
    per_token = [p for e in events[:-1] for p in e["completion_probabilities"]]
    assert len(per_token) + len(events[-1].get("completion_probabilities", [])) == 12
    assert all(len(e["completion_probabilities"]) >= 1 for e in events[:-1])  # every event carries its own
    whole = completion(client, n_predict=12, n_probs=3, mode="target", temperature=0)["completion_probabilities"]
    assert [p["id"] for p in per_token] == [p["id"] for p in whole][: len(per_token)]
    assert all(p["top_logprobs"][0]["id"] == p["id"] for p in whole)  # greedy target: the top token is written


def test_probabilities_match_the_teacher_forced_pass(fly):
    gen = fly.generate(PROMPT, max_tokens=120, n_probs=4, window=1, entropy_threshold=0.0, k=8)
    steps = list(gen)
    score = fly.engine.score(gen.prompt, gen.tokens, top_n=4)
    assert gen.stats.n_loose > 0  # loosely accepted tokens are scored too
    for step, logprob, ids in zip(steps, score.logprobs, score.top_ids):
        assert step.probs is not None and math.isclose(step.probs.logprob, float(logprob), abs_tol=1e-4)
        assert [t for t, _ in step.probs.top] == list(ids)


def test_openai_logprobs(client):
    chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6,
                                                     "logprobs": True, "top_logprobs": 2}).json()
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == 6 and all(len(c["top_logprobs"]) == 2 and c["logprob"] <= 0 for c in content)
    text = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 5, "logprobs": 3}).json()
    lp = text["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 5
    assert "".join(lp["tokens"]) == text["choices"][0]["text"] and lp["text_offset"][0] == 0
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6,
                                                  "logprobs": True, "stream": True})
    chunks = [json.loads(e) for e in sse(r.text)[:-1]]
    streamed = [c for ch in chunks for c in ((ch["choices"][0].get("logprobs") or {}).get("content") or [])]
    assert len(streamed) == 6


def test_timings_on_every_endpoint(client):
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}
    for path, body in (("/completion", {"prompt": PROMPT, "n_predict": 5}), ("/v1/completions", {"prompt": PROMPT, "max_tokens": 5}),
                       ("/v1/chat/completions", chat)):
        whole = client.post(path, json=body).json()
        assert whole["timings"]["predicted_n"] == 5 and "draft_n_accepted" in whole["timings"]
        events = sse(client.post(path, json={**body, "stream": True}).text)
        last = json.loads(events[-2] if events[-1] == "[DONE]" else events[-1])
        assert last["timings"]["predicted_n"] == 5
        assert isinstance(last["timings"]["draft_n_loose"], int) and last["timings"]["draft_n_loose"] <= \
            last["timings"]["draft_n_accepted"] <= last["timings"]["draft_n"]
    every = sse(client.post("/v1/chat/completions", json={**chat, "stream": True, "timings_per_token": True}).text)
    assert all("timings" in json.loads(e) for e in every[1:-1])  # not the role chunk (before the prompt), as llama-server


def test_chunks_say_how_each_token_was_accepted(client):
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "A story"}], "max_tokens": 30,
                                                  "stream": True, "window": 1, "entropy_threshold": 0, "k": 8})
    flags = [c["fly_token"] for c in (json.loads(e) for e in sse(r.text)[:-1]) if "fly_token" in c]
    assert flags and any(f["drafted"] for f in flags) and any(f["loose"] for f in flags)


def counters(client) -> dict[str, float]:
    lines = client.get("/metrics").text.splitlines()
    return {name: float(value) for name, value in (line.split() for line in lines if not line.startswith("#"))}


def test_llamacpp_metrics_move(client):
    before = counters(client)
    out = completion(client, n_predict=20, mode="fly")
    after = counters(client)
    t = out["timings"]
    assert after["llamacpp:prompt_tokens_cached_total"] - before["llamacpp:prompt_tokens_cached_total"] == t["cache_n"]
    assert after["llamacpp:n_busy_slots_per_decode"] == 1  # one slot
    assert not any(name.endswith("_rows_per_decode") for name in after)
    assert after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] == 20
    assert after["llamacpp:prompt_tokens_total"] - before["llamacpp:prompt_tokens_total"] == t["prompt_n"]
    assert after["llamacpp:spec_decode_num_draft_tokens_total"] - before["llamacpp:spec_decode_num_draft_tokens_total"] == t["draft_n"]
    accepted = after["llamacpp:spec_decode_num_accepted_tokens_total"] - before["llamacpp:spec_decode_num_accepted_tokens_total"]
    assert accepted == t["draft_n_accepted"]
    assert after['llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"}'] >= 1
    assert after["llamacpp:n_decode_total"] > before["llamacpp:n_decode_total"]
    assert "llamacpp:requests_processing" in after and "llamacpp:predicted_tokens_seconds" in after
    assert after["fly_cpp_loosely_accepted_total"] - before["fly_cpp_loosely_accepted_total"] == t["draft_n_loose"]


def test_metrics_only_with_the_option(fly, client):
    r = client.get("/metrics")
    assert r.status_code == 200 and int(r.headers["Process-Start-Time-Unix"]) > 0
    with TestClient(create_app(fly)) as c:  # off by default, as llama-server without --metrics
        r = c.get("/metrics")
        assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"


def test_health_during_a_slow_load(fly):
    gate = threading.Event()

    def load() -> Fly:
        gate.wait(60)
        return fly

    with TestClient(create_app(load)) as c:
        r = c.get("/health")
        assert r.status_code == 503 and r.json() == {"error": {"code": 503, "message": "Loading model",
                                                              "type": "unavailable_error"}}
        assert c.post("/completion", json={"prompt": PROMPT}).status_code == 503
        assert c.get("/").status_code == 200  # the page loads, and waits for the server itself
        gate.set()
        for _ in range(600):
            if (r := c.get("/health")).status_code == 200:
                break
            threading.Event().wait(0.05)
        assert r.json() == {"status": "ok"}
        assert c.post("/completion", json={"prompt": PROMPT, "n_predict": 3}).json()["tokens_predicted"] == 3


def test_cors_preflight_without_the_key(fly):
    with TestClient(create_app(fly, api_key="k")) as c:
        pre = c.options("/v1/chat/completions", headers={"Origin": "http://example.com",
                                                         "Access-Control-Request-Method": "POST",
                                                         "Access-Control-Request-Headers": "authorization,content-type"})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://example.com"
        assert pre.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
        assert pre.headers["access-control-allow-credentials"] == "true"
        r = c.get("/props", headers={"Origin": "http://example.com", "Authorization": "Bearer k"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://example.com"
        for path in ("/sw.js", "/manifest.webmanifest", "/_app/version.json"):  # page assets: no key
            assert c.get(path).status_code == 200, path
    local = ServerSettings(cors_origins="localhost")
    with TestClient(create_app(fly, settings=local)) as c:
        ok = c.get("/health", headers={"Origin": "http://localhost:5173"})
        assert ok.headers["access-control-allow-origin"] == "http://localhost:5173"
        assert "access-control-allow-origin" not in c.get("/health", headers={"Origin": "http://evil.example"}).headers
        refused = c.options("/completions", headers={"Origin": "http://localhost.evil.com",
                                                     "Access-Control-Request-Method": "POST"})
        assert refused.status_code == 200 and "access-control-allow-origin" not in refused.headers


def test_body_limit(fly):
    with TestClient(create_app(fly, settings=ServerSettings(max_body=4096))) as c:
        r = c.post("/completion", json={"prompt": "x" * 10_000})
        assert r.status_code == 413 and "larger than 4096 bytes" in r.json()["error"]["message"]
        assert c.post("/completion", json={"prompt": PROMPT, "n_predict": 2}).status_code == 200


def test_apply_template_and_slots(client, fly):
    r = client.post("/apply-template", json={"messages": [{"role": "user", "content": "Hi"}]})
    assert r.json()["prompt"] == fly.chat_format.render([{"role": "user", "content": "Hi"}])
    assert client.get("/slots").json()[0]["id"] == 0


def test_a_prompt_longer_than_the_context_says_both_sizes(client, fly):
    for path, body in (("/completion", {"prompt": "Once upon a time " * 80}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Once upon a time " * 80}],
                                                 "stream": True})):
        r = client.post(path, json=body)
        error = r.json()["error"]
        assert r.status_code == 400 and error["type"] == "exceed_context_size_error", path
        assert error["n_ctx"] == fly.n_ctx and error["n_prompt_tokens"] > fly.n_ctx


def test_several_choices(client):
    messages = [{"role": "user", "content": "A story"}]
    one = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 8, "seed": 7,
                                                    "temperature": 0.9}).json()
    two = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 8, "seed": 7,
                                                    "temperature": 0.9, "n": 2}).json()
    assert [c["index"] for c in two["choices"]] == [0, 1]
    assert two["choices"][0]["message"] == one["choices"][0]["message"]  # the first choice is the request's seed
    assert two["usage"]["completion_tokens"] == 16 and two["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]
    text = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "n": 3, "temperature": 0}).json()
    assert len(text["choices"]) == 3 and len({c["text"] for c in text["choices"]}) == 1  # greedy: the same text


def test_throughput_gauges_cover_the_time_since_the_previous_scrape(client):
    counters(client)
    completion(client, n_predict=8)
    assert counters(client)["llamacpp:predicted_tokens_seconds"] > 0
    assert counters(client)["llamacpp:predicted_tokens_seconds"] == 0  # nothing ran since


def test_include_usage_sends_usage_apart_and_cached_tokens(client):
    messages = [{"role": "user", "content": "A story about a cat"}]
    body = {"messages": messages, "max_tokens": 6, "stream": True, "timings_per_token": True,
            "stream_options": {"include_usage": True}}
    chunks = [json.loads(e) for e in sse(client.post("/v1/chat/completions", json=body).text)[:-1]]
    assert "timings" not in chunks[0] and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length" and "usage" not in chunks[-2]
    last = chunks[-1]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 6 and "timings" in last
    again = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 6}).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == again["usage"]["prompt_tokens"] - 1
