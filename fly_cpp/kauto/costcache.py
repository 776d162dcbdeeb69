"""The cost cache: ``costs.json`` in fly-cpp's cache directory (``$FLY_CPP_COSTS`` to name it),
one entry per key made of everything that changes what a decode costs (the model files, the
settings they are loaded with, the threads, the machine and the llama.cpp build)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
from pathlib import Path

from fly_cpp.backend.lib import backend_version
from fly_cpp.basics import jsoncache
from fly_cpp.config import ModelSettings

MAX_ENTRIES = 64  # pairs' curves kept in the cache file, the oldest dropped first (a size, not a tuning)
LARGEST_TIMED = 32  # the most rows a calibration times (fly_cpp.kauto.calibrate.DRAFT_ROWS)
# a price is the median of at least this many warm decodes: a calibration's per size, the live check
# of a cached curve (``fly_cpp.kauto.costs``): the fewest whose median one outlier cannot move
MEDIAN_OF = 3


def identity(settings: ModelSettings, threads: int) -> dict[str, object]:
    """What of a model's loading changes its decodes' cost. Batch sizes count only up to the
    largest decode a calibration times: a decode of fewer rows runs alike under any larger
    n_batch or n_ubatch (``--n-batch 1000000000`` measured the pair anew, a minute on the F16
    Qwen pair, for an answer of 4 tokens)."""
    stat = os.stat(settings.path)
    loaded = {k: v for k, v in dataclasses.asdict(settings).items() if k not in ("path", "n_ctx", "n_threads")}
    for size in ("n_batch", "n_ubatch"):
        loaded[size] = min(loaded[size], LARGEST_TIMED)
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


def machine_id() -> str:
    """This machine and llama.cpp build, as a short hash (what other pairs' curves are learned on)."""
    return hashlib.sha256(json.dumps(machine(), sort_keys=True, default=str).encode()).hexdigest()[:16]


def model_id(settings: ModelSettings, threads: int) -> str:
    """One model's file and loading, as a short hash: its curve is the same in any pair."""
    return hashlib.sha256(json.dumps(identity(settings, threads), sort_keys=True, default=str).encode()).hexdigest()[:16]


def load() -> dict[str, dict[str, object]]:
    return jsoncache.load(cache_path())


def store(key: str, entry: dict[str, object]) -> None:
    jsoncache.store(cache_path(), key, entry, MAX_ENTRIES)


def note(key: str, **fields: object) -> None:
    """Add ``fields`` to ``key``'s entry, where there is one."""
    jsoncache.update(cache_path(), key, fields)


def drop(key: str) -> None:
    """Forget ``key``'s entry (its next use measures again)."""
    jsoncache.drop(cache_path(), key)
