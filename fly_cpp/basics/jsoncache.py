"""Small JSON caches under fly-cpp's cache directory: one object of entries by key, the oldest
dropped beyond a bound, written atomically (a reader never sees half a file; of two writers
the last one wins), and silently skipped where the directory is read-only."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

_lock = threading.Lock()


def load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def store(path: Path, key: str, entry: Any, max_entries: int = 64) -> None:
    """Put ``entry`` under ``key`` (as the newest one)."""
    with _lock:
        data = load(path)
        data.pop(key, None)
        data[key] = entry
        while len(data) > max_entries:  # the oldest entries go first
            data.pop(next(iter(data)))
        _write(path, data)


def update(path: Path, key: str, fields: dict[str, Any]) -> None:
    """Add ``fields`` to ``key``'s entry (a dict), where there is one, as the newest entry (as
    ``store`` puts it). One read, under the lock: no write in between is lost."""
    with _lock:
        data = load(path)
        entry = data.pop(key, None)
        if isinstance(entry, dict):
            data[key] = {**entry, **fields}
            _write(path, data)


def drop(path: Path, key: str) -> None:
    """Forget ``key``'s entry, if there is one."""
    with _lock:
        data = load(path)
        if data.pop(key, None) is not None:
            _write(path, data)


def _write(path: Path, data: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)
    except OSError:
        pass  # a read-only home: nothing kept
