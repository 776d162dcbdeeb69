"""scripts/round_prices.py: a bench run's recorded rounds priced at cost curves, with no models
and no clock. The recordings in ``tests/data/rounds`` (bench results.json files, gzipped) must
price to the tables stored beside them, to the last digit; where a change is meant to move them:

    python scripts/round_prices.py tests/data/rounds/NAME.json.gz RATIOS > tests/data/rounds/NAME.md
    python scripts/round_prices.py tests/data/rounds/NAME.json.gz RATIOS \\
        --curves tests/data/replays/gpu-shaped.json > tests/data/rounds/NAME.gpu.md
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "rounds"
GPU_SHAPED = ROOT / "tests" / "data" / "replays" / "gpu-shaped.json"
RECORDINGS = sorted(DATA.glob("*.json.gz"))
RATIOS = [f"--ratio=fly@k{k}/spd@k{k}" for k in (8, 12, 16)] + [f"--ratio=spd@k{k}/target" for k in (8, 12, 16)]
CASES = [(rec, curves) for rec in RECORDINGS for curves in (None, GPU_SHAPED)]


def priced(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "round_prices.py"), *args],
                          capture_output=True, text=True, timeout=120)


def test_the_recordings_are_there() -> None:
    assert RECORDINGS
    assert all((DATA / f"{rec.name.removesuffix('.json.gz')}{'.gpu' if c else ''}.md").exists() for rec, c in CASES)


@pytest.mark.parametrize("recording,curves", CASES,
                         ids=[f"{r.name.removesuffix('.json.gz')}{'-gpu' if c else ''}" for r, c in CASES])
def test_a_recording_prices_to_its_table(recording: Path, curves: Path | None) -> None:
    done = priced(str(recording), *RATIOS, *(["--curves", str(curves)] if curves else []))
    assert done.returncode == 0, done.stderr
    stem = recording.name.removesuffix(".json.gz")
    assert done.stdout == (DATA / f"{stem}{'.gpu' if curves else ''}.md").read_text(encoding="utf-8")


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    recording = RECORDINGS[0]
    done = priced(str(recording), "--ratio", "fly@k99/spd@k12")
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "the run's modes are" in done.stderr
    done = priced(str(recording), "--ratio", "fly@k12")
    assert done.returncode == 2 and "A/B" in done.stderr
    done = priced(str(tmp_path / "missing.json"))
    assert done.returncode == 1 and done.stderr.startswith("error: ") and done.stderr.count("\n") == 1
    no_auto = tmp_path / "fixed.json"  # no k auto record: no curves to price at unless --curves names some
    no_auto.write_text(json.dumps({"records": [{"mode": "spd@k8", "prompt_id": "p", "stats": {}}]}))
    done = priced(str(no_auto))
    assert done.returncode == 1 and "no k auto record" in done.stderr and done.stderr.count("\n") == 1
    assert priced(str(no_auto), "--curves", str(GPU_SHAPED)).returncode == 0


def test_an_answer_ended_at_its_first_token_leaves_the_ratios(tmp_path: Path) -> None:
    """An exact mode's one-token answer (its token from the prompt's row: no pass, no cost) is
    counted in its mode's row but cannot enter a per-prompt ratio."""
    def stats(drafted: dict[str, int], tokens: int, rounds: int, first: float, seconds: float) -> dict:
        return {"n_prompt": 10, "n_tokens": tokens, "n_eog": 1, "n_rounds": rounds, "n_asked": 0, "n_loose": 0,
                "draft_lengths": drafted, "first_seconds": first, "seconds": seconds,
                "tokens_per_second": tokens / seconds if seconds else 0.0}
    records = [{"mode": "spd@k4", "prompt_id": "a", "stats": stats({"0": 1}, 0, 1, 0.0, 0.0)},
               {"mode": "fly@k4", "prompt_id": "a", "stats": stats({"4": 1}, 0, 1, 0.01, 0.01)},
               {"mode": "spd@k4", "prompt_id": "b", "stats": stats({"0": 1, "4": 2}, 9, 3, 0.0, 0.02)},
               {"mode": "fly@k4", "prompt_id": "b", "stats": stats({"4": 2}, 9, 2, 0.01, 0.02)}]
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"records": records}))
    done = priced(str(run), "--curves", str(GPU_SHAPED), "--ratio", "fly@k4/spd@k4")
    assert done.returncode == 0, done.stderr
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in done.stdout.splitlines()
            if line.startswith("| ") and not line.startswith(("| mode", "| ratio"))}
    assert rows["spd@k4"][:2] == ["2", "5.50"]  # 9 tokens + 2 end tokens in 2 passes: the prompt's row is none
    assert rows["fly@k4"][:2] == ["2", "3.67"]  # 11 in 3
    assert rows["fly@k4 / spd@k4"] == ["1.000"]  # prompt b alone, where both decoded the same passes
