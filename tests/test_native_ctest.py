"""The C-level tests (native/tests, run by ctest) from a fresh CMake build of the repository."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("ctest") is None, reason="cmake not on PATH")
def test_ctest(tmp_path: Path) -> None:
    build = tmp_path / "native"
    for cmd in (["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release"],
                ["cmake", "--build", str(build)],
                ["ctest", "--test-dir", str(build), "--output-on-failure"]):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        if proc.returncode != 0 and cmd[0] == "cmake" and "No CMAKE_C_COMPILER could be found" in proc.stdout + proc.stderr:
            pytest.skip("no C compiler")
        assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert "100% tests passed" in proc.stdout
