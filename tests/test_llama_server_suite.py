"""llama-server's own test suite against ``fly-cpp serve`` (scripts/llama_server_suite.py), its
fast files only: the pass counts must not fall below the floors recorded in docs/server-compat.md.

Run with ``pytest -m llama_server_suite``; skipped when the llama-cpp-python sdist cannot be
fetched (offline, no cached copy)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"
sys.path.insert(0, str(SCRIPTS))
import llama_server_suite as suite  # noqa: E402

# the fewest passing tests per fast file (raise them as fixes land)
FLOORS = {"test_tokenize": 3, "test_security": 22, "test_basic": 7, "test_template": 35, "test_compat_anthropic": 24,
          "test_sleep": 4, "test_ignore_eos": 2, "test_ctx_shift": 5, "test_metrics": 9, "test_tool_call": 6}

pytestmark = pytest.mark.llama_server_suite


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    work = suite.WORK
    try:
        suite.fetch(work, importlib.metadata.version("llama_cpp_python"))
    except FileNotFoundError as exc:
        pytest.skip(f"llama-server's tests are not available offline: {exc}")
    out = tmp_path_factory.mktemp("suite") / "results.json"
    done = subprocess.run([sys.executable, str(SCRIPTS / "llama_server_suite.py"), "--work", str(work),
                           "--json", str(out), "--port", "8321", *FLOORS], capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr
    return {row["file"]: row for row in json.loads(out.read_text())["files"]}


@pytest.mark.parametrize("name", sorted(FLOORS))
def test_no_regression(results: dict[str, dict[str, object]], name: str) -> None:
    row = results[name]
    assert "error" not in row or "passed" in row, row
    assert int(row["passed"]) >= FLOORS[name], f"{name}: {row['passed']} passed < {FLOORS[name]}: {row['failures']}"
