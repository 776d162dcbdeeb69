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
    """The evidence stored under ``record``, or None."""
    entry = jsoncache.load(path()).get(record)
    if entry is None:
        return None
    evidence = Evidence()
    try:
        evidence.load(entry)
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    return evidence


def store(record: str, evidence: Evidence) -> None:
    jsoncache.store(path(), record, evidence.as_dict())
