"""``fly-cpp serve -np N``: requests generated at once in the engine's slots give what each
gives alone; ``/props`` and ``/slots`` show the slots; ``id_slot`` is honoured."""

from __future__ import annotations

import threading

import pytest
from fastapi.testclient import TestClient

from fly_cpp import Engine, ModelSettings
from fly_cpp.api.fly import Fly
from fly_cpp.config import ServerSettings
from fly_cpp.basics.errors import FlyError
from fly_cpp.server import create_app

PROMPTS = ["Once upon a time", "Lily and Tom went to the park", "The little dog was sad because"]


@pytest.fixture(scope="module")
def client(stories, stories_draft):
    # n_ubatch=1: a row's numbers do not depend on the other slots' rows in its batch
    engine = Engine(ModelSettings(str(stories), n_ctx=512, n_ubatch=1),
                    ModelSettings(str(stories_draft), n_ctx=512, n_ubatch=1), n_seq=3)
    with Fly.from_engine(engine) as fly, TestClient(create_app(fly, settings=ServerSettings(parallel=3, metrics=True))) as c:
        yield c


def complete(client, prompt: str, **body) -> dict:
    r = client.post("/completion", json={"prompt": prompt, "n_predict": 24, "mode": "spd", "k": 4, "temperature": 0,
                                         **body})  # greedy: each request's text is compared with another's
    assert r.status_code == 200, r.text
    return r.json()


def test_props_and_slots_show_every_slot(client):
    props = client.get("/props").json()
    assert props["total_slots"] == 3 and "3 generations at a time" in props["serving"]
    slots = client.get("/slots").json()
    assert [s["id"] for s in slots] == [0, 1, 2] and not any(s["is_processing"] for s in slots)


def test_concurrent_requests_give_what_each_gives_alone(client):
    alone = [complete(client, p)["content"] for p in PROMPTS]
    out = [""] * len(PROMPTS)
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, complete(client, PROMPTS[i])["content"]))
               for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == alone


def test_id_slot(client):
    pinned = complete(client, PROMPTS[0], id_slot=2)
    assert pinned["id_slot"] == 2 and pinned["content"] == complete(client, PROMPTS[0])["content"]
    r = client.post("/completion", json={"prompt": "a", "id_slot": 3})
    assert r.status_code == 400 and "id_slot 3" in r.json()["error"]["message"]


def test_parallel_setting():
    assert ServerSettings(parallel="auto").n_slots == 4 and ServerSettings().n_slots == 4  # -np auto by default
    assert ServerSettings().unified and not ServerSettings(parallel=4).unified and ServerSettings(parallel=1).n_slots == 1
    with pytest.raises(FlyError, match="parallel"):
        ServerSettings(parallel=0)



def test_slots_and_metrics_count_each_slots_speculation(client):
    before = client.get("/slots").json()[1]["totals"]
    out = complete(client, PROMPTS[1], id_slot=1)
    slot = client.get("/slots").json()[1]
    t = out["timings"]
    assert not slot["is_processing"] and slot["next_token"] == [{"has_next_token": False, "n_remain": -1, "n_decoded": 0}]
    assert slot["timings"]["draft_n"] == t["draft_n"] > 0 and slot["n_prompt_tokens"] == out["tokens_evaluated"]
    fly = slot["fly"]
    assert (fly["drafted"], fly["accepted"], fly["loosely_accepted"]) == (t["draft_n"], t["draft_n_accepted"], 0)
    assert fly["rounds"] == out["fly"]["n_rounds"] and fly["drafts"] == out["fly"]["n_drafts"]
    grew = {name: slot["totals"][name] - before[name] for name in before}
    assert grew == {"generations": 1, "tokens_predicted": 24, "rounds": fly["rounds"], "drafts": fly["drafts"],
                    "drafted": fly["drafted"], "accepted": fly["accepted"], "loosely_accepted": 0}
    metrics = client.get("/metrics").text
    for name, n in slot["totals"].items():
        assert f'fly_cpp_slot_{name}_total{{slot="1"}} {n}\n' in metrics
    assert "llamacpp:requests_processing 0\n" in metrics and "llamacpp:requests_deferred 0\n" in metrics


def test_auto_slots_keep_an_mtp_head_drafting(stories, stories_draft, qwen35_mtp):
    """``-np auto``: llama-server's 4 slots, but 1 where the target drafts with its own MTP head
    (it drafts for one sequence): the slots would leave the head unused."""
    from fly_cpp import ModelSettings
    from fly_cpp.backend.fit import auto_slots

    assert auto_slots(ModelSettings(str(stories)), ModelSettings(str(stories_draft))) == 4
    assert auto_slots(ModelSettings(str(stories)), None) == 4
    assert auto_slots(ModelSettings(str(qwen35_mtp)), None) == 1
    assert auto_slots(ModelSettings(str(qwen35_mtp)), ModelSettings(str(stories_draft))) == 4  # -d drafts instead
