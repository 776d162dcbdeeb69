"""llama-server's server options, as its clients and its own test suite use them: --no-ui,
--no-slots, --alias with several names, --tags, and several --host addresses."""

from __future__ import annotations

import socket

import httpx
import pytest
from fastapi.testclient import TestClient

from fly_cpp import Fly
from fly_cpp.config import ServerSettings
from fly_cpp.server import create_app
from serving import Server


@pytest.fixture(scope="module")
def fly(stories, stories_draft):
    with Fly(stories, stories_draft, n_ctx=256) as llm:
        yield llm


def test_no_ui_and_no_slots(fly):
    with TestClient(create_app(fly, settings=ServerSettings(ui=False, slots=False))) as c:
        assert c.get("/").status_code == 404
        r = c.get("/slots")
        assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
    with TestClient(create_app(fly)) as c:
        assert c.get("/").status_code == 200 and c.get("/slots").status_code == 200


def test_aliases_and_tags(fly):
    settings = ServerSettings(alias="tinyllama-2,fim,code", tags="chat,small")
    with TestClient(create_app(fly, settings=settings)) as c:
        model = c.get("/v1/models").json()["data"][0]
    assert set(model["aliases"]) == {"tinyllama-2", "fim", "code"} and model["tags"] == ["chat", "small"]
    assert settings.alias_list[0] == "code"  # the id the served model takes (fly-cpp serve sets it)


def test_apply_template_without_generation_prompt(fly, tmp_path):
    with TestClient(create_app(fly)) as c:
        hi = {"messages": [{"role": "user", "content": "Hi"}]}
        with_prompt = c.post("/apply-template", json=hi).json()["prompt"]
        without = c.post("/apply-template", json={**hi, "add_generation_prompt": False}).json()["prompt"]
    assert with_prompt.startswith(without) and with_prompt != without


def test_server_n_predict_default(fly):
    with TestClient(create_app(fly, settings=ServerSettings(n_predict=5))) as c:
        assert c.post("/completion", json={"prompt": "Once"}).json()["tokens_predicted"] == 5
        three = c.post("/completion", json={"prompt": "Once", "n_predict": 3}).json()
        assert three["tokens_predicted"] == 3 and three["has_new_line"] == ("\n" in three["content"])
        chat = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]}).json()
        assert chat["usage"]["completion_tokens"] <= 5


def test_fingerprint(fly):
    with TestClient(create_app(fly)) as c:
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert r.json()["system_fingerprint"].startswith("b")


def _ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_several_hosts_and_chatml_fallback(tmp_path):
    """Several addresses, one port; a GGUF without a template is served with chatml, as
    llama-server serves it."""
    hosts = ["127.0.0.1", "::1"] if _ipv6() else ["127.0.0.1"]
    server = Server(tmp_path, "--host", ",".join(hosts), "-a", "b,a", "-t", "1", "-c", "256")
    try:
        port = server.url.rsplit(":", 1)[1]
        for host in hosts:
            url = f"http://{'[::1]' if host == '::1' else host}:{port}"
            assert httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"] == "a"
        shown = httpx.post(server.url + "/apply-template", json={"messages": [{"role": "user", "content": "Hi"}]},
                           timeout=30).json()["prompt"]
        assert "<|im_start|>user\nHi<|im_end|>" in shown
    finally:
        server.stop()
