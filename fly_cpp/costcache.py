"""The cost cache: ``costs.json`` in fly-cpp's cache directory (``$FLY_CPP_COSTS`` to name it),
one entry per key made of everything that changes what a decode costs (the model files, the
settings they are loaded with, the threads, the machine and the llama.cpp build)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import threading
from pathlib import Path

from fly_cpp._llama import backend_version
from fly_cpp.config import ModelSettings

MAX_ENTRIES = 64
_file_lock = threading.Lock()


def identity(settings: ModelSettings, threads: int) -> dict[str, object]:
    stat = os.stat(settings.path)
    loaded = {k: v for k, v in dataclasses.asdict(settings).items() if k not in ("path", "n_ctx", "n_threads")}
    return {"path": os.path.abspath(settings.path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "threads": threads, **loaded}


def machine() -> dict[str, object]:
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return {"machine": platform.machine(), "cpu": model or platform.processor(), "cores": os.cpu_count(),
            "llama.cpp": backend_version()}


def cache_path() -> Path:
    """``$FLY_CPP_COSTS``, else ``costs.json`` in fly-cpp's cache directory."""
    if os.environ.get("FLY_CPP_COSTS"):
        return Path(os.environ["FLY_CPP_COSTS"]).expanduser()
    root = os.environ.get("FLY_CPP_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "fly-cpp")
    return Path(root).expanduser() / "costs.json"


def cache_key(target: ModelSettings, target_threads: int, draft: ModelSettings | None, draft_threads: int) -> str:
    parts = {"target": identity(target, target_threads),
             "draft": identity(draft, draft_threads) if draft is not None else None, "on": machine()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def load() -> dict[str, dict[str, object]]:
    try:
        data = json.loads(cache_path().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def store(key: str, entry: dict[str, object]) -> None:
    with _file_lock:
        data = load()
        data.pop(key, None)
        data[key] = entry
        while len(data) > MAX_ENTRIES:  # the oldest entries go first
            data.pop(next(iter(data)))
        _write(data)


def drop(key: str) -> None:
    """Forget ``key``'s entry (its next use measures again)."""
    with _file_lock:
        data = load()
        if data.pop(key, None) is not None:
            _write(data)


def _write(data: dict[str, dict[str, object]]) -> None:
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)
    except OSError:
        pass  # a read-only home: measure again next time
