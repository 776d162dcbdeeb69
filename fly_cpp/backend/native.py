"""The native hot path (``native/flyrows.c``), loaded with ctypes.

The library reads llama.cpp's logits rows in place: every function takes a (rows, V) float32
array whose rows are contiguous (any row stride, so ``logits[:, :n]`` views work too) and
passes its data pointer; nothing is copied. The numpy code in ``fly_cpp.backend.rows`` and
``fly_cpp.backend.sampling`` is the reference and the fallback: callers ask ``accepts(x)`` first.

Where the library comes from: ``$FLY_CPP_NATIVE_LIB`` (a file) when set, else the package
directories (the package build installs it next to this module). ``FLY_CPP_NO_NATIVE=1``
switches it off; so does a missing or stale library (``status()`` says why).
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

ABI_VERSION = 3  # native/flyrows.h FLY_ABI_VERSION
MAX_TOP = 16  # native/flyrows.h FLY_MAX_TOP
MAX_NGRAM = 16  # native/flyrows.h FLY_MAX_NGRAM
LIB_NAMES = {"win32": ("flyrows.dll", "libflyrows.dll"), "darwin": ("libflyrows.dylib", "libflyrows.so")}

_lib: ctypes.CDLL | None = None
_status = "not loaded yet"
_loaded = False
_enabled = os.environ.get("FLY_CPP_NO_NATIVE", "") in ("", "0")

_p = ctypes.c_void_p
_i64 = ctypes.c_int64
_f64 = ctypes.c_double
_SIGNATURES = {
    "fly_abi_version": (ctypes.c_int, []),
    "fly_kernels": (ctypes.c_char_p, []),
    "fly_argmax": (None, [_p, _i64, _i64, _i64, _p]),
    "fly_top_entropy": (ctypes.c_int, [_p, _i64, _i64, _i64, ctypes.c_int32, _p]),
    "fly_top_probability": (None, [_p, _i64, _i64, _i64, _p]),
    "fly_distribution": (_i64, [_p, _i64, _f64, _i64, _f64, _f64, _p, _p, _i64]),
    "fly_draw": (_i64, [_p, _i64, _f64]),
    "fly_sample": (_i64, [_p, _i64, _f64, _i64, _f64, _f64, _f64]),
    "fly_shared_draw": (_i64, [_p, _i64, _f64, _i64, _f64, _f64, ctypes.c_uint64, _i64]),
}


class DraftContext(ctypes.Structure):
    """native/flyrows.h's fly_draft_ctx: the draft context a draft run decodes in (one thread's:
    it keeps the runs' output buffers, ``scratch``)."""

    _fields_ = [("decode", _p), ("get_logits", _p), ("seq_rm", _p), ("ctx", _p), ("memory", _p), ("batch", _p),
                ("n_batch", ctypes.c_int32), ("seq", ctypes.c_int32), ("row_len", _i64), ("n_vocab", _i64),
                ("eog", _p)]

    def scratch(self, limit: int) -> _Scratch:
        """The output buffers of a run of up to ``limit`` tokens, made once and then reused."""
        held = getattr(self, "_scratch", None)
        if held is None or len(held.out) < limit:
            held = self._scratch = _Scratch(max(limit, 16))
        return held


class _Scratch:
    """A draft run's outputs (its tokens, their confidences, what the cache holds after, the
    draft's last token, the status) and the pointers ``fly_draft_run`` takes, made once per draft
    context: a round's drafting is one call."""

    def __init__(self, n: int) -> None:
        self.out, self.conf = np.empty(n, dtype=np.int32), np.empty(n, dtype=np.float64)
        self.done, self.last, self.status = ctypes.c_int64(0), ctypes.c_int32(-1), ctypes.c_int32(0)
        self.pointers = (ctypes.byref(self.done), _ptr(self.out), _ptr(self.conf), ctypes.byref(self.last),
                         ctypes.byref(self.status))


class DraftRules(ctypes.Structure):
    """native/flyrows.h's fly_draft_rules: how far a draft run goes, and how it draws its tokens
    (``sampled``: the target's shared draw, ``shared_draw``'s; else the argmax)."""

    _fields_ = [("limit", _i64), ("need", _i64), ("p_min", _f64), ("confident", ctypes.c_int32),
                ("ngram_max", ctypes.c_int32), ("ngram_tokens", ctypes.c_int32), ("sampled", ctypes.c_int32),
                ("temperature", _f64), ("top_k", _i64), ("top_p", _f64), ("min_p", _f64), ("seed", ctypes.c_uint64)]

    def drawing(self, temperature: float, top_k: int, top_p: float, min_p: float, seed: int) -> DraftRules:
        """These rules, the tokens drawn by the target's chain and ``seed``'s shared noise."""
        self.sampled, self.temperature, self.top_k, self.top_p, self.min_p = 1, temperature, top_k, top_p, min_p
        self.seed = seed & 0xFFFFFFFFFFFFFFFF
        return self


