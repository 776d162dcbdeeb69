"""Hugging Face downloads, offline: a cache laid out exactly as huggingface-hub lays it out
(models--owner--name/{blobs,snapshots/<commit>,refs/main}) holds real tiny GGUFs; `pull`,
`--hf-repo/--hf-file`, `--pair` and `models list` must find them with HF_HUB_OFFLINE=1."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from fly_cpp import FlyError
from fly_cpp.cli.main import main
from fly_cpp.models import hub
from tests.conftest import STORIES

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fill_cache(hub_cache: Path, repo: str, files: dict[str, Path], commit: str = COMMIT) -> None:
    """Put ``files`` (name in repo -> local file) into a huggingface-hub cache, as a download would."""
    root = hub_cache / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "blobs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    for name, src in files.items():
        data = src.read_bytes()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = root / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))


@pytest.fixture()
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stories_draft: Path) -> Path:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = tmp_path / "hf" / "hub"
    fill_cache(cache, "karpathy/tinyllamas-gguf", {"stories260K.gguf": STORIES, "draft/stories260K-q4_0.gguf": stories_draft})
    pair = hub.registry()["llama3.2-3b"]  # a registry pair, played by the tiny models
    fill_cache(cache, pair.target.repo, {pair.target.file: STORIES})
    fill_cache(cache, pair.draft.repo, {pair.draft.file: stories_draft})
    return cache


def test_cache_location_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert hub.cache_dir() == tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert hub.cache_dir() == tmp_path / "elsewhere"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.offline()
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert not hub.offline()


def test_pull_from_the_cache(offline_cache: Path) -> None:
    path = hub.pull("karpathy/tinyllamas-gguf", "stories260K.gguf")
    assert path == offline_cache / "models--karpathy--tinyllamas-gguf" / "snapshots" / COMMIT / "stories260K.gguf"
    assert path.read_bytes() == STORIES.read_bytes()
    assert hub.pull("karpathy/tinyllamas-gguf", "draft/stories260K-q4_0.gguf").exists()
    with pytest.raises(FlyError, match="not in the Hugging Face cache.*HF_HUB_OFFLINE"):
        hub.pull("karpathy/tinyllamas-gguf", "missing.gguf")
    with pytest.raises(FlyError, match="not in the Hugging Face cache"):
        hub.pull("nobody/nothing", "x.gguf")
    with pytest.raises(FlyError, match="owner/name"):
        hub.pull("no-slash", "x.gguf")


def test_cached_ggufs_and_list(offline_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cached = {(f.repo, f.file) for f in hub.cached_ggufs()}
    assert ("karpathy/tinyllamas-gguf", "stories260K.gguf") in cached
    assert ("karpathy/tinyllamas-gguf", "draft/stories260K-q4_0.gguf") in cached
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "karpathy/tinyllamas-gguf/stories260K.gguf" in out and "offline" in out
    assert "llama3.1-70b" in out and "qwen2.5-7b" in out and "costly (synthetic)" in out
    block = out[out.index("llama3.2-3b:"):].split("\n")
    assert "[cached]" in block[1] and "[cached]" in block[2]


def test_registry_entries_are_well_formed() -> None:
    pairs = hub.registry()
    assert {"llama3.1-8b", "llama3.1-70b", "qwen2.5-7b", "qwen2.5-32b"} <= set(pairs)
    for pair in pairs.values():
        for f in (pair.target, pair.draft):
            assert f.repo.count("/") == 1 and f.file.endswith(".gguf"), pair.name


def test_pull_pair_and_unknown_pair(offline_cache: Path) -> None:
    target, draft = hub.pull_pair("llama3.2-3b")
    assert target.read_bytes() == STORIES.read_bytes() and draft.exists()
    with pytest.raises(FlyError, match="not in the Hugging Face cache"):
        hub.pull_pair("qwen2.5-7b")
    with pytest.raises(FlyError, match="unknown pair"):
        hub.pull_pair("no-such-pair")


def test_cli_pull(offline_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "pull", "karpathy/tinyllamas-gguf", "stories260K.gguf"]) == 0
    assert capsys.readouterr().out.strip().endswith("snapshots/" + COMMIT + "/stories260K.gguf")
    assert main(["models", "pull", "karpathy/tinyllamas-gguf", "nope.gguf"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("fly-cpp: error:") and len(err.strip().splitlines()) == 1


def test_generate_with_hf_options(offline_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = ["-p", "Once upon a time", "-n", "10", "--json", "-c", "256", "-t", "1", "--temp", "0"]  # greedy
    assert main(["generate", "--hf-repo", "karpathy/tinyllamas-gguf", "--hf-file", "stories260K.gguf",
                 "--hf-draft-file", "draft/stories260K-q4_0.gguf", *common]) == 0
    with_hf = json.loads(capsys.readouterr().out)
    assert main(["generate", "-m", str(STORIES), "--mode", "target", *common]) == 0
    target_only = json.loads(capsys.readouterr().out)
    assert main(["generate", "--pair", "llama3.2-3b", "--mode", "spd", *common]) == 0
    via_pair = json.loads(capsys.readouterr().out)
    assert len(with_hf["tokens"]) == 10
    assert via_pair["tokens"] == target_only["tokens"]  # spd is lossless: the target's own text
    assert main(["generate", "--hf-repo", "karpathy/tinyllamas-gguf", "--hf-file", "stories260K.gguf",
                 "--hf-draft-repo", "karpathy/tinyllamas-gguf", "--hf-draft-file", "draft/stories260K-q4_0.gguf",
                 "--mode", "spd", *common]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == target_only["tokens"]


@pytest.mark.parametrize("args, message", [
    (["--hf-file", "a.gguf"], "--hf-file needs --hf-repo"),
    (["-hff", "a.gguf"], "--hf-file needs --hf-repo"),
    (["-m", str(STORIES), "--hf-repo", "a/b", "--hf-file", "c.gguf"], "not both"),
    (["--hf-draft-file", "d.gguf"], "--hf-draft-repo"),
    (["--pair", "llama3.1-8b", "-m", str(STORIES)], "--pair"),
    (["--pair", "no-such-pair"], "costly"),
])
def test_model_option_usage_errors(args: list[str], message: str, capsys: pytest.CaptureFixture[str],
                                   offline_cache: Path) -> None:
    assert main(["generate", *args, "-p", "x", "-n", "1"]) == 2
    assert message in capsys.readouterr().err


def test_choose_file_as_llama_cpp_does() -> None:
    files = ["README.md", "Qwen-Q8_0.gguf", "Qwen-Q4_K_M.gguf", "mmproj-Qwen-Q4_K_M.gguf", "Qwen-f16.gguf",
             "big/Qwen-Q6_K-00002-of-00002.gguf", "big/Qwen-Q6_K-00001-of-00002.gguf"]
    assert hub.choose_file(files, "") == "Qwen-Q4_K_M.gguf"  # the default quant; never the projector
    assert hub.choose_file(files, "q8_0") == "Qwen-Q8_0.gguf"  # case-insensitive
    assert hub.choose_file(files, "F16") == "Qwen-f16.gguf"
    assert hub.choose_file(files, "Q6_K") == "big/Qwen-Q6_K-00001-of-00002.gguf"  # a split model's first part
    assert hub.choose_file(files, "Q2_K") is None
    assert hub.choose_file(["a-Q8_0.gguf", "b-Q5_0.gguf"], "") == "a-Q8_0.gguf"  # then Q8_0
    assert hub.choose_file(["b-Q5_0.gguf", "a-Q3_K.gguf"], "") == "b-Q5_0.gguf"  # then the first model file
    assert hub.choose_file(["imatrix.gguf", "x.txt"], "") is None
    assert hub.split_tag("owner/name:Q4_0") == ("owner/name", "Q4_0")
    with pytest.raises(FlyError, match="owner/name"):
        hub.split_tag("name:Q4_0")


def test_hf_repo_with_a_quant_from_the_cache(offline_cache: Path, capsys: pytest.CaptureFixture[str],
                                             stories_draft: Path) -> None:
    fill_cache(offline_cache, "someone/Stories-GGUF", {"stories-Q8_0.gguf": STORIES, "stories-Q4_0.gguf": stories_draft})
    common = ["-p", "Once upon a time", "-n", "8", "--json", "-c", "256", "-t", "1", "--temp", "0", "--mode", "spd"]
    assert main(["generate", "-hf", "someone/Stories-GGUF:q8_0", "-hfd", "someone/Stories-GGUF:Q4_0", *common]) == 0
    tagged = json.loads(capsys.readouterr().out)
    assert main(["generate", "-m", str(STORIES), *common, "--mode", "target"]) == 0
    assert tagged["tokens"] == json.loads(capsys.readouterr().out)["tokens"]
    # no quant: Q4_K_M, else Q8_0
    assert hub.pull_tagged("someone/Stories-GGUF").name == "stories-Q8_0.gguf"
    assert main(["generate", "-hf", "someone/Stories-GGUF:Q5_K_M", *common]) == 1
    err = capsys.readouterr().err
    assert err.strip() == ("fly-cpp: error: Hugging Face repository someone/Stories-GGUF has no GGUF file for quant "
                           "Q5_K_M (files: stories-Q4_0.gguf, stories-Q8_0.gguf)")


def test_offline_pull_fails_fast_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for name in ("HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there: the hub is out of reach
    assert hub.unreachable() is not None
    assert main(["models", "pull", "owner/name", "x.gguf"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "not in the Hugging Face cache" in lines[0] and "cannot reach 127.0.0.1:9" in lines[0]
    assert main(["generate", "-hf", "owner/name", "-p", "x"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "cannot reach 127.0.0.1:9" in lines[0]
