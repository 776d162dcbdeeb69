"""The kit's local pairs. The cost-realistic pair is too big for tests, so its builder runs here
at a small size: growing without noise keeps the trained model's logits, noise lowers the
agreement it is tuned by, builds are deterministic, and the files say they are synthetic."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from fly_cpp import FlyError
from fly_cpp.backend.context import Context
from fly_cpp.backend.model import Model
from fly_cpp.cli.main import main
from fly_cpp.models import convert, kit, measure, reference, widen
from tests.conftest import TINYSTORIES, needs_tinystories

SRC = TINYSTORIES
SMALL_TARGET = widen.Growth(n_embd=256, n_ff=768, n_layer=4, noise=0.05, seed=1)
SMALL_DRAFT = widen.Growth(n_embd=128, n_ff=384, n_layer=2, noise=0.0, seed=2)


@pytest.fixture(scope="module")
def small_pair(tmp_path_factory: pytest.TempPathFactory) -> kit.LocalPair:
    return kit.make_pair("costly", tmp_path_factory.mktemp("costly"), target_growth=SMALL_TARGET,
                         draft_growth=SMALL_DRAFT)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@needs_tinystories
def test_growth_without_noise_keeps_the_logits(tmp_path: Path) -> None:
    """Wider (orthogonal residual basis, extra heads and FFN units) and deeper (identity blocks):
    the same function as the checkpoint, checked against the numpy reference."""
    grown = widen.grow_checkpoint(SRC, tmp_path / "grown.gguf", widen.Growth(n_embd=192, n_ff=512, n_layer=5, seed=3),
                                  dtype="f32")
    config, tensors = convert.load_checkpoint(SRC)
    with Model(grown) as m, Context(m, n_ctx=64, n_threads=2, precise=True) as ctx:
        assert m.meta("llama.block_count") == "5" and m.meta("llama.embedding_length") == "192"
        assert m.meta("llama.attention.head_count") == "12" and m.meta("llama.attention.head_count_kv") == "6"
        assert "grown" in (m.meta("fly_cpp.synthetic") or "")
        tokens = m.tokenize("Once upon a time, there was a big dog. The dog")
        got = ctx.decode(tokens, "all").astype(np.float64)
    want = reference.hf_llama_forward(config, tensors, tokens)
    assert np.max(np.abs(got - want)) < 1e-4


@needs_tinystories
def test_growth_rejects_shrinking() -> None:
    config, tensors = convert.load_checkpoint(SRC)
    with pytest.raises(FlyError, match="cannot shrink"):
        widen.grow(convert.hparams_of(config), convert.gguf_tensors(config, tensors), widen.Growth(64, 384, 2))


@needs_tinystories
def test_noise_sets_the_agreement(tmp_path: Path, small_pair: kit.LocalPair) -> None:
    quiet = widen.grow_checkpoint(SRC, tmp_path / "quiet.gguf", SMALL_TARGET.__class__(256, 768, 4, 0.0, 1))
    prompts = measure.PROMPTS[:3]
    exact = measure.greedy_agreement(quiet, small_pair.draft, prompts, n_tokens=32, n_threads=1).rate
    noisy = measure.greedy_agreement(small_pair.target, small_pair.draft, prompts, n_tokens=32, n_threads=1).rate
    assert exact >= 0.95  # F16 rounding only
    assert 0.3 < noisy < exact


@needs_tinystories
def test_costly_pair_files(small_pair: kit.LocalPair) -> None:
    assert small_pair.synthetic and small_pair.label == "costly (synthetic)"
    assert "synthetic" in small_pair.target.name and "synthetic" in small_pair.draft.name
    recipe = json.loads((small_pair.target.parent / "recipe.json").read_text())
    assert recipe["target"]["noise"] == SMALL_TARGET.noise and recipe["draft"]["n_layer"] == 2
    with Model(small_pair.target) as t, Model(small_pair.draft) as d:
        assert t.meta("fly_cpp.synthetic") and d.meta("fly_cpp.synthetic")
        assert "synthetic" in (t.meta("general.name") or "")
        assert t.n_params > 2 * d.n_params
        assert t.meta("llama.context_length") == "512"


@needs_tinystories
def test_costly_pair_is_deterministic_and_cached(small_pair: kit.LocalPair, tmp_path: Path) -> None:
    again = kit.make_pair("costly", tmp_path, target_growth=SMALL_TARGET, draft_growth=SMALL_DRAFT)
    assert _sha(again.target) == _sha(small_pair.target) and _sha(again.draft) == _sha(small_pair.draft)
    mtime = again.target.stat().st_mtime_ns
    kit.make_pair("costly", tmp_path, target_growth=SMALL_TARGET, draft_growth=SMALL_DRAFT)
    assert again.target.stat().st_mtime_ns == mtime  # same recipe: not rebuilt
    other = kit.make_pair("costly", tmp_path, target_growth=widen.Growth(256, 768, 4, 0.05, seed=7),
                          draft_growth=SMALL_DRAFT)
    assert _sha(other.target) != _sha(small_pair.target)  # another seed, another model


def test_default_costly_recipe_is_cost_realistic() -> None:
    """The real recipe (not built here): hundreds of MB of F16 weights, a draft ~20x smaller."""
    def params(g: widen.Growth) -> int:
        d, f, heads_dim = g.n_embd, g.n_ff, g.n_embd  # q and o: d x d; k and v: d/2 x d (GQA 2)
        return g.n_layer * (2 * d * heads_dim + d * d + 3 * d * f) + 2 * 2048 * d
    target, draft = params(kit.COSTLY_TARGET), params(kit.COSTLY_DRAFT)
    assert 200e6 < target < 400e6 and 5e6 < draft < 30e6
    assert 0 < kit.COSTLY_TARGET.noise < 0.2 and kit.COSTLY_DRAFT.noise == 0


@needs_tinystories
def test_tinystories_pair_and_pair_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FLY_CPP_CACHE", str(tmp_path / "cache"))
    assert kit.built("tinystories") is None
    assert main(["models", "make-pair", "tinystories"]) == 0
    out = capsys.readouterr().out
    pair = kit.built("tinystories")
    assert pair is not None and str(pair.target) in out and str(pair.draft) in out
    assert main(["generate", "--pair", "tinystories", "-p", "Once upon a time", "-n", "12", "--json", "-t", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert len(result["tokens"]) == 12 and result["text"].strip()
    assert main(["models", "list"]) == 0
    listing = capsys.readouterr().out
    assert "costly (synthetic)" in listing and str(pair.target) in listing
    assert main(["generate", "--pair", "tinystories", "-m", str(pair.target), "-p", "x"]) == 2
    assert "--pair" in capsys.readouterr().err


@needs_tinystories
def test_growth_tensor_by_tensor_keeps_the_logits_and_is_deterministic(tmp_path: Path) -> None:
    """``grow_large`` (the big pair's): the same growth made one tensor at a time on every core,
    so an 8B-class target needs no more memory than its largest tensor."""
    g = widen.Growth(n_embd=192, n_ff=512, n_layer=5, seed=3)
    grown = widen.grow_large(SRC, tmp_path / "grown.gguf", g, dtype="f32")
    config, tensors = convert.load_checkpoint(SRC)
    with Model(grown) as m, Context(m, n_ctx=64, n_threads=2, precise=True) as ctx:
        assert m.meta("llama.block_count") == "5" and "grown" in (m.meta("fly_cpp.synthetic") or "")
        tokens = m.tokenize("Once upon a time, there was a big dog. The dog")
        got = ctx.decode(tokens, "all").astype(np.float64)
    assert np.max(np.abs(got - reference.hf_llama_forward(config, tensors, tokens))) < 1e-4
    noisy = widen.Growth(n_embd=256, n_ff=768, n_layer=4, noise=0.05, seed=1)
    a = widen.grow_large(SRC, tmp_path / "a.gguf", noisy)
    assert _sha(a) == _sha(widen.grow_large(SRC, tmp_path / "b.gguf", noisy))
    draft = widen.grow_large(SRC, tmp_path / "d.gguf", SMALL_DRAFT)
    rate = measure.greedy_agreement(a, draft, measure.PROMPTS[:3], n_tokens=32, n_threads=1).rate
    assert 0.3 < rate < 0.95  # the noise sets the agreement, as grow()'s does


@needs_tinystories
def test_big_pair_is_made_at_a_small_size_and_refuses_a_disk_it_would_fill(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    pair = kit.make_pair("big", tmp_path / "big", target_growth=SMALL_TARGET, draft_growth=SMALL_DRAFT)
    assert pair.synthetic and pair.label == "big (synthetic)"
    assert json.loads((pair.target.parent / "recipe.json").read_text())["made"] == "tensor by tensor"
    monkeypatch.setattr(kit.shutil, "disk_usage", lambda path: type("U", (), {"free": 10 << 30})())
    with pytest.raises(FlyError, match=r"pair big writes 14\.6 GB into .*, which has 10\.7 GB free"):
        kit.make_pair("big", tmp_path / "full")


def test_default_big_recipe_is_gpu_shaped() -> None:
    """The real recipe (not built here): an 8B-class F16 target, a two-layer draft."""
    target, draft = kit.BIG_TARGET, kit.BIG_DRAFT
    assert 12e9 < kit.written_bytes("big") < 18e9
    assert draft.n_layer == 2 and draft.noise == 0 and target.noise == kit.COSTLY_TARGET.noise
    assert target.n_layer * target.n_embd * target.n_ff > 100 * draft.n_layer * draft.n_embd * draft.n_ff
