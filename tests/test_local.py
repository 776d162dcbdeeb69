"""GGUFs that llama.cpp's -hf cache and ollama's store already hold: fake trees laid out as
those tools lay them out, holding real tiny GGUFs; `models list` shows them with paths that
-m loads."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from fly_cpp.cli.main import main
from fly_cpp.models import local
from tests.conftest import STORIES


def ollama_model(store: Path, name: str, tag: str, gguf: Path, namespace: str = "library") -> Path:
    """Put ``gguf`` into an ollama store as ``ollama pull`` does: a blob by digest, and a
    manifest naming it as the model layer (plus a license layer)."""
    data = gguf.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    (store / "blobs").mkdir(parents=True, exist_ok=True)
    blob = store / "blobs" / f"sha256-{digest}"
    blob.write_bytes(data)
    license_blob = store / "blobs" / f"sha256-{'0' * 64}"
    license_blob.write_text("MIT")
    manifest = store / "manifests" / "registry.ollama.ai" / namespace / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": "sha256:" + "1" * 64},
        "layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": len(data)},
                   {"mediaType": "application/vnd.ollama.image.license", "digest": "sha256:" + "0" * 64, "size": 3}],
    }))
    return blob


@pytest.fixture()
def stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stories_draft: Path) -> dict[str, Path]:
    llama = tmp_path / "llama.cpp"
    llama.mkdir()
    shutil.copy(STORIES, llama / "karpathy_tinyllamas_stories260K.gguf")  # older llama.cpp: flat files
    (llama / "karpathy_tinyllamas_stories260K.gguf.json").write_text("{}")
    snap = llama / "models--someone--Stories-GGUF" / "snapshots" / "abc123"  # newer: the hub's layout
    snap.mkdir(parents=True)
    shutil.copy(stories_draft, snap / "stories-Q4_0.gguf")
    (llama / "not-a-model.gguf").write_bytes(b"nope")
    store = tmp_path / "ollama"
    blob = ollama_model(store, "stories", "260k", STORIES)
    draft_blob = ollama_model(store, "stories-draft", "latest", stories_draft, namespace="someone")
    (store / "manifests" / "registry.ollama.ai" / "library" / "broken").mkdir(parents=True)
    (store / "manifests" / "registry.ollama.ai" / "library" / "broken" / "x").write_text("{not json")
    monkeypatch.setenv("LLAMA_CACHE", str(llama))
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    return {"llama": llama, "snap": snap, "blob": blob, "draft_blob": draft_blob}


def test_llama_cpp_cache_both_layouts(stores: dict[str, Path]) -> None:
    found = {f.name: f.path for f in local.llama_cpp_ggufs()}
    assert found == {"karpathy_tinyllamas_stories260K.gguf": stores["llama"] / "karpathy_tinyllamas_stories260K.gguf",
                     "someone/Stories-GGUF/stories-Q4_0.gguf": stores["snap"] / "stories-Q4_0.gguf"}


def test_cache_locations_follow_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLAMA_CACHE", raising=False)
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert local.llama_cpp_cache() == tmp_path / "llama.cpp"
    assert local.ollama_store() == tmp_path / "home" / ".ollama" / "models"
    assert local.llama_cpp_ggufs() == [] and local.ollama_ggufs() == []  # missing stores are empty, not errors


def test_ollama_models(stores: dict[str, Path]) -> None:
    found = {f.name: f.path for f in local.ollama_ggufs()}
    assert found == {"stories:260k": stores["blob"], "someone/stories-draft:latest": stores["draft_blob"]}


def test_models_list_shows_them_and_generate_loads_them(stores: dict[str, Path],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert f"llama.cpp cache ({stores['llama']}" in out and "ollama models (" in out
    assert "someone/Stories-GGUF/stories-Q4_0.gguf" in out and str(stores["snap"] / "stories-Q4_0.gguf") in out
    assert "stories:260k" in out and str(stores["blob"]) in out
    assert "not-a-model" not in out and "broken" not in out
    before = {p: p.stat().st_mtime_ns for p in stores["llama"].rglob("*")}
    args = ["-p", "Once upon a time", "-n", "8", "--json", "-t", "1", "--mode", "spd"]
    assert main(["generate", "-m", str(stores["blob"]), "-md", str(stores["snap"] / "stories-Q4_0.gguf"), *args]) == 0
    assert len(json.loads(capsys.readouterr().out)["tokens"]) == 8
    assert {p: p.stat().st_mtime_ns for p in stores["llama"].rglob("*")} == before  # read-only
