"""`fly-cpp bench` end to end on the bundled pair: outputs, consistency of the numbers, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fly_cpp.cli.main import main

PNG = b"\x89PNG\r\n\x1a\n"


def bench(tmp: Path, *args: str) -> dict:
    out = tmp / "out"
    assert main(["bench", "--limit", "2", "-n", "16", "--out", str(out), "--no-progress", *args]) == 0
    return json.loads((out / "results.json").read_text())


@pytest.fixture(scope="module")
def spec_bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    tmp = tmp_path_factory.mktemp("spec")
    return tmp / "out", bench(tmp)  # --dataset defaults to spec_bench


def by_mode(result: dict, mode: str) -> list[dict]:
    return [r for r in result["records"] if r["mode"] == mode]


def test_outputs_written(spec_bench: tuple[Path, dict]) -> None:
    out, result = spec_bench
    assert [row["mode"] for row in result["summary"]] == ["target", "spd", "fly"]
    assert result["meta"]["n_prompts"] == 2 and len(result["records"]) == 6
    assert result["meta"]["dataset"] == "spec_bench"
    assert set(result["meta"]["files"]) == {"results.json", "summary.md", "speedup_by_category.png", "accepted_lengths.png"}
    for png in ("speedup_by_category.png", "accepted_lengths.png"):
        assert (out / png).read_bytes().startswith(PNG)
    md = (out / "summary.md").read_text()
    assert "| mode | tok/s |" in md
    for mode in ("target", "spd", "fly"):
        assert f"| {mode} |" in md
    # Spec-Bench's first two categories, one prompt each
    assert [r["category"] for r in by_mode(result, "target")] == ["writing", "roleplay"]


def test_reference_and_exact_mode_agree(spec_bench: tuple[Path, dict]) -> None:
    _, result = spec_bench
    for rec in by_mode(result, "target"):
        assert rec["agreement"] == 1.0 and rec["first_divergence"] is None
        assert rec["speedup"] == pytest.approx(1.0) and rec["ideal_speedup"] == pytest.approx(1.0)
    targets = {r["prompt_id"]: r for r in by_mode(result, "target")}
    for rec in by_mode(result, "spd"):  # greedy exact-match decoding writes the target's text
        assert rec["tokens"] == targets[rec["prompt_id"]]["tokens"]
        assert rec["agreement"] == 1.0 and rec["stats"]["n_loose"] == 0
        assert rec["nll"] == pytest.approx(targets[rec["prompt_id"]]["nll"], rel=1e-4)
    rows = {row["mode"]: row for row in result["summary"]}
    assert rows["target"]["speedup_geomean"] == pytest.approx(1.0)
    assert rows["target"]["nll_ratio"] == pytest.approx(1.0)
    assert rows["target"]["mean_accepted"] == pytest.approx(1.0)
    assert rows["spd"]["identical"] == 1.0


def test_plots_are_titled_and_labelled(spec_bench: tuple[Path, dict]) -> None:
    from PIL import Image

    out, result = spec_bench
    for png in ("speedup_by_category.png", "accepted_lengths.png"):
        with Image.open(out / png) as image:
            width, height = image.size
            title = image.text["Title"]  # the figure's title, also in the PNG's metadata
        assert 600 <= width <= 1600 and 300 <= height <= 1200, (png, image.size)
        assert "spec_bench" in title and "stories260K.gguf" in title and "stories260K-draft.gguf" in title


def test_terminal_table_fits_and_legend_fits_the_rows(spec_bench: tuple[Path, dict]) -> None:
    from fly_cpp.bench import report

    _, result = spec_bench
    printed = report.terminal(result)
    assert max(len(line) for line in printed.splitlines()) <= 100
    assert "| mode | tok/s | speedup (geo) | mean acc." in printed and "host ms/rd" not in printed
    assert "llama.cpp" not in printed and "llama.cpp" not in report.markdown(result)
    assert "host ms/rd" in report.markdown(result)  # the details stay in summary.md
    with_peer = {**result, "summary": [*result["summary"], {"mode": "llama.cpp-spd", "peer": True,
                                                            "tokens_per_second": 1.0}]}
    assert "llama.cpp rows:" in report.markdown(with_peer)


def test_counters_consistent(spec_bench: tuple[Path, dict]) -> None:
    _, result = spec_bench
    for rec in result["records"]:
        s = rec["stats"]
        assert s["n_tokens"] == len(rec["tokens"]) <= 16
        assert len(s["accepted_lengths"]) == s["n_rounds"]
        assert sum(s["accepted_lengths"]) >= s["n_tokens"]
        assert s["n_exact"] + s["n_loose"] <= s["n_drafted"]
        assert s["host_seconds"] >= 0 and s["seconds"] >= s["draft_seconds"] + s["target_seconds"] - 1e-9
        assert 0.0 <= rec["agreement"] <= 1.0 and rec["nll"] > 0
    for row in result["summary"]:
        assert sum(row["accepted_length_histogram"].values()) == row["n_rounds"]
        n_eog = sum(r["stats"]["n_eog"] for r in by_mode(result, row["mode"]))
        assert row["mean_accepted"] == pytest.approx((row["n_tokens"] + n_eog) / row["n_rounds"])
        passes = sum(r["stats"]["n_rounds"] - r["stats"]["n_from_prompt"] for r in by_mode(result, row["mode"]))
        assert row["tokens_per_pass"] == pytest.approx((row["n_tokens"] + n_eog) / passes)
        loose = row["accepted_length_histogram_loose"]
        assert all(n <= row["accepted_length_histogram"][k] for k, n in loose.items())
        assert (sum(loose.values()) > 0) == (row["n_loose"] > 0)
        assert row["n_tokens"] == sum(r["stats"]["n_tokens"] for r in by_mode(result, row["mode"]))


def test_gsm8k_k_sweep_and_checker(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = bench(tmp_path, "--dataset", "gsm8k", "--k", "3,5", "--modes", "spd,fly", "--no-plots", "--no-warmup")
    assert [row["mode"] for row in result["summary"]] == ["target", "spd@k3", "spd@k5", "fly@k3", "fly@k5"]
    assert result["meta"]["k"] == [3, 5] and result["meta"]["checker"] == "gsm8k"
    for rec in result["records"]:
        assert set(rec["check"]) == {"passed", "answer", "reference"}
        assert rec["check"]["reference"] in ("18", "3")
        if rec["k"] is not None:
            assert max(rec["stats"]["accepted_lengths"]) <= rec["k"] + 1
    assert all(row["accuracy"] is not None for row in result["summary"])
    assert "| spd@k3 |" in capsys.readouterr().out


def test_custom_jsonl(tmp_path: Path) -> None:
    data = tmp_path / "mine.jsonl"
    rows = [{"prompt": "Once upon a time"}, {"question": "Lily had a dog.", "category": "pets"},
            {"turns": ["The sun was", "second turn"]}, {"text": "Tom ran"}]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    result = bench(tmp_path, "--dataset", str(data), "--modes", "fly", "--no-plots", "--no-fidelity")
    assert result["meta"]["dataset"] == "mine"
    assert {r["category"] for r in result["records"]} == {"mine", "pets"}  # one per category first
    assert "agreement" not in result["records"][0]


@pytest.mark.parametrize("args, message", [
    (["--dataset", "nope"], "unknown dataset 'nope'"),
    (["--dataset", "missing.jsonl"], "dataset file not found"),
    (["--dataset", "spec_bench", "--modes", "spd,warp"], "unknown mode 'warp'"),
    (["--dataset", "spec_bench", "--modes", ","], "--modes is empty"),
    (["--dataset", "spec_bench", "--k", "0"], "every value must be >= 1"),
    (["--dataset", "humaneval", "--offset", "164"], "--offset 164 leaves no prompts to run"),
    (["--dataset", "spec_bench", "--llama-cpp-bin", "/nonexistent"], "no such directory"),
])
def test_bad_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    code = main(["bench", "--out", str(tmp_path / "o"), "--no-progress", *args])
    err = capsys.readouterr().err.strip()
    assert code != 0 and message in err and len(err.splitlines()) == 1
    assert err.startswith("fly-cpp: error:")


def test_bad_jsonl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"answer": "no prompt"}\n')
    assert main(["bench", "--dataset", str(bad), "--out", str(tmp_path / "o")]) == 1
    assert "bad.jsonl:2: no prompt field" in capsys.readouterr().err


def test_resume_keeps_records_and_runs_only_what_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    args = ["bench", "--dataset", "gsm8k", "-n", "12", "--out", str(out), "--no-progress", "--no-plots", "--no-warmup"]
    assert main([*args, "--limit", "2", "--modes", "fly-paper"]) == 0
    first = json.loads((out / "results.json").read_text())
    assert main([*args, "--limit", "3", "--modes", "fly-paper,fly-r50@k4", "--resume"]) == 0
    result = json.loads((out / "results.json").read_text())
    before = {(r["prompt_id"], r["mode"]): r for r in first["records"]}
    after = {(r["prompt_id"], r["mode"]): r for r in result["records"]}
    assert set(after) == {(f"gsm8k/{i}", m) for i in range(3) for m in ("target", "fly-paper", "fly-r50@k4")}
    for key, rec in before.items():  # kept as they were, not run again
        assert after[key]["stats"]["seconds"] == rec["stats"]["seconds"]
    assert [row["mode"] for row in result["summary"]] == ["target", "fly-paper", "fly-r50@k4"]
    assert result["meta"]["complete"] and result["meta"]["n_prompts"] == 3 and result["meta"]["k"] == [4, "auto"]
    assert all(row.get("n_paired") == 3 for row in result["summary"][1:])
    out_text = capsys.readouterr().out
    assert "- fly-r50@k4: won 0, lost 0 of 3, p = 1.000" in out_text
    # nothing left to run: the file stays as it is
    assert main([*args, "--limit", "3", "--modes", "fly-paper", "--resume"]) == 0
    again = json.loads((out / "results.json").read_text())
    assert again["records"] == result["records"]


def test_resume_reads_results_written_before_a_setting_gained_fields(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["bench", "--dataset", "gsm8k", "--modes", "target", "-n", "8", "--out", str(out), "--no-progress",
            "--no-plots", "--no-warmup"]
    assert main([*args, "--limit", "1"]) == 0
    path = out / "results.json"
    older = json.loads(path.read_text())
    del older["meta"]["sampling"]["logit_bias"]  # as an earlier fly-cpp wrote it
    path.write_text(json.dumps(older))
    assert main([*args, "--limit", "2", "--resume"]) == 0
    assert json.loads(path.read_text())["meta"]["n_prompts"] == 2


@pytest.mark.parametrize("change, message", [
    (["-n", "13"], "made with max_tokens 12, this run has 13"),
    (["--temp", "0.5"], "made with sampling"),
    (["--window", "3"], "mode 'fly-paper' ran with other settings (window 6 there, 3 now)"),
    (["--system", "Be brief."], "--system needs a chat template"),
])
def test_resume_refuses_other_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str], change: list[str],
                                       message: str) -> None:
    out = tmp_path / "out"
    args = ["bench", "--dataset", "gsm8k", "--modes", "fly-paper", "--out", str(out), "--no-progress",
            "--no-plots", "--no-warmup"]
    assert main([*args, "-n", "12", "--limit", "1"]) == 0
    capsys.readouterr()
    code = main([*args, "--limit", "2", "--resume", *({"-n": []}.get(change[0], ["-n", "12"])), *change])
    err = capsys.readouterr().err.strip()
    assert code != 0 and message in err and len(err.splitlines()) == 1 and err.startswith("fly-cpp: error:")


def test_a_stopped_run_keeps_its_finished_prompts(tmp_path: Path, stories: Path, stories_draft: Path) -> None:
    from fly_cpp import Engine, ModelSettings
    from fly_cpp.bench import datasets, report
    from fly_cpp.bench.modes import parse_modes
    from fly_cpp.bench.runner import BenchConfig
    from fly_cpp.bench.suite import run_benchmark
    from fly_cpp.config import SpecSettings

    out = tmp_path / "out"
    data = datasets.load("gsm8k")
    modes = parse_modes("fly", [4], SpecSettings())
    config = BenchConfig(max_tokens=8, checker="gsm8k", warmup=False)

    def stop_after_first(partial: dict) -> None:
        report.write(partial, out, with_plots=False)
        raise KeyboardInterrupt

    with Engine(ModelSettings(str(stories)), ModelSettings(str(stories_draft))) as engine:
        with pytest.raises(KeyboardInterrupt):
            run_benchmark(engine, data, modes, config, limit=3, checkpoint=stop_after_first)
        partial = report.read(out)
        assert partial is not None and not partial["meta"]["complete"]
        assert {r["prompt_id"] for r in partial["records"]} == {"gsm8k/0"} and len(partial["records"]) == 2
        assert "partial run" in (out / "summary.md").read_text()
        # a second mode stopped after its first prompt keeps the first mode's other records
        more = parse_modes("fly,spd", [4], SpecSettings())
        first = run_benchmark(engine, data, modes, config, limit=3, previous=partial)
        report.write(first, out, with_plots=False)
        with pytest.raises(KeyboardInterrupt):
            run_benchmark(engine, data, more, config, limit=3, previous=report.read(out), checkpoint=stop_after_first)
        again = report.read(out)
        assert len(again["records"]) == 7 and sum(r["mode"] == "spd" for r in again["records"]) == 1
        done = run_benchmark(engine, data, more, config, limit=3, previous=again)
    assert first["meta"]["complete"] and len(first["records"]) == 6
    assert first["records"][:2] == partial["records"]
    assert done["meta"]["complete"] and len(done["records"]) == 9
    assert [r for r in done["records"] if r["mode"] != "spd"] == json.loads(json.dumps(first["records"]))


def test_cold_runs_every_generation_in_a_fresh_process_with_the_same_text(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FLY_CPP_COSTS", str(tmp_path / "costs.json"))
    monkeypatch.setenv("FLY_CPP_EVIDENCE", str(tmp_path / "evidence.json"))
    cold = bench(tmp_path / "cold", "--cold", "--modes", "spd,fly", "--k", "auto", "--no-plots", "--temperature", "0")
    warm = bench(tmp_path / "warm", "--modes", "spd,fly", "--k", "auto", "--no-plots", "--temperature", "0")
    for mode in ("target", "spd"):  # greedy: spd writes the target's text, warm or cold
        assert [r["tokens"] for r in by_mode(cold, mode)] == [r["tokens"] for r in by_mode(warm, "target")]
    assert all(r["stats"]["n_tokens"] > 0 for r in cold["records"])
