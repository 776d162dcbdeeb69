"""``fly-cpp generate`` as a user runs it: a real subprocess on real models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from fly_cpp.basics.errors import FlyError
from fly_cpp.models import make
from fly_cpp.engine.vocab import check_compatible

from conftest import make_once

FLY = [sys.executable, "-m", "fly_cpp.cli.main"]


def fly(*args: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([*FLY, *args], input=stdin if stdin is not None else "", capture_output=True,
                          text=True, timeout=timeout, env=env)


def one_line_error(result: subprocess.CompletedProcess[str], code: int | None = None) -> str:
    assert result.returncode != 0
    if code is not None:
        assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fly-cpp: error: "), result.stderr
    return lines[0]


def test_bundled_pair_streams_a_story_in_fly_mode():
    r = fly("generate", "-p", "Once upon a time", "-n", "40")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.split()) >= 10
    assert r.stderr.startswith("fly: 40 tokens") and "mean accepted" in r.stderr
    assert "; target on the CPU; draft on the CPU" in r.stderr  # where the layers went (a CPU-only build)


def test_json_output(stories, stories_draft):
    r = fly("generate", "-m", str(stories), "-d", str(stories_draft), "-c", "512", "-p", "Once upon a time",
            "-n", "24", "--mode", "spd", "--k", "4", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) >= {"text", "tokens", "stats"} and len(out["tokens"]) == 24
    stats = out["stats"]
    for key in ("mode", "n_tokens", "n_rounds", "mean_accepted", "n_exact", "n_loose", "n_gate_rejected",
                "seconds", "tokens_per_second"):
        assert key in stats
    assert stats["mode"] == "spd" and stats["n_loose"] == 0 and stats["n_tokens"] == 24


def test_prompt_from_stdin_and_file(tmp_path):
    a = fly("generate", "-n", "12", "--json", "--temp", "0", stdin="Once upon a time")  # greedy: the same text
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Once upon a time")
    b = fly("generate", "-n", "12", "--json", "--temp", "0", "-f", str(prompt))
    assert a.returncode == b.returncode == 0
    assert json.loads(a.stdout)["tokens"] == json.loads(b.stdout)["tokens"]


def test_all_modes_and_options_run():
    for args in (["--mode", "target"], ["--mode", "spd", "--no-ngram"], ["--window", "4", "--entropy-threshold", "inf"],
                 ["--temperature", "0.7", "--seed", "3", "--top-k", "20"], ["--k", "1"]):
        r = fly("generate", "-p", "Once upon a time", "-n", "16", *args)
        assert r.returncode == 0, (args, r.stderr)


def test_missing_model_file():
    line = one_line_error(fly("generate", "-m", "/nonexistent/model.gguf", "-p", "hi"), 1)
    assert "not found" in line and "/nonexistent/model.gguf" in line


def test_non_gguf_file(tmp_path):
    bogus = tmp_path / "notes.gguf"
    bogus.write_text("this is not a model")
    line = one_line_error(fly("generate", "-m", str(bogus), "-p", "hi"), 1)
    assert "not a GGUF file" in line


@pytest.fixture(scope="module")
def spm32k_model(models_dir: Path, vocabs: Path) -> Path:
    return make_once(models_dir / "spm32k-random.gguf", lambda out: make.random_llama(
        vocabs / "ggml-vocab-llama-spm.gguf", out, n_embd=32, n_layer=1, n_head=2, seed=3))


def test_incompatible_vocabularies(stories, spm32k_model):
    line = one_line_error(fly("generate", "-m", str(stories), "-d", str(spm32k_model), "-p", "hi"), 1)
    assert "cannot draft for target" in line and "vocabulary size" in line and "512" in line and "32000" in line


def test_prompt_longer_than_context():
    line = one_line_error(fly("generate", "-c", "16", "-p", "Once upon a time " * 100), 1)
    assert "longer than the context" in line and "n_ctx=" in line


@pytest.mark.parametrize("args, words", [
    (["--k", "-1"], "k must be >= 0"),
    (["--temperature", "-1"], "temperature must be >= 0"),
    (["--mode", "fast"], "'fast' is not one of"),
    (["-n", "-3"], "-3 is not in the range"),
    (["--window", "-1"], "window must be >= 0"),
    (["--top-p", "0"], "top_p must be in (0, 1]"),
    (["--bogus"], "No such option '--bogus'"),
])
def test_bad_options(args, words):
    r = fly("generate", "-p", "hi", *args)
    assert words in one_line_error(r)


def test_no_prompt_is_a_usage_error():
    assert "no prompt" in one_line_error(fly("generate"), 2)


def test_draft_without_target(stories_draft):
    assert "needs a target" in one_line_error(fly("generate", "-d", str(stories_draft), "-p", "hi"), 2)


@dataclass
class FakeVocab:
    """A vocabulary description for bookkeeping tests of the compatibility rules."""

    name: str = "fake.gguf"
    vocab_type: str = "BPE"
    n_vocab: int = 100
    bos: int = 1
    eos: int = 2
    add_bos: bool = True
    add_eos: bool = False
    swap: int = -1

    def token_text(self, token: int) -> bytes:
        return b"other" if token == self.swap else f"t{token}".encode()


@pytest.mark.parametrize("change, words", [
    (dict(vocab_type="SPM"), "vocabulary type differs (target BPE, draft SPM)"),
    (dict(bos=0), "BOS token id differs"),
    (dict(eos=7), "EOS token id differs"),
    (dict(add_bos=False), "add-BOS flag differs"),
    (dict(n_vocab=229), "vocabulary size"),
    (dict(swap=42), "text of token 42 differs"),
])
def test_vocab_rules(change, words):
    check_compatible(FakeVocab(), FakeVocab(n_vocab=228))  # within 128 of each other: fine
    with pytest.raises(FlyError, match=words.replace("(", r"\(").replace(")", r"\)")):
        check_compatible(FakeVocab(), FakeVocab(name="d.gguf", **change))


def test_profile_prints_the_cost_curve_at_two_depths_within_the_context():
    r = fly("profile", "--engine", "--skip-table", "-n", "8", "--runs", "1", "-c", "256", "--recalibrate")  # not a curve another test cached deeper
    assert r.returncode == 0, r.stderr
    depths = [int(line.split()[1]) for line in r.stdout.splitlines() if line.endswith("tokens of context")]
    assert len(depths) == 2 and depths[0] < depths[1] == 256


def test_llama_cpp_habits_carry_over(tmp_path):
    """-no-cnv is accepted, --no-display-prompt hides the prompt, -p's escapes are processed as
    llama.cpp does (--no-escape keeps them; a -f file is read as it is), --k 0 is the target alone."""
    plain = fly("generate", "-p", "Once\nupon a time", "-n", "8", "--temp", "0", "--mode", "target")
    assert plain.returncode == 0, plain.stderr
    escaped = fly("generate", "-p", "Once\\nupon a time", "-n", "8", "--temp", "0", "-no-cnv", "--k", "0")
    assert escaped.returncode == 0, escaped.stderr
    assert escaped.stdout == plain.stdout and escaped.stderr.startswith("target: 8 tokens")
    kept = fly("generate", "-p", "Once\\nupon", "-n", "2", "--temp", "0", "--no-escape", "--no-display-prompt")
    hidden = fly("generate", "-p", "Once\\nupon", "-n", "2", "--temp", "0", "--no-display-prompt")
    assert kept.returncode == hidden.returncode == 0 and not kept.stdout.startswith("Once")
    (tmp_path / "p.txt").write_text("Once\\nupon")
    as_is = fly("generate", "-f", str(tmp_path / "p.txt"), "-n", "2", "--temp", "0")
    assert as_is.returncode == 0 and as_is.stdout.startswith("Once\\nupon")