# bound when the library has them (a library built before them keeps its other functions)
_OPTIONAL = {
    "fly_greedy_run": (_i64, [_p, _p, _p, _p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, _i64, _p, _i64, _p, _p]),
    "fly_greedy_runs": (_i64, [_p, _p, _p, _p, _i64, _p, _p, _p, _p, ctypes.c_int32, _i64, _p, _p, _i64, _p, _p, _p]),
    "fly_ngram_match": (_i64, [_p, _i64, ctypes.c_int32, _i64, _p]),
    "fly_draft_run": (_i64, [ctypes.POINTER(DraftContext), ctypes.POINTER(DraftRules), _p, _i64, _p, _p, _p, _p, _p]),
}


def _candidates() -> Iterator[Path]:
    override = os.environ.get("FLY_CPP_NATIVE_LIB")
    if override:
        yield Path(override)
        return
    # the search path of this package (imported before any of its modules): editable installs
    # list the build output and the sources
    package = sys.modules[__name__.partition(".")[0]]  # fly_cpp: the library is installed beside its top
    names = LIB_NAMES.get(sys.platform, ("libflyrows.so",))
    for folder in package.__path__:
        for name in names:
            yield Path(folder) / name


def _load() -> None:
    global _lib, _status, _loaded
    _loaded = True
    tried = []
    for path in _candidates():
        if not path.is_file():
            tried.append(str(path))
            continue
        try:
            lib = ctypes.CDLL(str(path))
            for name, (restype, argtypes) in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = restype, argtypes
            for name, (restype, argtypes) in _OPTIONAL.items():
                if hasattr(lib, name):
                    fn = getattr(lib, name)
                    fn.restype, fn.argtypes = restype, argtypes
            version = lib.fly_abi_version()
        except (OSError, AttributeError) as e:
            _status = f"cannot load {path}: {e}"
            return
        if version != ABI_VERSION:
            _status = f"{path} has ABI version {version}, this fly_cpp needs {ABI_VERSION} (rebuild the package)"
            return
        _lib, _status = lib, f"loaded {path} ({lib.fly_kernels().decode()} kernels)"
        return
    _status = "library not found (looked for " + ", ".join(tried) + ")"


def _library() -> ctypes.CDLL | None:
    if not _loaded:
        _load()
    return _lib if _enabled else None


def available() -> bool:
    """Whether the native functions are in use (built, loadable, current and not switched off)."""
    return _library() is not None


def status() -> str:
    """One line saying which library is in use, or why none is."""
    _library()
    return _status if _enabled else "switched off (FLY_CPP_NO_NATIVE or set_enabled(False))"


def set_enabled(on: bool) -> bool:
    """Switch the native path on or off for this process (benchmarks compare both); returns the
    previous setting."""
    global _enabled
    before, _enabled = _enabled, bool(on)
    return before


@contextmanager
def enabled(on: bool) -> Iterator[None]:
    before = set_enabled(on)
    try:
        yield
    finally:
        set_enabled(before)


def accepts(x: np.ndarray) -> bool:
    """Whether ``x`` can be read in place: (rows, V>0) float32, each row contiguous, rows at a
    non-negative whole-float stride; and the library is in use."""
    return (
        isinstance(x, np.ndarray)
        and x.ndim == 2
        and x.dtype == np.float32
        and x.shape[1] > 0
        and (x.strides[1] == 4 or x.shape[1] == 1)
        and (x.strides[0] >= 0 and x.strides[0] % 4 == 0 or x.shape[0] <= 1)
        and x.dtype.isnative
        and x.flags.aligned
        and _library() is not None
    )


def accepts_row(row: np.ndarray) -> bool:
    """Whether ``row`` is a (V>0,) contiguous float32 row the library can read; and it is in use."""
    return isinstance(row, np.ndarray) and row.ndim == 1 and accepts(row[None, :])


def _need() -> ctypes.CDLL:
    lib = _library()
    if lib is None:
        raise RuntimeError(f"the native library is not in use: {status()}")
    return lib


