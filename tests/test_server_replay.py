"""A replay of real requests in llama-server's and OpenAI's shapes, as their clients send them
(llama.cpp's web UIs, the official ``openai`` client, curl-style raw HTTP), against a real
``fly-cpp serve`` on loopback: every one is answered 200 with sensible content. The same
requests against ``--strict`` are refused where they carry fields fly-cpp would ignore.

The test writes a transcript for humans ($FLY_CPP_ARTIFACTS, default build/artifacts/replay.txt).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from serving import Server

KEY = "replay-key"
ARTIFACTS = Path(os.environ.get("FLY_CPP_ARTIFACTS", Path(__file__).resolve().parents[1] / "build" / "artifacts"))
CHAT = [{"role": "system", "content": "You tell short stories."}, {"role": "user", "content": "A story about a cat."}]

# llama.cpp's web UI (tools/server/webui) on /v1/chat/completions: its whole sampler setup, every time
WEBUI_CHAT = {
    "messages": CHAT, "stream": True, "cache_prompt": True, "samplers": "edkypmxt", "temperature": 0.8,
    "dynatemp_range": 0, "dynatemp_exponent": 1, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "typical_p": 1,
    "xtc_probability": 0, "xtc_threshold": 0.1, "repeat_last_n": 64, "repeat_penalty": 1, "presence_penalty": 0,
    "frequency_penalty": 0, "dry_multiplier": 0, "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": -1,
    "max_tokens": -1, "timings_per_token": False, "n_predict": 40,
}
# llama-server's older page on /completion
OLD_WEBUI = {
    "prompt": "This is a conversation between User and Llama.\nUser: Tell me a story.\nLlama:", "n_predict": 40,
    "temperature": 0.7, "stop": ["</s>", "Llama:", "User:"], "repeat_last_n": 256, "repeat_penalty": 1.18,
    "penalize_nl": False, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "tfs_z": 1, "typical_p": 1, "presence_penalty": 0,
    "frequency_penalty": 0, "mirostat": 0, "mirostat_tau": 5, "mirostat_eta": 0.1, "grammar": "", "n_probs": 0,
    "min_keep": 0, "image_data": [], "cache_prompt": True, "api_key": "", "slot_id": -1, "stream": True,
}


class Transcript:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, who: str, method: str, path: str, body: Any, status: int, answer: str) -> None:
        shown = json.dumps(body, ensure_ascii=False) if body is not None else ""
        self.lines += [f"{who}: {method} {path} {shown[:600]}{'...' if len(shown) > 600 else ''}",
                       f"  -> {status} {answer[:300]}", ""]


@pytest.fixture(scope="module")
def transcript():
    t = Transcript()
    yield t
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "replay.txt").write_text("\n".join(t.lines))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("replay"), "-t", "1", "-c", "1024", "--api-key", KEY, "--metrics")
    yield s
    assert s.stop() == 0, s.stderr()


def raw(server, transcript, method: str, path: str, body: Any = None, stream: bool = False) -> tuple[int, Any]:
    """One raw HTTP request (as curl sends it: no JSON content type); the JSON answer, or the
    stream's parsed events."""
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/x-www-form-urlencoded"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=120) as c:
        r = c.request(method, path, content=json.dumps(body) if body is not None else None)
    if stream and r.status_code == 200:
        events = [line[6:] for line in r.text.split("\n") if line.startswith("data: ")]
        parsed = [json.loads(e) for e in events if e != "[DONE]"]
        text = "".join(_piece(e) for e in parsed)
        transcript.add("raw", method, path, body, r.status_code,
                       f"{len(events)} events, text {text!r}, last: {json.dumps(parsed[-1].get('timings', {}))[:160]}")
        return r.status_code, parsed
    answer = r.json() if r.headers.get("content-type", "").startswith("application/json") else r.text
    transcript.add("raw", method, path, body, r.status_code, json.dumps(answer)[:300] if not isinstance(answer, str) else answer)
    return r.status_code, answer


def _piece(event: dict[str, Any]) -> str:
    if "content" in event:
        return event["content"]
    choice = (event.get("choices") or [{}])[0]
    return choice.get("text") or (choice.get("delta") or {}).get("content") or ""


def test_llama_server_clients(server, transcript):
    status, events = raw(server, transcript, "POST", "/v1/chat/completions", WEBUI_CHAT, stream=True)
    assert status == 200 and "".join(_piece(e) for e in events).strip() and events[-1]["timings"]["predicted_n"] > 0
    status, events = raw(server, transcript, "POST", "/completion", OLD_WEBUI, stream=True)
    assert status == 200 and events[-1]["stop"] is True and "".join(e["content"] for e in events).strip()
    status, tokens = raw(server, transcript, "POST", "/tokenize", {"content": " cat", "with_pieces": True})
    cat = tokens["tokens"][-1]["id"]
    body = {"prompt": "Once upon a time", "max_tokens": 24, "ignore_eos": True, "n_keep": -1, "return_tokens": True,
            "timings_per_token": True, "post_sampling_probs": False, "id_slot": 0, "n_probs": 2,
            "logit_bias": [[cat, False]], "cache_prompt": False, "seed": 7}
    status, out = raw(server, transcript, "POST", "/completion", body)
    assert status == 200 and out["tokens_predicted"] == 24 and len(out["tokens"]) == 24 and cat not in out["tokens"]
    assert len(out["completion_probabilities"]) == 24 and out["timings"]["cache_n"] == 0
    status, events = raw(server, transcript, "POST", "/completion", {**body, "stream": True}, stream=True)
    assert status == 200 and all("timings" in e and "completion_probabilities" in e for e in events[:-1])
    for method, path, payload in (("POST", "/detokenize", {"tokens": out["tokens"][:5]}),
                                  ("POST", "/apply-template", {"messages": CHAT}), ("GET", "/props", None),
                                  ("GET", "/slots", None), ("GET", "/health", None), ("GET", "/v1/models", None)):
        status, _ = raw(server, transcript, method, path, payload)
        assert status == 200, path
    status, metrics = raw(server, transcript, "GET", "/metrics")
    assert status == 200 and "llamacpp:tokens_predicted_total" in metrics


