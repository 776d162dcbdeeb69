"""Derived drafts: quantized and first-N-layer copies of a target, each with its greedy
agreement; types the tensor shapes forbid are skipped with a reason, not attempted."""

from __future__ import annotations

from pathlib import Path

import pytest

from fly_cpp.backend.model import Model
from fly_cpp.cli.main import main
from fly_cpp.models import convert, derive, measure, widen
from tests.conftest import STORIES, TINYSTORIES, needs_tinystories

SRC = TINYSTORIES


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tinystories-656k as GGUF: 128 wide, so K-quants (256-value blocks) do not fit."""
    return convert.convert_hf_llama(SRC, tmp_path_factory.mktemp("derive") / "ts.gguf")


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same model grown to 256 wide (function unchanged), so K-quants fit."""
    return widen.grow_checkpoint(SRC, tmp_path_factory.mktemp("derive-wide") / "wide.gguf",
                                 widen.Growth(n_embd=256, n_ff=512, n_layer=2), dtype="f32")


@needs_tinystories
def test_quant_obstacles(tiny: Path, wide: Path) -> None:
    assert derive.quant_obstacle(tiny, "Q8_0") is None
    assert derive.quant_obstacle(tiny, "q4_0") is None
    reason = derive.quant_obstacle(tiny, "Q4_K_M")
    assert reason is not None and "128" in reason and "256" in reason
    assert derive.quant_obstacle(wide, "Q4_K_M") is None
    assert "unknown" in (derive.quant_obstacle(tiny, "Q3_XYZ") or "")


@needs_tinystories
def test_derive_reports_agreement_and_skips(tiny: Path, tmp_path: Path) -> None:
    results = {d.name: d for d in derive.derive(tiny, tmp_path, quants=("Q8_0", "Q4_K_M", "Q4_0"), layers=(1, 9),
                                                     n_threads=1, n_tokens=32)}
    q8, q4, cut = results["ts-q8_0.gguf"], results["ts-q4_0.gguf"], results["ts-first1.gguf"]
    assert results["ts-q4_k_m.gguf"].path is None and results["ts-q4_k_m.gguf"].note.startswith("skipped")
    assert results["ts-first9.gguf"].path is None and "2 layers" in results["ts-first9.gguf"].note
    assert q8.agreement is not None and q8.agreement >= 0.9
    assert q4.agreement is not None and 0.5 <= q4.agreement <= q8.agreement
    assert cut.agreement is not None and cut.agreement < q8.agreement
    assert q4.size_bytes < q8.size_bytes < tiny.stat().st_size
    with Model(cut.path) as m:
        assert m.meta("llama.block_count") == "1"
    skipped = derive.derive(tiny, tmp_path, quants=("Q8_0",), agree=False)  # reuses the file
    assert skipped[0].path == q8.path and skipped[0].agreement is None


@needs_tinystories
def test_k_quant_of_a_wide_model(wide: Path, tmp_path: Path) -> None:
    [d] = derive.derive(wide, tmp_path, quants=("Q4_K_M",), n_threads=1, n_tokens=32)
    assert d.path is not None and d.agreement is not None and d.agreement >= 0.6


@needs_tinystories
def test_agreement_of_a_model_with_itself_is_one(tiny: Path) -> None:
    result = measure.greedy_agreement(tiny, tiny, measure.PROMPTS[:2], n_tokens=16, n_threads=1)
    assert result.rate == 1.0 and result.positions > 0 and len(result.per_prompt) == 2


@needs_tinystories
def test_cli_derive(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "derive", str(tiny), "--quant", "Q8_0", "--quant", "Q6_K", "--layers", "1",
                 "--out", str(tmp_path), "-t", "1", "-n", "16"]) == 0
    out = capsys.readouterr().out
    assert "ts-q6_k.gguf: skipped" in out
    assert str(tmp_path / "ts-q8_0.gguf") in out and "agreement" in out
    assert "ts-first1.gguf" in out


@needs_tinystories
def test_cli_check(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    [q8] = derive.derive(tiny, tmp_path, quants=("Q8_0",), agree=False)
    assert main(["models", "check", str(tiny), str(q8.path), "-n", "8", "-p", "Once upon a time", "-t", "1"]) == 0
    out = capsys.readouterr().out
    assert "compatible" in out and "greedy agreement:" in out
    assert main(["models", "check", str(tiny), str(STORIES)]) == 1
    assert "cannot draft" in capsys.readouterr().err


def test_partial_fallback_is_made_and_noted(stories: Path, tmp_path: Path) -> None:
    """stories260K's FFN is 172 wide: Q8_0 fits every tensor but ffn_down, which llama.cpp
    stores in another type; the copy is made and says so."""
    assert derive.quant_fallbacks(stories, "Q8_0") == [f"blk.{i}.ffn_down.weight" for i in range(5)]
    [d] = derive.derive(stories, tmp_path, quants=("Q8_0",), agree=False)
    assert d.path is not None and "5 tensors in another type" in d.note
