"""What k auto learned about a pair outlives the process: a fresh ``fly-cpp generate`` (or the
first request after a server starts) plans its first rounds from what the last process on this
pair, loaded this way on this machine, had learned (``fly_cpp.kauto.evidence``), not from the priors.

Kept in ``evidence.json`` beside the cost cache (``fly_cpp.kauto.costcache.cache_path``;
``$FLY_CPP_EVIDENCE`` puts it elsewhere),
under the cost cache's key of the pair (model files, load settings, threads, machine,
llama.cpp build) and the decoding settings that change what is learned. The record decays as
it is used, as in a process; a malformed one is ignored.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from fly_cpp.basics import jsoncache
from fly_cpp.kauto.costcache import cache_path
from fly_cpp.kauto.evidence import Evidence


def path() -> Path:
    """``$FLY_CPP_EVIDENCE``, else ``evidence.json`` beside the cost cache."""
    if os.environ.get("FLY_CPP_EVIDENCE"):
        return Path(os.environ["FLY_CPP_EVIDENCE"]).expanduser()
    return cache_path().with_name("evidence.json")


def key(pair: str, settings: object) -> str:
    """The record's key: the pair's cost-cache key and the decoding settings (``repr``)."""
    return hashlib.sha256(json.dumps([pair, repr(settings)]).encode()).hexdigest()[:32]


def load(record: str) -> Evidence | None:
    """The evidence stored under ``record``, or None (after the writes handed to ``store``)."""
    flush()
    entry = jsoncache.load(path()).get(record)
    if entry is None:
        return None
    evidence = Evidence()
    try:
        evidence.load(entry)
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    return evidence


# the records handed to ``store`` and not yet written, by file and record (the latest state wins),
# and the writer that writes them, one at a time, off the caller's thread
_lock = threading.Lock()
_pending: dict[tuple[Path, str], dict] = {}
_writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fly-evidence")
_written: Future | None = None


def store(record: str, evidence: Evidence) -> None:
    """Keep ``evidence`` under ``record``: its state is taken now and written by a thread of its
    own (``flush`` waits for it; the interpreter waits for it at exit). Written on the step loop
    whenever it ran out of work, the file's read and rewrite held the next request back: on the
    bundled pair at one thread, answered one after another, 4% of the step loop's time (1.5 ms an
    answer beside its 27 ms)."""
    global _written
    with _lock:
        idle = not _pending
        _pending[(path(), record)] = evidence.as_dict()
        if idle:
            _written = _writer.submit(_write)


def _write() -> None:
    while True:
        with _lock:
            if not _pending:
                return
            (where, record), state = _pending.popitem()
        jsoncache.store(where, record, state)


def flush() -> None:
    """Wait until every record handed to ``store`` is written."""
    written = _written
    if written is not None:
        written.result()
