"""pytest plugin for llama-server's own test suite run against ``fly-cpp serve``
(loaded by scripts/llama_server_suite.py with ``-p``).

- the suite's session start downloads every preset's model; offline, only the bundled
  stories260K exists, so that step is skipped (each test starts its own server anyway);
- ``wget`` (imported by the suite's utils.py, used only to download models) is replaced by a
  stand-in that marks the test not runnable;
- a test whose server could not start for want of a model (the wrapper writes $FLY_SUITE_NOTE)
  is reported as skipped with "not runnable: ..." instead of failed.
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

NOTE = Path(os.environ.get("FLY_SUITE_NOTE", "fly-suite-note.txt"))


def _download(url: str, *args: Any, **kwargs: Any) -> str:
    NOTE.write_text(f"download needed: {url}\n")
    raise RuntimeError(f"not available offline: {url}")


# before the suite's conftest imports utils.py, which imports wget
_stub = types.ModuleType("wget")
_stub.download = _download  # type: ignore[attr-defined]
sys.modules.setdefault("wget", _stub)


def pytest_sessionstart(session: pytest.Session) -> None:
    import utils  # the suite's helper, on sys.path through its rootdir conftest

    utils.ServerPreset.load_all = staticmethod(lambda: None)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    NOTE.write_text("")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    outcome = yield
    report = outcome.get_result()
    note = NOTE.read_text().strip() if NOTE.exists() else ""
    if report.failed and note:
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"not runnable: {note}")
