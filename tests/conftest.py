"""Shared fixtures: real GGUF models, built once per test session with the project's own kit.

Assets come from ../shared (override with FLY_CPP_SHARED). Models are made in seconds:
- stories260K (a real trained tiny llama) and a Q4_0 draft derived from it;
- a random-weight llama on the real Llama-3 vocabulary (128256 tokens) with two derived drafts
  (first-layers copy and Q8_0 copy).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fly_cpp.models import make

# Tiny models run fastest on one thread, and ggml's spinning thread barriers crawl when the
# machine is busy: every engine in the tests (subprocesses included) uses one thread.
os.environ.setdefault("FLY_CPP_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("FLY_CPP_SHARED", ROOT.parent / "shared"))
STORIES = SHARED / "models" / "stories260K" / "stories260K.gguf"
TOKENIZERS = SHARED / "tokenizers"


def pytest_configure(config: pytest.Config) -> None:
    if not STORIES.exists():
        raise pytest.UsageError(f"test assets not found at {SHARED} (set FLY_CPP_SHARED)")


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def stories() -> Path:
    return STORIES


@pytest.fixture(scope="session")
def stories_draft(models_dir: Path) -> Path:
    """A draft derived from stories260K with llama.cpp's quantizer."""
    return make_once(models_dir / "stories260K-q4_0.gguf", lambda out: make.quantize(STORIES, out, "Q4_0"))


@pytest.fixture(scope="session")
def llama3_target(models_dir: Path) -> Path:
    """Random weights on the real Llama-3 vocabulary (128256 tokens)."""
    return make_once(models_dir / "llama3-random.gguf", lambda out: make.random_llama(
        TOKENIZERS / "ggml-vocab-llama-bpe.gguf", out, n_embd=64, n_layer=4, n_head=4, n_ctx=1024, seed=1))


@pytest.fixture(scope="session")
def llama3_drafts(models_dir: Path, llama3_target: Path) -> dict[str, Path]:
    """Drafts derived from the random Llama-3-vocab target: its first 2 layers, and Q8_0."""
    return {
        "cut2": make_once(models_dir / "llama3-cut2.gguf", lambda out: make.cut_layers(llama3_target, out, 2)),
        "q8_0": make_once(models_dir / "llama3-q8_0.gguf", lambda out: make.quantize(llama3_target, out, "Q8_0")),
    }


def make_once(path: Path, build) -> Path:  # type: ignore[no-untyped-def]
    if not path.exists():
        tmp = path.with_suffix(".partial")
        build(tmp)
        tmp.rename(path)
    return path


@pytest.fixture(scope="session")
def period_is_eos(stories: Path, models_dir: Path) -> Path:
    """stories260K never emits EOS (its stories end with BOS); this copy's EOS is '.'."""
    from fly_cpp._llama import Model

    with Model(stories, vocab_only=True) as m:
        period = m.tokenize(".", add_special=False)[-1]
    return make_once(models_dir / "stories-period-eos.gguf", lambda out: make.with_metadata(
        stories, out, **{"tokenizer.ggml.eos_token_id": period}))
