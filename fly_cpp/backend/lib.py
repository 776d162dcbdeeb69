"""The process's llama.cpp: loading libllama (the C++ runtime first), initialising its backend,
its log (kept for error messages, echoed with ``set_verbose``), what the build is and has (GPUs,
version, CPU features), and the raw entry points the native library and MTP staging call.
"""

from __future__ import annotations

import collections
import ctypes
import os
import re
import sys
import threading
from typing import Any


def _cxx_runtime_first() -> None:
    """Make the system's C++ runtime answer libllama's lookups before any library it loads. A
    CUDA build of llama.cpp's shared libraries (H100, CUDA 13) has C++ stream code of its own
    in libggml-cuda.so; loaded from Python, which does not link the C++ runtime, libllama bound
    to that copy and crashed (SIGSEGV in llama_model::print_info, while loading any model;
    LD_PRELOAD of libstdc++ cured it). Nothing changes where the runtime is found first anyway."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)
        except OSError:
            pass


_cxx_runtime_first()
import llama_cpp as ll  # noqa: E402

from fly_cpp.backend import rpc as _rpc
from fly_cpp.basics.errors import FlyError

_GGML_BF16 = 30  # ggml's id for bf16 (llama-cpp-python names no constant for it)

_log_tail: collections.deque[str] = collections.deque(maxlen=32)
# what llama.cpp said of flash attention for the context it made last: "flash_attn = enabled" as
# asked, "Flash Attention enabled" where it resolved "auto" (None: nothing said since ``clear_log``)
_FLASH = re.compile(r"flash[ _]att(?:n|ention)\s*=?\s*(enabled|disabled)", re.IGNORECASE)
_flash: list[bool | None] = [None]
_init_lock = threading.Lock()
_initialised = False
_verbose = False


@ll.llama_log_callback
def _on_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    message = text.decode("utf-8", errors="replace")
    _log_tail.append(message)
    if (said := _FLASH.search(message)) is not None:
        _flash[0] = said.group(1).lower() == "enabled"
    if _verbose or os.environ.get("FLY_CPP_VERBOSE"):
        sys.stderr.write(message)


def set_verbose(on: bool) -> None:
    """Echo llama.cpp's log to stderr (process-wide, as llama.cpp's log is), as FLY_CPP_VERBOSE=1 does."""
    global _verbose
    _verbose = on


def ggml_type(name: str) -> int:
    return _GGML_BF16 if name == "bf16" else getattr(ll, f"GGML_TYPE_{name.upper()}")


def load_mode(mmap: bool | None, mlock: bool) -> int:
    """llama.cpp's load mode for the mmap/mlock pair (None: llama.cpp's own choice)."""
    if mmap is None and not mlock:
        return ll.LLAMA_LOAD_MODE_AUTO
    if mlock:
        return ll.LLAMA_LOAD_MODE_MLOCK if mmap is False else ll.LLAMA_LOAD_MODE_MMAP_MLOCK
    return ll.LLAMA_LOAD_MODE_MMAP if mmap else ll.LLAMA_LOAD_MODE_NONE


def init_backend() -> None:
    global _initialised
    with _init_lock:
        if not _initialised:
            ll.llama_log_set(_on_log, ctypes.c_void_p(0))
            ll.llama_backend_init()
            _initialised = True


def library() -> ctypes.CDLL:
    """libllama's ctypes handle, the backend initialised: ggml's functions resolve through it
    (``fly_cpp.backend.rpc`` reaches ggml's RPC backend that way)."""
    init_backend()
    return ll.llama_cpp._lib


def gpu_names() -> list[str]:
    """This machine's GPUs as llama.cpp sees them (empty on a build without a GPU backend; RPC
    servers are not counted)."""
    return _rpc.local_device_names(library())


def clear_log() -> None:
    """Forget llama.cpp's earlier log lines, so that ``last_log_error`` (and ``flash_attention``)
    tell of what runs next."""
    _log_tail.clear()
    _flash[0] = None


def flash_attention() -> bool:
    """Whether the context llama.cpp made last (since ``clear_log``) runs flash attention, as its
    log said."""
    return _flash[0] is True


def last_log_error() -> str:
    """The most recent llama.cpp log line that looks like an error, for error messages."""
    for line in reversed(_log_tail):
        line = line.strip()
        if line and any(word in line.lower() for word in ("error", "failed", "does not", "not supported", "invalid")):
            return line
    return ""

def backend_version() -> str:
    """llama-cpp-python's version and the CPU features its llama.cpp was built with."""
    init_backend()
    info = ll.llama_print_system_info()
    return f"{ll.__version__} {info.decode('utf-8', 'replace') if isinstance(info, bytes) else info}"


def cpu_has_amx() -> bool:
    """llama.cpp's AMX weight repacking crashed (segfault in the first decode) on every
    quantized model we tried on AMX CPUs, so repacking defaults to off there."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return "amx_tile" in f.read()
    except OSError:
        return False


# llama.cpp's staging calls for MTP (src/llama-ext.h): C++ symbols, so looked up by their mangled names
_CXX = {
    "llama_set_embeddings_nextn": ("_Z26llama_set_embeddings_nextnP13llama_contextbb",
                                   [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool], None),
    "llama_get_embeddings_nextn": ("_Z26llama_get_embeddings_nextnP13llama_context",
                                   [ctypes.c_void_p], ctypes.POINTER(ctypes.c_float)),
    "llama_get_embeddings_nextn_ith": ("_Z30llama_get_embeddings_nextn_ithP13llama_contexti",
                                       [ctypes.c_void_p, ctypes.c_int32], ctypes.POINTER(ctypes.c_float)),
}
_entry_points: tuple[int, int] | None = None
# native/flyrows.h's copy of llama_batch; another layout (a llama.cpp upgrade) switches runs off
_BATCH_FIELDS = ("n_tokens", "token", "embd", "pos", "n_seq_id", "seq_id", "logits")
BATCH_MATCHES = tuple(f[0] for f in ll.llama_batch._fields_) == _BATCH_FIELDS and ctypes.sizeof(ll.llama_batch) == 56


def run_entry_points() -> tuple[int, int]:
    """The addresses of llama_decode and llama_get_logits, for the native greedy runs."""
    global _entry_points
    if _entry_points is None:
        _entry_points = (entry_point("llama_decode"), entry_point("llama_get_logits"))
    return _entry_points


def entry_point(name: str) -> int:
    """The address of one of libllama's C functions (for the native library to call)."""
    return ctypes.cast(getattr(library(), name), ctypes.c_void_p).value or 0


_cxx_bound: dict[str, Any] = {}


def cxx(name: str) -> Any:
    """One of libllama's MTP staging calls, bound on first use; a build without it gets one line."""
    if name not in _cxx_bound:
        symbol, args, result = _CXX[name]
        try:
            fn = getattr(library(), symbol)
        except AttributeError:
            raise FlyError(f"this llama.cpp build lacks {name} (MTP drafting needs llama-cpp-python 0.3.36's "
                           "libllama or newer)") from None
        fn.argtypes, fn.restype = args, result
        _cxx_bound[name] = fn
    return _cxx_bound[name]
