"""scripts/replay_pacer.py on a small bench run of the bundled pair: it re-renders the run's
prompts, replays every policy against the draft's trace and prints one row per policy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fly_cpp.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


def test_replays_a_bench_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main(["bench", "--limit", "3", "-n", "24", "--modes", "target,spd@k3", "--out", str(out),
                 "--no-progress", "--no-plots", "--no-fidelity"]) == 0
    run = json.loads((out / "results.json").read_text())
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "replay_pacer.py"), str(out / "results.json"),
                           "--dataset", "spec_bench", "--policies", "auto,oracle,spd@k3,spd-plain@k3p0.5"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in done.stdout.splitlines() if line.startswith("| ") and not line.startswith("| policy")}
    assert list(rows) == ["target", "auto", "oracle", "spd@k3", "spd-plain@k3p0.5"]
    assert done.stdout.startswith(f"{run['meta']['n_prompts']} prompts")
    # columns: the category, all, tok/s replayed, tok/s measured, mean accepted, draft lengths
    assert rows["target"][1] == "1.000" and rows["target"][4] == "1.00"
    assert float(rows["oracle"][1]) >= 1.0  # it drafts only what will be kept, and only where that pays
    assert float(rows["spd@k3"][4]) > 1.0 and rows["spd@k3"][3] != "-"  # the run measured spd@k3 too
    assert rows["auto"][3] == "-"
