"""docs/architecture.md's picture of the rooms is drawn from the code (scripts/architecture.py):
every module belongs to a room, and the picture in the doc is the one the code draws now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_rooms_picture_is_current() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "architecture.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr or done.stdout
