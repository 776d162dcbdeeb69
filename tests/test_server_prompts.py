"""llama-server's /completion request shapes on fly-cpp serve (in process, a real tiny pair):
prompts as token ids, mixed, objects, several in one request; response_fields; logit_bias keyed
by text."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from fly_cpp import Fly
from fly_cpp.basics.errors import FlyError
from fly_cpp.server import create_app, prompts

TEXT = "I believe the meaning of life is"


@pytest.fixture(scope="module")
def fly(stories, stories_draft):
    with Fly(stories, stories_draft, n_ctx=256, temperature=0) as llm:  # greedy: each shape's text compared
        yield llm


@pytest.fixture(scope="module")
def client(fly):
    with TestClient(create_app(fly)) as c:
        yield c


def content(client, prompt, **body):
    r = client.post("/completion", json={"prompt": prompt, "n_predict": 8, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_split_and_tokens(fly):
    assert prompts.split("a") == ["a"] and prompts.split([1, 2, "a"]) == [[1, 2, "a"]]
    assert prompts.split(["a", [1, 2], {"prompt_string": "b"}]) == ["a", [1, 2], {"prompt_string": "b"}]
    ids = fly.tokenize(TEXT)
    assert prompts.tokens(fly, {"prompt_string": TEXT}) == ids == prompts.tokens(fly, [TEXT])
    tail = fly.tokenize(" of", add_special=False, parse_special=True)
    assert prompts.tokens(fly, [5, 6, " of"]) == [5, 6, *tail]  # later strings get no BOS
    with pytest.raises(FlyError, match="text only"):
        prompts.tokens(fly, {"prompt_string": "x", "multimodal_data": ["AAAA"]})
    with pytest.raises(FlyError, match="prompt_string"):
        prompts.tokens(fly, [1.5])


def test_every_prompt_shape_gives_the_same_text(client, fly):
    ids = fly.tokenize(TEXT)
    first = content(client, TEXT)
    assert first["prompt"] == fly.engine.detokenize(ids, special=True)
    for shape in (ids, {"prompt_string": TEXT}, [TEXT]):
        assert content(client, shape)["content"] == first["content"]


def test_several_prompts_answer_a_list(client, fly):
    ids = fly.tokenize(TEXT)
    out = content(client, [ids, TEXT, {"prompt_string": TEXT}])
    assert isinstance(out, list) and [o["index"] for o in out] == [0, 1, 2]
    assert len({o["content"] for o in out}) == 1
    r = client.post("/completion", json={"prompt": [TEXT, TEXT], "stream": True})
    assert r.status_code == 400 and "one prompt" in r.json()["error"]["message"]


def test_response_fields(client):
    out = content(client, TEXT, response_fields=["content", "generation_settings/n_predict", "no/such"])
    assert set(out) == {"content", "generation_settings/n_predict"} and out["generation_settings/n_predict"] == 8


def test_logit_bias_keyed_by_text(client, fly):
    plain = content(client, TEXT, mode="target")["content"]
    word = plain.split()[0]
    banned = content(client, TEXT, mode="target", logit_bias={f" {word}": False})["content"]
    assert not banned.startswith(f" {word}")
    ids = fly.tokenize(f" {word}", add_special=False, parse_special=True)
    by_id = content(client, TEXT, mode="target", logit_bias={str(t): False for t in ids})["content"]
    assert by_id == banned


def test_generation_settings_list_the_biases_applied(client, fly):
    banned = content(client, TEXT, ignore_eos=True)["generation_settings"]["logit_bias"]
    assert banned and all(b["bias"] is None for b in banned)  # the end-of-generation tokens, banned
    assert content(client, TEXT)["generation_settings"]["logit_bias"] == []
    one = content(client, TEXT, logit_bias=[[5, 1.5]])["generation_settings"]["logit_bias"]
    assert one == [{"token": 5, "bias": 1.5}]
