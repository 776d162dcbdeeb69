"""k auto replayed over recorded runs (``tests/data/replays``, made by ``scripts/replay_pacer.py
--save``): the traces of real runs and their pairs' measured cost curves, replayed with no models
and no clock, must give the tables stored beside them to the last digit. A change to the
controller that moves a number shows here which recordings it moves and by how much; where that
is meant, the change is shown to be no loss on every recording and the tables are written anew:

    python scripts/replay_pacer.py tests/data/replays/NAME.json.gz --policies POLICIES > tests/data/replays/NAME.md
    python scripts/replay_pacer.py tests/data/replays/NAME.json.gz --policies GPU_POLICIES \\
        --curves tests/data/replays/gpu-shaped.json > tests/data/replays/NAME.gpu.md
    python scripts/replay_pacer.py tests/data/replays/NAME.json.gz --policies POLICIES --fresh \\
        > tests/data/replays/NAME.fresh.md
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "replays"
POLICIES = "auto,spd@k3,spd@k5,spd@k8"
# on a GPU: k auto's steady rounds (``Pacer.steady``) beside the fixed k it replaced (k_gpu 6) and longer ones
GPU_POLICIES = "auto,steady,spd@k3,spd@k5,spd@k6,spd@k8,spd@k12,spd@k16"
RECORDINGS = sorted(DATA.glob("*.json.gz"))
# each recording at its own curves, at the GPU-shaped ones, and as a pair's first answers (``--fresh``:
# k auto starts anew on every prompt, nothing learned: how a first-ever run meets each text)
CASES = [(rec, curves, False) for rec in RECORDINGS for curves in (None, DATA / "gpu-shaped.json")] + \
    [(rec, None, True) for rec in RECORDINGS]


def replayed(recording: Path, curves: Path | None, fresh: bool = False) -> str:
    cmd = [sys.executable, str(ROOT / "scripts" / "replay_pacer.py"), str(recording), "--policies",
           POLICIES if curves is None else GPU_POLICIES]
    if curves is not None:
        cmd += ["--curves", str(curves)]
    if fresh:
        cmd += ["--fresh"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout


def expected(recording: Path, curves: Path | None, fresh: bool = False) -> Path:
    stem = recording.name.removesuffix(".json.gz")
    return DATA / (f"{stem}.gpu.md" if curves is not None else f"{stem}.fresh.md" if fresh else f"{stem}.md")


def test_the_recordings_are_there() -> None:
    assert len(RECORDINGS) >= 3
    assert all(expected(rec, curves, fresh).exists() for rec, curves, fresh in CASES)


@pytest.mark.parametrize("recording,curves,fresh", CASES,
                         ids=[f"{r.name.removesuffix('.json.gz')}{'-gpu' if c else ''}{'-fresh' if f else ''}"
                              for r, c, f in CASES])
def test_a_recording_replays_to_its_table(recording: Path, curves: Path | None, fresh: bool) -> None:
    assert replayed(recording, curves, fresh) == expected(recording, curves, fresh).read_text(encoding="utf-8")
