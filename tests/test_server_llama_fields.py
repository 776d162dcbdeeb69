"""llama-server's debugging and sampling fields on fly-cpp serve (in process, a real tiny pair):
``__verbose``, the samplers it does not run as generation settings report them, seeded text
that is llama-server's."""

from __future__ import annotations

import math

import pytest
from fastapi.testclient import TestClient

from fly_cpp import Fly
from fly_cpp.config import ServerSettings
from fly_cpp.server import create_app

CHAT = {"max_tokens": 2, "messages": [{"role": "system", "content": "Book"},
                                      {"role": "user", "content": "What is the best book"}]}


@pytest.fixture(scope="module")
def fly(stories, stories_draft):
    with Fly(stories, stories_draft, n_ctx=256, chat_format="chatml") as llm:
        yield llm


@pytest.fixture(scope="module")
def client(fly):
    with TestClient(create_app(fly)) as c:
        yield c


@pytest.fixture(scope="module")
def verbose_client(fly):
    with TestClient(create_app(fly, settings=ServerSettings(verbose=True))) as c:
        yield c


def test_verbose_answers_carry_the_prompt_as_the_model_read_it(client, verbose_client):
    plain = client.post("/v1/chat/completions", json=CHAT).json()
    assert "__verbose" not in plain
    asked = client.post("/v1/chat/completions", json={**CHAT, "verbose": True}).json()
    shown = asked["__verbose"]
    assert "<|im_start|>system\nBook<|im_end|>" in shown["prompt"] and shown["prompt"].endswith("assistant\n")
    assert shown["content"] == asked["choices"][0]["message"]["content"]
    assert shown["tokens_predicted"] == 2 and shown["stop_type"] == "limit"
    assert "__verbose" in verbose_client.post("/v1/chat/completions", json=CHAT).json()  # --verbose
    assert "__verbose" not in verbose_client.post("/v1/chat/completions", json={**CHAT, "verbose": False}).json()
    text = verbose_client.post("/v1/completions", json={"prompt": "Once upon", "max_tokens": 2}).json()
    assert text["__verbose"]["prompt"].endswith("Once upon")


def test_generation_settings_list_the_samplers_fly_cpp_does_not_run_as_off(client):
    out = client.post("/completion", json={"prompt": "Once upon", "n_predict": 1}).json()["generation_settings"]
    assert out["adaptive_target"] == -1.0 and out["mirostat"] == 0 and out["typical_p"] == 1.0
    assert out["top_k"] == 40  # fly-cpp's own chain is reported as it ran
    props = client.get("/props").json()["default_generation_settings"]
    assert props["adaptive_target"] == -1.0 and props["params"]["adaptive_target"] == -1.0
    assert props["params"]["top_k"] == props["top_k"] and "seed" in props["params"]


def test_a_seed_writes_llama_servers_text(client):
    # llama-server's own suite: stories260K at --temp 0.8 --seed 42 writes "going ... bed" (drawn as llama.cpp draws)
    out = client.post("/completion", json={"prompt": "I believe the meaning of life is", "n_predict": 8,
                                           "temperature": 0.8, "seed": 42, "draw": "llama"}).json()
    assert out["content"] == " going to bed. I"


def test_a_final_assistant_message_is_continued(client):
    prefill = {**CHAT, "messages": [*CHAT["messages"], {"role": "assistant", "content": "Whill"}], "verbose": True}
    prompt = client.post("/v1/chat/completions", json=prefill).json()["__verbose"]["prompt"]
    assert prompt.endswith("<|im_start|>user\nWhat is the best book<|im_end|>\n<|im_start|>assistant\nWhill")
    explicit = client.post("/v1/chat/completions", json={**prefill, "continue_final_message": True,
                                                           "add_generation_prompt": False}).json()
    assert explicit["__verbose"]["prompt"] == prompt
    both = client.post("/v1/chat/completions", json={**prefill, "continue_final_message": True})
    assert both.status_code == 400 and "add_generation_prompt" in both.json()["error"]["message"]
    twice = {**CHAT, "messages": [*CHAT["messages"], {"role": "assistant", "content": "A"},
                                  {"role": "assistant", "content": "B"}]}
    assert client.post("/v1/chat/completions", json=twice).status_code == 400


def test_post_sampling_probs_are_the_chains(client):
    body = {"prompt": "Today was the day. Today I would finally become a", "n_probs": 10, "n_predict": 5,
            "temperature": 1.0, "top_k": 40, "seed": 3}
    raw = client.post("/completion", json=body).json()
    post = client.post("/completion", json={**body, "post_sampling_probs": True}).json()
    assert raw["content"] == post["content"]  # the same draws: only the report differs
    for before, after in zip(raw["completion_probabilities"], post["completion_probabilities"]):
        assert after["id"] == before["id"] and "logprob" not in after and 0.0 < after["prob"] <= 1.0
        tops = after["top_probs"]
        assert 0 < len(tops) <= 10 and all(p["prob"] > 0 for p in tops)
        assert [p["prob"] for p in tops] == sorted((p["prob"] for p in tops), reverse=True)
        if len(tops) < 10:  # the chain kept fewer: they are all it kept
            assert sum(p["prob"] for p in tops) == pytest.approx(1.0)
        # the chain's most likely token is the raw most likely one, made likelier by the cut
        assert tops[0]["id"] == before["top_logprobs"][0]["id"]
        assert tops[0]["prob"] >= math.exp(before["top_logprobs"][0]["logprob"]) - 1e-6
    greedy = client.post("/completion", json={**body, "temperature": 0, "post_sampling_probs": True}).json()
    assert all(e["prob"] == 1.0 and len(e["top_probs"]) == 1 for e in greedy["completion_probabilities"])


def test_a_prompt_too_long_says_so_in_llama_servers_words(client):
    r = client.post("/completion", json={"prompt": "once " * 400, "n_predict": 1})
    assert r.status_code == 400 and "exceeds the available context size" in r.json()["error"]["message"]


def test_a_full_shared_cache_is_the_servers_limit():
    # slots sharing one cache (--kv-unified) may fill it together: llama-server answers 500 in these words
    from fly_cpp.backend.cache import decode_failed
    from fly_cpp.basics.errors import CacheFull
    from fly_cpp.server.errors import of, status_of

    full = decode_failed("stories260K.gguf", 1)
    assert isinstance(full, CacheFull) and status_of(full) == 500
    assert "context size has been exceeded" in of(full)["error"]["message"]
    assert status_of(decode_failed("stories260K.gguf", 2)) == 400