def test_openai_client(server, transcript):
    log: list[tuple[str, str, Any]] = []

    def on_request(request: httpx.Request) -> None:
        log.append((request.method, request.url.path, json.loads(request.content) if request.content else None))

    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120,
                           http_client=httpx.Client(event_hooks={"request": [on_request]}))
    tokens = httpx.post(server.url + "/tokenize", json={"content": " dog"}, headers={"Authorization": f"Bearer {KEY}"})
    dog = tokens.json()["tokens"][-1]
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}]
    out = client.chat.completions.create(
        model="gpt-4o-mini", messages=CHAT, temperature=0.7, top_p=0.9, max_tokens=32, logprobs=True, top_logprobs=3,
        logit_bias={str(dog): -100}, response_format={"type": "text"}, tools=tools, tool_choice="none",
        parallel_tool_calls=False, metadata={"run": "replay"}, store=False, seed=42, user="replay", n=1,
        reasoning_effort="low", extra_body={"cache_prompt": True, "mode": "fly", "k": 8, "typical_p": 0.9,
                                            "chat_template_kwargs": {"enable_thinking": False}})
    content = out.choices[0].message.content
    transcript.add("openai", *log[-1], 200, f"content {content!r}, logprobs {len(out.choices[0].logprobs.content)}, "
                   f"finish {out.choices[0].finish_reason}, usage {out.usage.completion_tokens}, "
                   f"timings {out.model_extra['timings']['predicted_per_second']:.0f} tok/s")
    assert content and len(out.choices[0].logprobs.content) == 32 and out.usage.completion_tokens == 32
    assert all(len(lp.top_logprobs) == 3 for lp in out.choices[0].logprobs.content)

    stream = client.chat.completions.create(model="any", messages=CHAT, max_tokens=24, stream=True,
                                            stream_options={"include_usage": True}, frequency_penalty=0.5,
                                            presence_penalty=0.2, stop=["\n\n"])
    pieces, usage, timings = [], None, None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
        timings = (chunk.model_extra or {}).get("timings") or timings
    transcript.add("openai", *log[-1], 200, f"streamed {len(pieces)} chunks {''.join(pieces)!r}, usage "
                   f"{usage.completion_tokens if usage else None}, timings {bool(timings)}")
    assert "".join(pieces) and usage is not None and timings is not None

    text = client.completions.create(model="any", prompt="Once upon a time", max_tokens=16, logprobs=2, echo=False,
                                     best_of=1, seed=3, stop=["."], extra_body={"ignore_eos": True})
    transcript.add("openai", *log[-1], 200, f"text {text.choices[0].text!r}, logprobs tokens "
                   f"{len(text.choices[0].logprobs.tokens)}, finish {text.choices[0].finish_reason}")
    assert text.choices[0].text and len(text.choices[0].logprobs.tokens) == text.usage.completion_tokens
    models = client.models.list()
    transcript.add("openai", *log[-1], 200, f"models {[m.id for m in models.data]}")
    assert models.data[0].id == "stories260K.gguf"


def test_strict_refuses_what_would_be_ignored(tmp_path, transcript):
    s = Server(tmp_path, "-t", "1", "-c", "1024", "--strict")
    try:
        for path, body, field in (("/completion", {**OLD_WEBUI, "mirostat": 2}, "mirostat"),
                                  ("/v1/chat/completions", {**WEBUI_CHAT, "samplers": "kt"}, "samplers"),
                                  ("/v1/chat/completions", {"messages": CHAT, "functions": [{"name": "f"}]}, "functions"),
                                  ("/completion", {"prompt": "a", "bogus": 1}, "bogus")):
            r = httpx.post(s.url + path, json=body, timeout=60)
            transcript.add("strict", "POST", path, body, r.status_code, r.text)
            message = r.json()["error"]["message"]
            assert r.status_code == 400 and f"'{field}'" in message and "--strict" in message
        # the web UIs' usual bodies name only samplers switched off (neutral values): nothing is ignored
        for path, body in (("/v1/chat/completions", {**WEBUI_CHAT, "stream": False}), ("/completion", {**OLD_WEBUI, "stream": False})):
            r = httpx.post(s.url + path, json=body, timeout=120)
            transcript.add("strict", "POST", path, body, r.status_code, r.text[:200])
            assert r.status_code == 200
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="no tool-call format"):  # checked, not ignored
            client.chat.completions.create(model="x", messages=CHAT, tools=[{"type": "function", "function": {"name": "f"}}])
    finally:
        assert s.stop() == 0, s.stderr()
