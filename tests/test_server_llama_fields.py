"""llama-server's debugging and sampling fields on fly-cpp serve (in process, a real tiny pair):
``__verbose``, the samplers it does not run as generation settings report them, seeded text
that is llama-server's."""

from __future__ import annotations

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
    assert props["adaptive_target"] == -1.0


def test_a_seed_writes_llama_servers_text(client):
    # llama-server's own suite: stories260K at --temp 0.8 --seed 42 writes "going ... bed"
    out = client.post("/completion", json={"prompt": "I believe the meaning of life is", "n_predict": 8,
                                           "temperature": 0.8, "seed": 42}).json()
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
