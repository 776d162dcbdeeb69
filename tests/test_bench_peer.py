"""The llama.cpp peer: parsing its binaries' output (captured samples in tests/data), argument
checks, and, when FLY_CPP_LLAMA_BIN names a directory of built binaries, one tiny real run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fly_cpp.bench.peer import Peer, generated_text, parse_completion, parse_speculative
from fly_cpp.cli.main import main
from fly_cpp.basics.errors import FlyError
from fly_cpp.models import bundled

DATA = Path(__file__).resolve().parent / "data"
LLAMA_BIN = os.environ.get("FLY_CPP_LLAMA_BIN")


def test_parse_speculative_sample() -> None:
    run = parse_speculative((DATA / "llama-speculative-simple.txt").read_text())
    assert (run.n_prompt, run.n_tokens, run.seconds) == (12, 35, 0.057)
    assert (run.n_draft_max, run.n_drafted, run.n_accept) == (5, 35, 28)
    assert run.n_rounds == 7 and run.mean_accepted == pytest.approx(5.0)
    assert run.tokens_per_second == pytest.approx(35 / 0.057)
    assert run.as_dict()["tokens_per_second"] == run.tokens_per_second


def test_parse_completion_sample() -> None:
    run = parse_completion((DATA / "llama-completion.txt").read_text())
    # eval time and the 31 generated tokens' share of the 32 samplings
    assert (run.n_prompt, run.n_tokens, run.seconds) == (12, 31, pytest.approx((24.98 + 0.48 * 31 / 32) / 1e3))
    assert run.n_rounds == 31 and run.mean_accepted == 1.0


def test_generated_text_after_the_echo() -> None:
    stdout = (DATA / "llama-speculative-simple.txt").read_text().split("0.00.", 1)[0]
    text = generated_text(stdout, "Once upon a time, there was a little dog")
    assert text.startswith(" named Max. Max loved to play") and not text.endswith("\n")
    assert generated_text("no echo here\n\n", "something else") == "no echo here"


@pytest.mark.parametrize("parse", [parse_speculative, parse_completion])
def test_missing_lines_are_one_clear_error(parse) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(FlyError, match="could not find"):
        parse("encoded 3 tokens\nsomething went wrong\n")


def test_peer_arguments(tmp_path: Path) -> None:
    target, draft = str(bundled.TARGET), str(bundled.DRAFT)
    with pytest.raises(FlyError, match="no such directory"):
        Peer(tmp_path / "nope", target, draft, n_ctx=512, n_threads=1)
    with pytest.raises(FlyError, match="llama-speculative-simple not found"):
        Peer(tmp_path, target, draft, n_ctx=512, n_threads=1)
    for name in ("llama-speculative-simple", "llama-completion"):
        (tmp_path / name).write_text("#!/bin/sh\nexit 3\n")
        (tmp_path / name).chmod(0o755)
    peer = Peer(tmp_path, target, draft, n_ctx=512, n_threads=1, repack=False)
    with pytest.raises(FlyError, match=r"llama-speculative-simple failed \(exit 3\)"):
        peer.run("speculative", "Once upon a time", 8, 4)


def test_peer_offloads_what_fly_cpp_offloads(tmp_path: Path) -> None:
    # a GPU build of the binaries offloads every layer unless told: they are told fly-cpp's count
    target, draft = str(bundled.TARGET), str(bundled.DRAFT)
    for name in ("llama-speculative-simple", "llama-completion"):
        (tmp_path / name).write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/{name}.argv\nexit 3\n')
        (tmp_path / name).chmod(0o755)
    for layers, draft_layers, want, want_draft in ((0, 0, "0", "0"), (-1, 7, "all", "7")):
        peer = Peer(tmp_path, target, draft, n_ctx=512, n_threads=1, repack=False, gpu_layers=layers,
                    draft_gpu_layers=draft_layers)
        for kind in ("speculative", "target"):
            with pytest.raises(FlyError):
                peer.run(kind, "Once upon a time", 8, 4)
        spec = (tmp_path / "llama-speculative-simple.argv").read_text().split()
        assert spec[spec.index("-ngl") + 1] == want and spec[spec.index("-ngld") + 1] == want_draft
        plain = (tmp_path / "llama-completion.argv").read_text().split()
        assert plain[plain.index("-ngl") + 1] == want and "-ngld" not in plain


@pytest.mark.skipif(not LLAMA_BIN, reason="set FLY_CPP_LLAMA_BIN to a directory built by scripts/build-llama-cpp.sh")
def test_real_peer_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["bench", "--dataset", "spec_bench", "--limit", "1", "-n", "16", "--k", "4", "--modes", "spd",
                 "--peer-k", "4", "--llama-cpp-bin", str(LLAMA_BIN), "--out", str(out), "--no-plots", "--no-progress"]) == 0
    result = json.loads((out / "results.json").read_text())
    rows = {row["mode"]: row for row in result["summary"]}
    assert list(rows) == ["target", "spd", "llama.cpp-target", "llama.cpp-spd"]
    spd = rows["llama.cpp-spd"]
    assert spd["n_tokens"] > 0 and spd["tokens_per_second"] > 0 and spd["speedup_geomean"] > 0
    assert spd["n_drafted"] > 0 and 1.0 <= spd["mean_accepted"] <= 5.0
    assert rows["llama.cpp-target"]["identical"] == 1.0  # same model, same llama.cpp, greedy
    assert {c["peer"] for c in result["comparisons"]} == {"llama.cpp-target", "llama.cpp-spd"}
    assert "llama.cpp-spd" in (out / "summary.md").read_text()


def test_without_a_draft_model_the_peer_drafts_with_the_targets_mtp_head(tmp_path: Path) -> None:
    name = "llama-speculative-simple"
    for binary in (name, "llama-completion"):
        (tmp_path / binary).write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/{binary}.argv\nexit 3\n')
        (tmp_path / binary).chmod(0o755)
    peer = Peer(tmp_path, str(bundled.TARGET), None, n_ctx=512, n_threads=1, repack=False)
    with pytest.raises(FlyError, match="failed"):
        peer.run("speculative", "Once upon a time", 8, 3)
    argv = (tmp_path / f"{name}.argv").read_text().split()
    assert "-md" not in argv and argv[argv.index("--spec-type") + 1] == "draft-mtp"
    assert argv[argv.index("--spec-draft-n-max") + 1] == "3"


def test_peer_chains_the_ngram_lookup_in_front_of_the_draft_model(tmp_path: Path) -> None:
    target, draft = str(bundled.TARGET), str(bundled.DRAFT)
    for name in ("llama-speculative-simple", "llama-completion"):
        (tmp_path / name).write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/{name}.argv\nexit 3\n')
        (tmp_path / name).chmod(0o755)
    peer = Peer(tmp_path, target, draft, n_ctx=512, n_threads=1, repack=False)
    for spec_type, p_min in (("draft-simple", 0.0), ("ngram-mod,draft-simple", 0.75)):
        with pytest.raises(FlyError):
            peer.run("speculative", "Once upon a time", 8, 5, p_min, spec_type)
        argv = (tmp_path / "llama-speculative-simple.argv").read_text().split()
        assert argv[argv.index("--spec-type") + 1] == spec_type
        assert argv[argv.index("--spec-draft-n-max") + 1] == "5"
        assert argv[argv.index("--spec-draft-p-min") + 1] == f"{p_min:g}"


def test_peer_samples_as_the_bench_does(tmp_path: Path) -> None:
    """``fly-cpp bench --temperature T`` runs llama.cpp's binaries at the same sampling (its
    spellings), so that sampled runs compare side by side; greedy stays --temp 0."""
    from fly_cpp.config import SamplingSettings
    target, draft = str(bundled.TARGET), str(bundled.DRAFT)
    for name in ("llama-speculative-simple", "llama-completion"):
        (tmp_path / name).write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/{name}.argv\nexit 3\n')
        (tmp_path / name).chmod(0o755)
    sampled = SamplingSettings(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=7)
    for sampling, want in ((sampled, "--temp 0.8 --top-k 40 --top-p 0.95 --min-p 0.05 --seed 7"),
                           (SamplingSettings(temperature=0), "--temp 0 --seed 0")):
        peer = Peer(tmp_path, target, draft, n_ctx=512, n_threads=1, repack=False, sampling=sampling)
        for kind, name in (("speculative", "llama-speculative-simple"), ("target", "llama-completion")):
            with pytest.raises(FlyError):
                peer.run(kind, "Once upon a time", 8, 4)
            assert want in (tmp_path / f"{name}.argv").read_text()
