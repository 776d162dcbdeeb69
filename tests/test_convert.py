"""The Hugging Face -> GGUF converter, proven on the real tinystories-656k checkpoint: llama.cpp's
logits equal a numpy forward pass of the safetensors weights, its tokenizer equals the
tokenizer.json BPE, and its greedy text is English."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from fly_cpp import FlyError, SamplingSettings
from fly_cpp.backend.context import Context
from fly_cpp.backend.model import Model
from fly_cpp.cli.main import main
from fly_cpp.models import convert, reference
from tests.conftest import SHARED, TINYSTORIES, needs_tinystories

SRC = TINYSTORIES
pytestmark = needs_tinystories
PROMPTS = ["Once upon a time, there was a little girl named Lily. She",
           "The dog ran to the park and played with a red ball.",
           "Tom said, \"I want to go home!\" His mom"]


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert.convert_hf_llama(SRC, tmp_path_factory.mktemp("convert") / "ts656k.gguf")


@pytest.fixture(scope="module")
def checkpoint() -> tuple[dict, dict[str, np.ndarray]]:
    return convert.load_checkpoint(SRC)


def test_tokenizer_matches_tokenizer_json(converted: Path) -> None:
    texts = PROMPTS + [(SHARED / "corpora" / "tinystories" / "tinystories_sample.txt").read_text(encoding="utf-8")]
    with Model(converted) as m:
        assert (m.vocab_type, m.n_vocab, m.bos, m.eos, m.add_bos) == ("SPM", 2048, 1, 2, True)
        for text in texts:
            text = re.sub(r"[^\x20-\x7e\n]", "", text)  # characters the 2048-token vocabulary has
            assert m.tokenize(text) == reference.hf_bpe_encode(SRC / "tokenizer.json", text)
        assert m.detokenize(m.tokenize("Lily was happy.")[1:]) == " Lily was happy."


def test_logits_match_numpy_reference(converted: Path, checkpoint: tuple) -> None:
    config, tensors = checkpoint
    with Model(converted) as m, Context(m, n_ctx=128, n_threads=2, precise=True) as ctx:
        for prompt in PROMPTS:
            tokens = m.tokenize(prompt)
            ctx.truncate(0)
            got = ctx.decode(tokens, "all").astype(np.float64)  # (n, 2048)
            want = reference.hf_llama_forward(config, tensors, tokens)
            assert got.shape == want.shape
            assert np.max(np.abs(got - want)) < 1e-4, prompt


def test_rotary_permutation_is_needed(checkpoint: tuple) -> None:
    """Without the q/k row permutation llama.cpp would compute something else: the reference
    forward pass on permuted weights (read in HF's convention) differs."""
    config, tensors = checkpoint
    n_head = config["num_attention_heads"]
    bad = dict(tensors)
    for i in range(config["num_hidden_layers"]):
        key = f"model.layers.{i}.self_attn.q_proj.weight"
        bad[key] = convert.permute_rotary(tensors[key], n_head)
    tokens = [1, 80, 147, 201, 282]
    diff = reference.hf_llama_forward(config, bad, tokens) - reference.hf_llama_forward(config, tensors, tokens)
    assert np.max(np.abs(diff[1:])) > 1e-2


def test_greedy_text_is_english(converted: Path) -> None:
    with Model(converted) as m, Context(m, n_ctx=256, n_threads=2) as ctx:
        logits = ctx.decode(m.tokenize("Once upon a time, there was a little"), "last")
        out = []
        for _ in range(80):
            token = int(np.argmax(logits[0]))
            if m.is_eog(token):
                break
            out.append(token)
            logits = ctx.decode([token], "last")
        text = m.detokenize(out)
    words = re.findall(r"[a-z]+", text.lower())
    assert len(words) >= 30, text
    assert sum(c.isalpha() or c in " .,!?'\"\n" for c in text) / len(text) > 0.95, text
    assert {"the", "a", "was", "and"} & set(words), text
    assert len(set(words)) / len(words) > 0.4, text  # not one phrase on repeat
    common = {"the", "a", "was", "and", "to", "she", "he", "her", "his", "it", "in", "they", "with", "said", "day"}
    assert sum(w in common for w in words) / len(words) > 0.2, text


def test_f16_conversion_is_close(converted: Path, tmp_path: Path) -> None:
    half = convert.convert_hf_llama(SRC, tmp_path / "ts656k-f16.gguf", dtype="f16")
    assert half.stat().st_size < converted.stat().st_size * 0.6
    tokens = [1, 80, 147, 201, 282, 215]
    rows = []
    for path in (converted, half):
        with Model(path) as m, Context(m, n_ctx=64, n_threads=2, precise=True) as ctx:
            rows.append(ctx.decode(tokens, "all").copy())
    assert np.max(np.abs(rows[0] - rows[1])) < 0.1
    assert (rows[0].argmax(1) == rows[1].argmax(1)).mean() >= 5 / 6


def test_cli_convert_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.gguf"
    assert main(["models", "convert", str(SRC), str(out)]) == 0
    assert out.read_bytes()[:4] == b"GGUF"
    bad = tmp_path / "bad"
    shutil.copytree(SRC, bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    assert main(["models", "convert", str(bad), str(tmp_path / "x.gguf")]) == 1
    err = capsys.readouterr().err
    assert "not supported" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(FlyError, match="no config.json"):
        convert.convert_hf_llama(tmp_path, tmp_path / "y.gguf")


def test_characters_outside_a_byteless_vocabulary_do_not_crash(converted: Path) -> None:
    """This vocabulary has no <0xNN> byte tokens; llama.cpp would abort the process on 'é'."""
    from fly_cpp import Engine, ModelSettings

    with Engine(ModelSettings(str(converted), n_ctx=256)) as engine:
        tokens = engine.tokenize("Once upon a time, café #1 😀 and")
        assert engine.detokenize(tokens).endswith("caf? ?1 ? and")
        gen = engine.generate("Mia said: «¿qué?» 😀", sampling=SamplingSettings(temperature=0), max_tokens=8).run()
        assert len(gen.tokens) == 8
