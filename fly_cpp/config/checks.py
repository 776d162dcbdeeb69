"""What the settings share: the choices they take, the limits they check, and the checks
themselves (each a one-line ``FlyError`` naming the setting)."""

from __future__ import annotations

import math
import os
from typing import Any

from fly_cpp.basics.errors import FlyError

ROLLBACK = ("auto", "snapshots", "checkpoints")  # what ModelSettings.rollback may ask for (``fly_cpp.backend.rollback``'s ways)

MODES = ("fly", "spd", "target")
AUTO_SLOTS = 4  # -np auto, llama-server's choice
AUTO = "auto"  # k: the cost-aware controller picks each round's draft length
FLY_RULES = ("guarded", "paper")
LOOSEN = ("auto", "on", "off")
DRAWS = ("shared", "llama")  # SamplingSettings.draw
SPLIT_MODES = ("none", "layer", "row")
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")  # llama.cpp's KV cache types
FLASH_ATTN = ("auto", "on", "off")
STEADY = ("auto", "on", "off")
SPEC_TYPES = ("auto", "draft-mtp")  # llama.cpp's spelling; "mtp" is read as "draft-mtp"
MAX_THREADS = 512  # GGML_MAX_N_THREADS: ggml's thread pool holds at most this many
MAX_CTX = 2**31 - 1  # positions are int32 in llama.cpp
MAX_SEED = 2**64 - 1


def _help(text: str, *, aliases: tuple[str, ...] = (), draft: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
    """A field's metadata: its help text, and the spellings llama.cpp gives the option
    (``aliases``; ``draft``: those of the draft model's copy, e.g. ``-td``), which the command
    line accepts besides the field's own name (``extra`` may name llama-cpp-python's keyword for
    it, ``python="use_mmap"``, which the Python API accepts)."""
    return {"help": text, "aliases": aliases, "draft_aliases": draft, **extra}


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise FlyError(message)


def _number(name: str, value: Any, lo: float | None = None, hi: float | None = None, *, inf: bool = False,
            above: bool = False, kind: str = "a finite number") -> None:
    """``value`` is a finite number (or +inf where ``inf``) within [lo, hi] ((lo, hi] where
    ``above``); otherwise a FlyError naming the setting and the range."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
    number = number and (math.isfinite(value) or (inf and value == math.inf))
    ok = number and (lo is None or (value > lo if above else value >= lo)) and (hi is None or value <= hi)
    if ok:
        return
    if lo is not None and hi is not None:
        bound = f"in {'(' if above else '['}{_g(lo)}, {_g(hi)}]"
    elif lo is not None:
        bound = f"{'>' if above else '>='} {_g(lo)}"
    else:
        bound = f"<= {_g(hi)}" if hi is not None else ""
    if not number:
        kind = "a number (or inf)" if inf else kind
        raise FlyError(f"{name} must be {kind}{' ' + bound if bound else ''}, got {value!r}")
    raise FlyError(f"{name} must be {bound}, got {value!r}")


def _g(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def _integer(name: str, value: Any, lo: int, hi: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise FlyError(f"{name} must be an integer, got {value!r}")
    _number(name, value, lo, hi, kind="an integer")


def cpu_cores() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


THREADS_PER_CPU = 4  # beyond a few threads per logical CPU llama.cpp only slows down (and at tens of
                     # thousands it takes minutes to start, or crashes)


def max_threads() -> int:
    """The most threads a context may use: what ggml supports (512) and what the machine can
    run (a few per logical CPU)."""
    return min(MAX_THREADS, THREADS_PER_CPU * max(cpu_cores(), os.cpu_count() or 1))


def _threads(name: str, n: Any) -> None:
    limit = max_threads()
    _integer(name, n, 0)
    _require(n <= limit, f"{name} must be at most {limit} (" + (
        f"{THREADS_PER_CPU} per CPU of this machine's {limit // THREADS_PER_CPU}), got {n}" if limit < MAX_THREADS
        else f"ggml's thread limit), got {n}"))


def _endpoint_error(endpoint: str) -> str | None:
    """Why ``endpoint`` is not a HOST:PORT llama.cpp's RPC client can dial (IPv4 or a host name:
    it splits at the first colon), or None."""
    host, colon, port = endpoint.partition(":")
    if not colon or not host:
        return "expected HOST:PORT"
    if ":" in port or host.startswith("["):
        return "IPv6 addresses are not supported by llama.cpp's RPC client; use an IPv4 address or a host name"
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"the port must be a number in 1..65535, got {port!r}"
    return None