def _ptr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _rows(x: np.ndarray) -> tuple[int, int, int, int]:
    """(data pointer, rows, V, row stride in floats) of an array ``accepts`` took."""
    rows, n = x.shape
    return _ptr(x), rows, n, (x.strides[0] // 4 if rows > 1 else n)


def argmax(x: np.ndarray) -> np.ndarray:
    """(rows, V) float32 -> (rows,) int64, lowest index on ties."""
    ptr, rows, n, stride = _rows(x)
    out = np.empty(rows, dtype=np.int64)
    _need().fly_argmax(ptr, rows, n, stride, _ptr(out))
    return out


def top_entropy(x: np.ndarray, top: int = 3) -> np.ndarray:
    """(rows, V) float32 -> (rows,) float64 top-``top`` entropy (``top`` <= MAX_TOP)."""
    ptr, rows, n, stride = _rows(x)
    out = np.empty(rows, dtype=np.float64)
    if _need().fly_top_entropy(ptr, rows, n, stride, top, _ptr(out)) != 0:
        raise ValueError(f"top must be in 1..{MAX_TOP}, got {top}")
    return out


def top_probability(x: np.ndarray) -> np.ndarray:
    """(rows, V) float32 -> (rows,) float64 probability of each row's greedy token."""
    ptr, rows, n, stride = _rows(x)
    out = np.empty(rows, dtype=np.float64)
    _need().fly_top_probability(ptr, rows, n, stride, _ptr(out))
    return out


def _row(row: np.ndarray) -> tuple[int, int]:
    if not accepts_row(row):
        raise ValueError("expected a non-empty contiguous float32 row")
    return _ptr(row), row.shape[0]


def _check(result: int) -> int:
    if result == -2:
        raise MemoryError("native sampling ran out of memory")
    if result < 0:
        raise ValueError("bad sampling arguments (temperature must be > 0)")
    return result


def distribution(row: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float,
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(V,) float32 -> (ids (n,) int64, probs (n,) float64): the sampling chain's survivors."""
    ptr, n = _row(row)
    cap = top_k if 0 < top_k < n else min(n, 1024)
    while True:
        ids = np.empty(cap, dtype=np.int64)
        probs = np.empty(cap, dtype=np.float64)
        count = _check(_need().fly_distribution(ptr, n, temperature, top_k, top_p, min_p,
                                             _ptr(ids), _ptr(probs), cap))
        if count <= cap:
            return ids[:count], probs[:count]
        cap = count


def draw(probs: np.ndarray, u: float) -> int:
    """Index picked by the uniform number ``u`` in [0, 1) from (n,) float64 probabilities."""
    p = np.ascontiguousarray(probs, dtype=np.float64)
    return _check(_need().fly_draw(_ptr(p), p.shape[0], u))


def sample(row: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float, u: float) -> int:
    """(V,) float32 -> the token the chain and ``u`` pick (== draw(distribution(...), u))."""
    ptr, n = _row(row)
    return _check(_need().fly_sample(ptr, n, temperature, top_k, top_p, min_p, u))


def shared_draw(row: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float, seed: int,
                position: int) -> int:
    """(V,) float32 -> the token ``seed``'s shared draw takes at ``position`` after the chain (==
    ``Sampler.draw`` of ``distribution``'s survivors under draw "shared", stream 0)."""
    ptr, n = _row(row)
    return _check(_need().fly_shared_draw(ptr, n, temperature, top_k, top_p, min_p, seed & 0xFFFFFFFFFFFFFFFF, position))


def has_greedy_run() -> bool:
    """Whether ``greedy_run`` is available (the library is in use and has it)."""
    lib = _library()
    return lib is not None and hasattr(lib, "fly_greedy_run")


def greedy_run(decode: int, get_logits: int, ctx: int, batch: int, token: int, pos: int, seq: int, n_vocab: int,
               stop: np.ndarray | None, n: int) -> tuple[list[int], int]:
    """Up to ``n`` greedy tokens decoded one at a time inside the library (``fly_greedy_run``):
    ``decode``/``get_logits`` are the addresses of llama.cpp's llama_decode and llama_get_logits,
    ``ctx`` a context, ``batch`` the address of a llama_batch with room for one token, ``token``
    the first token to decode at ``pos``; ``stop``: (n_vocab,) uint8, a run ends after a token
    marked there. Returns (the tokens, llama_decode's status: 0, its error, or -1 for no logits)."""
    out = np.empty(max(n, 1), dtype=np.int32)
    status = ctypes.c_int32(0)
    stop_ptr = _ptr(stop) if stop is not None else None
    got = _need().fly_greedy_run(decode, get_logits, ctx, batch, token, pos, seq, n_vocab, stop_ptr, n,
                                 _ptr(out), ctypes.byref(status))
    return out[:got].tolist(), status.value


MAX_RUN_SEQS = 256  # native/flyrows.c FLY_MAX_RUN_SEQS


def has_greedy_runs() -> bool:
    """Whether ``greedy_runs`` is available (the library is in use and has it)."""
    lib = _library()
    return lib is not None and hasattr(lib, "fly_greedy_runs")


def greedy_runs(decode: int, get_logits: int, ctx: int, batch: int, tokens: np.ndarray, pos: np.ndarray,
                seqs: np.ndarray, n: np.ndarray, separate: bool, n_vocab: int, stop: np.ndarray | None,
                halt: np.ndarray | None = None) -> tuple[list[list[int]], int]:
    """Greedy runs of several sequences of one context at once (``fly_greedy_runs``): sequence
    ``seqs[i]`` decodes ``tokens[i]`` at ``pos[i]`` first, then its own argmax; each step decodes
    one row of every sequence in one llama_decode (``separate``: one per sequence), and the runs
    end together after the step at which one has ``n[i]`` tokens or took a token marked in
    ``stop``, or at which ``halt[0]`` is non-zero (another thread may set it meanwhile).
    ``tokens``, ``pos``, ``seqs``: (S,) int32; ``n``: (S,) int64, each >= 1; ``halt``: (1,) int32;
    ``batch``: a llama_batch with room for S tokens. Returns (each sequence's tokens, the status:
    0, llama_decode's error, -1 no logits)."""
    cap = max(int(n.max()) if len(n) else 1, 1)
    out = np.empty(len(n) * cap, dtype=np.int32)
    got = np.zeros(len(n), dtype=np.int64)
    status = ctypes.c_int32(0)
    _need().fly_greedy_runs(decode, get_logits, ctx, batch, len(n), _ptr(tokens), _ptr(pos), _ptr(seqs), _ptr(n),
                            int(separate), n_vocab, _ptr(stop) if stop is not None else None,
                            _ptr(halt) if halt is not None else None, cap, _ptr(out), _ptr(got), ctypes.byref(status))
    if status.value == -2:
        raise ValueError("bad greedy runs arguments")
    return [out[i * cap: i * cap + int(got[i])].tolist() for i in range(len(n))], status.value


def has_draft_run() -> bool:
    """Whether ``draft_run`` is available (the library is in use and has it)."""
    lib = _library()
    return lib is not None and hasattr(lib, "fly_draft_run")


def ngram_match(tokens: np.ndarray, max_n: int, n_pred: int) -> tuple[int, int]:
    """(start, length) of the guess ``fly_ngram_match`` finds in (size,) int32 ``tokens``, the
    draft runs' n-gram lookup (== ``ngram.Index.match``; for tests)."""
    t = np.ascontiguousarray(tokens, dtype=np.int32)
    start = ctypes.c_int64(0)
    got = _need().fly_ngram_match(_ptr(t), len(t), max_n, n_pred, ctypes.byref(start))
    return start.value, got


def draft_run(where: DraftContext, rules: DraftRules, hist: np.ndarray, n_hist: int, n_done: int,
              ) -> tuple[list[int], list[float], int, int, int]:
    """A fixed-k round of drafting inside the library (``fly_draft_run``), after the text
    ``hist[:n_hist]`` ((>= n_hist + limit,) int32: the drafted tokens are appended there) of which
    the cache holds the first ``n_done``. Returns (the drafted tokens, their confidences (empty
    unless asked), what the cache holds after (``hist[:that]``), the draft's own token after
    that, the status: 0, llama_decode's error, -1 no logits, -2 bad arguments, -3 a refused
    rollback, -4 out of memory in a sampled draw)."""
    if not (hist.dtype == np.int32 and hist.ndim == 1 and hist.flags.c_contiguous
            and len(hist) >= n_hist + rules.limit):
        raise ValueError("hist must be a contiguous int32 array with room for the drafted tokens")
    s = where.scratch(rules.limit)
    s.done.value, s.last.value, s.status.value = n_done, -1, 0
    got = _need().fly_draft_run(ctypes.byref(where), ctypes.byref(rules), _ptr(hist), n_hist, *s.pointers)
    asked = rules.confident or rules.p_min > 0
    return s.out[:got].tolist(), s.conf[:got].tolist() if asked else [], s.done.value, s.last.value, s.status.value
