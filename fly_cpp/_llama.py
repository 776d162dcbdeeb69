"""The backend: the only module that imports ``llama_cpp`` (llama-cpp-python's low-level API).

``Model`` owns loaded weights and the vocabulary; ``Context`` owns one llama.cpp context with
its KV cache and a reusable batch. A context keeps ``tokens``, the exact token at every KV
position (position p holds ``tokens[p]``); ``decode`` appends, ``truncate`` rolls back,
``sync`` reuses the longest common prefix with a new token list, and nothing else touches the
cache, so that list is always the truth about the KV cache.
"""

from __future__ import annotations

import collections
import copy
import ctypes
import json
import os
import struct
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from time import perf_counter
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
import numpy as np  # noqa: E402

from fly_cpp import native, scheduler
from fly_cpp import rollback as rb
from fly_cpp import rpc as _rpc
from fly_cpp.errors import CacheFull, FlyError
from fly_cpp.rows import argmax as _argmax

GGUF_MAGIC = b"GGUF"
_SPLIT = {"none": 0, "layer": 1, "row": 2}
_FLASH_ATTN = {"auto": ll.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": ll.LLAMA_FLASH_ATTN_TYPE_ENABLED,
               "off": ll.LLAMA_FLASH_ATTN_TYPE_DISABLED}
_GGML_BF16 = 30  # ggml's id for bf16 (llama-cpp-python names no constant for it)
_VOCAB_TYPES = {0: "none", 1: "SPM", 2: "BPE", 3: "WPM", 4: "UGM", 5: "RWKV", 6: "PLAMO2"}

_log_tail: collections.deque[str] = collections.deque(maxlen=32)
_init_lock = threading.Lock()
_initialised = False
_verbose = False


@ll.llama_log_callback
def _on_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    message = text.decode("utf-8", errors="replace")
    _log_tail.append(message)
    if _verbose or os.environ.get("FLY_CPP_VERBOSE"):
        sys.stderr.write(message)


def set_verbose(on: bool) -> None:
    """Echo llama.cpp's log to stderr (process-wide, as llama.cpp's log is), as FLY_CPP_VERBOSE=1 does."""
    global _verbose
    _verbose = on


def _ggml_type(name: str) -> int:
    return _GGML_BF16 if name == "bf16" else getattr(ll, f"GGML_TYPE_{name.upper()}")


def _load_mode(mmap: bool | None, mlock: bool) -> int:
    """llama.cpp's load mode for the mmap/mlock pair (None: llama.cpp's own choice)."""
    if mmap is None and not mlock:
        return ll.LLAMA_LOAD_MODE_AUTO
    if mlock:
        return ll.LLAMA_LOAD_MODE_MLOCK if mmap is False else ll.LLAMA_LOAD_MODE_MMAP_MLOCK
    return ll.LLAMA_LOAD_MODE_MMAP if mmap else ll.LLAMA_LOAD_MODE_NONE


def _init_backend() -> None:
    global _initialised
    with _init_lock:
        if not _initialised:
            ll.llama_log_set(_on_log, ctypes.c_void_p(0))
            ll.llama_backend_init()
            _initialised = True


def library() -> ctypes.CDLL:
    """libllama's ctypes handle, the backend initialised: ggml's functions resolve through it
    (``fly_cpp.rpc`` reaches ggml's RPC backend that way)."""
    _init_backend()
    return ll.llama_cpp._lib


def gpu_names() -> list[str]:
    """This machine's GPUs as llama.cpp sees them (empty on a build without a GPU backend; RPC
    servers are not counted)."""
    return _rpc.local_device_names(library())


def last_log_error() -> str:
    """The most recent llama.cpp log line that looks like an error, for error messages."""
    for line in reversed(_log_tail):
        line = line.strip()
        if line and any(word in line.lower() for word in ("error", "failed", "does not", "not supported", "invalid")):
            return line
    return ""


def check_gguf(path: str | os.PathLike[str]) -> Path:
    """Refuse, with one clear line, a path that is missing or not a GGUF file."""
    p = Path(path)
    if not p.exists():
        raise FlyError(f"model file not found: {p}")
    if not p.is_file():
        raise FlyError(f"model path is not a file: {p}")
    with p.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise FlyError(f"not a GGUF file (bad magic {magic!r}): {p}")
    return p


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
HPARAMS = ("context_length", "block_count", "embedding_length", "attention.head_count", "attention.head_count_kv",
           "attention.key_length", "attention.value_length", "nextn_predict_layers")


def gguf_hparams(path: str | os.PathLike[str]) -> dict[str, int]:
    """The model's size hyperparameters (``HPARAMS``, without the architecture prefix) read
    straight from the GGUF header, in milliseconds and without llama.cpp (which would load the
    vocabulary); absent or non-scalar ones are left out."""
    p = check_gguf(path)
    out: dict[str, int] = {}
    with p.open("rb") as f:
        data = f.read(1 << 20)
        pos = 4

        def take(n: int) -> bytes:
            nonlocal data, pos
            while pos + n > len(data):
                more = f.read(max(1 << 20, n))
                if not more:
                    raise FlyError(f"truncated GGUF header: {p}")
                data = data[pos:] + more
                pos = 0
            pos += n
            return data[pos - n:pos]

        def unpack(fmt: str) -> Any:
            return struct.unpack(fmt, take(struct.calcsize(fmt)))[0]

        try:
            version = unpack("<I")
            if version < 2:
                return out
            unpack("<Q")  # tensors
            arch = ""
            for _ in range(unpack("<Q")):
                key = take(unpack("<Q")).decode("utf-8", "replace")
                kind = unpack("<I")
                if kind == 8:
                    value: Any = take(unpack("<Q")).decode("utf-8", "replace")
                elif kind == 9:
                    item, count = unpack("<I"), unpack("<Q")
                    for _ in range(count):
                        if item == 8:
                            take(unpack("<Q"))
                        elif item in _SCALARS:
                            take(struct.calcsize(_SCALARS[item]) * count)
                            break
                        else:
                            return out  # nested arrays: not worth walking for these values
                    continue
                elif kind in _SCALARS:
                    value = unpack(_SCALARS[kind])
                else:
                    return out
                if key == "general.architecture":
                    arch = value
                elif arch and key.startswith(arch + ".") and key[len(arch) + 1:] in HPARAMS:
                    out[key[len(arch) + 1:]] = int(value)
                    if len(out) == len(HPARAMS):
                        break
        except (struct.error, OverflowError, MemoryError, ValueError):
            raise FlyError(f"malformed GGUF header: {p}") from None
    return out


def kv_bytes_per_token(hparams: dict[str, int]) -> int:
    """About what one position of a model's KV cache takes (F16 keys and values, every layer);
    0 when the header does not say."""
    n_head = hparams.get("attention.head_count", 0)
    if not n_head:
        return 0
    head = hparams.get("embedding_length", 0) // n_head
    k = hparams.get("attention.key_length") or head
    v = hparams.get("attention.value_length") or head
    return hparams.get("block_count", 0) * (hparams.get("attention.head_count_kv") or n_head) * (k + v) * 2


def backend_version() -> str:
    """llama-cpp-python's version and the CPU features its llama.cpp was built with."""
    _init_backend()
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


class Model:
    """Weights and vocabulary of one GGUF file.

    ``rpc``: llama.cpp rpc-servers (HOST:PORT) whose devices come first in the model's device
    list; every llama.cpp call of such a model and its contexts goes through ``self.call``
    (``fly_cpp.rpc.Runner``), which raises RpcServerLost when a server dies."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        n_gpu_layers: int = 0,
        split_mode: str = "layer",
        main_gpu: int = 0,
        tensor_split: Sequence[float] = (),
        vocab_only: bool = False,
        repack: bool | None = None,
        mmap: bool | None = None,
        mlock: bool = False,
        rpc: Sequence[str] = (),
        mtp: bool = False,
    ) -> None:
        """``mtp``: also load the model's MTP ("nextn") layers, where it has them, for
        ``MtpContext``."""
        self.path = check_gguf(path)
        self._mtp = mtp
        _init_backend()
        self.call: _rpc.Runner | _rpc.Local = _rpc.Runner(rpc) if rpc else _rpc.LOCAL
        try:
            self.ptr = self._load(n_gpu_layers, split_mode, main_gpu, tensor_split, vocab_only, repack, mmap, mlock)
        except BaseException:
            self.call.close()
            raise
        self.vocab = ll.llama_model_get_vocab(self.ptr)
        self.n_vocab: int = ll.llama_vocab_n_tokens(self.vocab)
        self.bos: int = ll.llama_vocab_bos(self.vocab)
        self.eos: int = ll.llama_vocab_eos(self.vocab)
        self.add_bos: bool = bool(ll.llama_vocab_get_add_bos(self.vocab))
        self.add_eos: bool = bool(ll.llama_vocab_get_add_eos(self.vocab))
        self.vocab_type: str = _VOCAB_TYPES.get(ll.llama_vocab_type(self.vocab), "unknown")
        self.n_ctx_train: int = ll.llama_model_n_ctx_train(self.ptr)
        self._pieces: dict[int, bytes] = {}
        self._eog = np.array([bool(ll.llama_vocab_is_eog(self.vocab, t)) for t in range(self.n_vocab)])
        self._eog_u8 = self._eog.astype(np.uint8)
        self._spelled = self._spellable_characters()

    def _load(self, n_gpu_layers: int, split_mode: str, main_gpu: int, tensor_split: Sequence[float],
              vocab_only: bool, repack: bool | None, mmap: bool | None, mlock: bool) -> ctypes.c_void_p:
        params = ll.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        params.split_mode = _SPLIT[split_mode]
        params.main_gpu = main_gpu
        params.vocab_only = vocab_only
        params.load_mode = _load_mode(mmap, mlock)
        params.use_extra_bufts = repack if repack is not None else not cpu_has_amx()
        params.load_mtp = self._mtp
        n_dev = ll.llama_max_devices()
        if self.call.endpoints:
            lib = library()
            self._devices = _rpc.device_array(lib, self.call.devices(lib))
            params.devices = ctypes.cast(self._devices, ctypes.c_void_p)
            n_dev = min(n_dev, len(self._devices) - 1)
        if tensor_split:
            if len(tensor_split) > n_dev:
                what = "the rpc servers and GPUs offer" if self.call.endpoints else "this build supports"
                raise FlyError(f"tensor_split has {len(tensor_split)} entries, {what} {n_dev} devices")
            self._tensor_split = (ctypes.c_float * ll.llama_max_devices())(*tensor_split)
            params.tensor_split = self._tensor_split
        _log_tail.clear()
        ptr = self.call(ll.llama_model_load_from_file, str(self.path).encode(), params)
        if not ptr:
            reason = last_log_error()
            raise FlyError(f"llama.cpp could not load {self.path}" + (f": {reason}" if reason else ""))
        return ptr

    def check(self) -> None:
        """Raise RpcServerLost when an rpc-server connection has failed (the model is unusable)."""
        self.call.check()

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def eog_ids(self) -> list[int]:
        """The end-of-generation tokens (EOS, EOT, ...)."""
        return np.flatnonzero(self._eog).tolist()

    @property
    def recurrent(self) -> bool:
        """Whether this model keeps a recurrent state (a recurrent or hybrid model), which drops
        a suffix only through snapshots or checkpoints (``fly_cpp.rollback``)."""
        return bool(ll.llama_model_is_recurrent(self.ptr) or ll.llama_model_is_hybrid(self.ptr))

    @property
    def n_nextn(self) -> int:
        """The model's MTP ("nextn") layers (0: none); loaded only with ``mtp=True``."""
        return int(ll.llama_model_n_layer_nextn(self.ptr))

    @property
    def mtp_loaded(self) -> bool:
        return self._mtp and self.n_nextn > 0

    @property
    def n_embd(self) -> int:
        return int(ll.llama_model_n_embd(self.ptr))

    @property
    def n_layer(self) -> int:
        return int(ll.llama_model_n_layer(self.ptr))

    @property
    def n_params(self) -> int:
        return int(ll.llama_model_n_params(self.ptr))

    @property
    def size_bytes(self) -> int:
        return int(ll.llama_model_size(self.ptr))

    @property
    def eog_mask(self) -> np.ndarray:
        """(n_vocab,) uint8: 1 at the end-of-generation tokens (a greedy run's stop marks)."""
        return self._eog_u8

    def is_eog(self, token: int) -> bool:
        return 0 <= token < self.n_vocab and bool(self._eog[token])

    def token_text(self, token: int) -> bytes:
        return ll.llama_vocab_get_text(self.vocab, token) or b""

    def _spellable_characters(self) -> frozenset[str] | None:
        """For a SentencePiece vocabulary without byte-fallback tokens (<0x00>..<0xFF>), the
        characters its tokens can spell: llama.cpp aborts the process on any other character
        (an uncaught std::out_of_range in byte_to_token), so such text must be filtered first.
        None when every character can be tokenized."""
        if self.vocab_type != "SPM" or any(self.token_text(t) == b"<0x41>" for t in range(self.n_vocab)):
            return None
        texts = (self.token_text(t).decode("utf-8", errors="ignore") for t in range(self.n_vocab))
        return frozenset("".join(texts).replace("\u2581", " "))

    def spellable(self, text: str) -> str:
        """``text`` with the characters this vocabulary cannot spell replaced by '?' (only for
        byteless SentencePiece vocabularies; see ``_spellable_characters``)."""
        if self._spelled is None or self._spelled.issuperset(text):
            return text
        fallback = "?" if "?" in self._spelled else " "
        return "".join(c if c in self._spelled else fallback for c in text)

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        data = utf8(self.spellable(text))
        size = len(data) + 8
        buf = (ll.llama_token * size)()
        n = ll.llama_tokenize(self.vocab, data, len(data), buf, size, add_special, parse_special)
        if n < 0:
            size = -n
            buf = (ll.llama_token * size)()
            n = ll.llama_tokenize(self.vocab, data, len(data), buf, size, add_special, parse_special)
        if n < 0:
            raise FlyError(f"tokenisation failed for a text of {len(data)} bytes")
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes a token stands for (special tokens render as nothing)."""
        cached = self._pieces.get(token)
        if cached is not None:
            return cached
        buf = ctypes.create_string_buffer(64)
        n = ll.llama_token_to_piece(self.vocab, token, buf, 64, 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = ll.llama_token_to_piece(self.vocab, token, buf, -n, 0, False)
        out = buf.raw[: max(n, 0)]
        self._pieces[token] = out
        return out

    def piece_keeping(self, texts: Sequence[str]) -> Callable[[int], bytes]:
        """``piece``, except that the special tokens ``texts`` name render as their text (a text
        that is no single special token of this vocabulary is spelled by plain tokens anyway)."""
        kept = {}
        for text in texts:
            ids = self.tokenize(text, add_special=False, parse_special=True)
            if len(ids) == 1 and self.piece(ids[0]) != text.encode():
                kept[ids[0]] = text.encode()
        if not kept:
            return self.piece
        return lambda token: kept.get(token) or self.piece(token)

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        """The text of ``tokens``; ``special``: control tokens written out (``<s>``), as
        llama-server shows a prompt."""
        if not special:
            return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")
        out = []
        for t in tokens:
            buf = ctypes.create_string_buffer(64)
            n = ll.llama_token_to_piece(self.vocab, t, buf, 64, 0, True)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = ll.llama_token_to_piece(self.vocab, t, buf, -n, 0, True)
            out.append(buf.raw[: max(n, 0)])
        return b"".join(out).decode("utf-8", errors="replace")

    def meta(self, key: str) -> str | None:
        size = 1 << 16
        buf = ctypes.create_string_buffer(size)
        n = ll.llama_model_meta_val_str(self.ptr, key.encode(), buf, size)
        if n < 0:
            return None
        if n >= size:
            buf = ctypes.create_string_buffer(n + 1)
            ll.llama_model_meta_val_str(self.ptr, key.encode(), buf, n + 1)
        return buf.value.decode("utf-8", errors="replace")

    def close(self) -> None:
        if getattr(self, "ptr", None):
            self.call.release(ll.llama_model_free, self.ptr)
            self.ptr = None
            self.call.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def utf8(text: str) -> bytes:
    """``text`` as UTF-8, or one clear error for text that is not valid Unicode (a lone
    surrogate: a JSON escape like \\ud800 without its pair, or a byte that was not UTF-8)."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        code = ord(text[e.start])
        what = f"the byte 0x{code - 0xDC00:02x}, which is not UTF-8" if 0xDC80 <= code <= 0xDCFF else "a lone surrogate"
        raise FlyError(f"the text is not valid Unicode: character {e.start} is U+{code:04X}, {what}") from None


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if (a if len(a) == n else a[:n]) == (b if len(b) == n else b[:n]):  # the shorter one whole: one copy, not two
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _decode_failed(name: str, rc: int, more: dict[int, str] | None = None) -> FlyError:
    """The error of a llama_decode that returned ``rc`` (``more``: a caller's own codes)."""
    if rc == 1 and not (more and 1 in more):
        return CacheFull(f"llama_decode failed on {name}: no KV slot: the context size has been exceeded "
                         "(the KV cache has no room for the batch)")
    what = {2: "aborted", **(more or {})}.get(rc, f"error {rc}")
    return FlyError(f"llama_decode failed on {name}: {what}")


def _rows_wanted(held: int, n: int, n_ctx: int, n_batch: int, logits: str | int) -> int:
    """How many of ``n`` new tokens a decode returns logits for (``logits``: "none", "last",
    "all" or a number), after checking that they fit the context (``held`` there already) and
    that the rows asked for fit one batch."""
    if held + n > n_ctx:
        raise FlyError(f"context full: {held + n} tokens do not fit in n_ctx={n_ctx}")
    want = {"none": 0, "last": 1, "all": n}[logits] if isinstance(logits, str) else min(logits, n)
    if want > n_batch:
        raise ValueError("logits for every row need the tokens to fit one batch")
    return want


def _chunks(lo: int, hi: int, n_batch: int) -> list[tuple[int, int]]:
    """Positions lo..hi-1 in batches of at most n_batch, the last one as full as they allow (it
    holds the rows with logits: a decode asks for at most n_batch of them); none when lo >= hi."""
    if lo >= hi:
        return []
    last = max(hi - n_batch, lo)
    starts = [*range(lo, last, n_batch), last]
    return list(zip(starts, [*starts[1:], hi]))


class _Cache:
    """One sequence's cache and the one way it goes back, shared by ``Context`` (sequence 0 of a
    context of its own) and ``Seq`` (one of a context's several).

    ``tokens`` is the truth about the sequence: position p holds ``tokens[p]``. On a recurrent
    or hybrid model (``rollback`` SNAPSHOTS or CHECKPOINTS, ``fly_cpp.rollback``) a rollback may
    leave the last few of them *deferred* (``behind``): restored from an earlier checkpoint, they
    are decoded again by the next decode, in the same batch as its own tokens. A subclass says
    how its tokens are decoded (``_decode_range``, ``_rows``) and how a call reaches llama.cpp
    (``_call``: at a moment no decode of the context runs), for its ``seq_id``."""

    model: Model
    ptr: Any
    seq_id: int
    n_rs_seq: int  # tokens a decode can drop natively (snapshots; 0: none kept)
    n_ctx: int
    n_batch: int
    _memory: Any
    _call: Any

    def _track(self, rollback: str) -> None:
        """Start the bookkeeping of an empty sequence that goes back the ``rollback`` way."""
        self.rollback = rollback
        self.rollbacks = rb.Ledger()
        self.tokens: list[int] = []  # tokens[p] is the token at position p (the last ``behind`` deferred)
        self._done = 0  # tokens[:_done] are in the cache; the rest are deferred
        self._room = 0  # tokens the last decode can still drop natively (snapshots)
        self._checkpoints = rb.Checkpoints()
        self._intent: tuple[int, bool] | None = None  # (position, pinned): checkpoint there during the next decode

    def _decode_range(self, end: int, want: int) -> None:
        """Decode ``tokens[_done:end]`` at their positions, the last ``want`` rows with logits."""
        raise NotImplementedError

    def _rows(self, want: int) -> np.ndarray:
        """The last decode's ``want`` rows of logits, (want, n_vocab) float32."""
        raise NotImplementedError

    @property
    def can_rollback(self) -> bool:
        """Whether a suffix of the cache can be dropped without rebuilding it from empty."""
        return self.rollback != rb.NONE

    @property
    def behind(self) -> int:
        """Tokens of ``tokens`` a rollback left deferred: the next decode decodes them again."""
        return len(self.tokens) - self._done

    def decode(self, tokens: Sequence[int], logits: str | int = "last") -> np.ndarray | None:
        """Append ``tokens`` to the cache. ``logits``: "none", "last", "all", or a number n (the
        last n rows); the rows asked for must fit one batch (n_batch). Returns (rows, n_vocab)
        float32 (from a ``Context``: a view of llama.cpp's buffer, valid until it decodes again).
        Tokens are decoded in batches of n_batch, the last batch holding every row with logits,
        so that one call can both catch up and verify (deferred tokens go first)."""
        if not tokens:
            return None
        want = _rows_wanted(len(self.tokens), len(tokens), self.n_ctx, self.n_batch, logits)
        start = len(self.tokens)
        if want > 1 and self._intent is None and self._needs_checkpoint(len(tokens)):
            self._intent = (start, False)  # a decode that checks several rows may be rolled back into
        self.tokens.extend(tokens)
        try:
            self._run(want)
        except BaseException:
            self.truncate(start)
            raise
        return self._rows(want) if want else None

    def _needs_checkpoint(self, n: int) -> bool:
        """Whether a rollback into a decode of ``n`` new tokens that keeps the first needs a
        checkpoint before it (snapshots reach back n_rs_seq tokens)."""
        return self.rollback == rb.CHECKPOINTS or (self.rollback == rb.SNAPSHOTS and n - 1 > self.n_rs_seq)

    def _run(self, want: int) -> None:
        """Decode the deferred and new tokens (``tokens[_done:]``), the last ``want`` with logits,
        taking the checkpoint asked for on the way."""
        end = len(self.tokens)
        intent, self._intent = self._intent, None
        if intent is not None:
            pos, pin = intent
            if not self._done <= pos <= end - want or self._checkpoints.at(pos) is not None:
                intent = None  # outside this decode (or splitting it would cut rows with logits), or there already
            elif pos > self._done and self.rollback == rb.SNAPSHOTS and end - pos <= min(self.n_rs_seq,
                                                                                      self._final_chunk(end) - 1):
                pass  # decoded whole; snapshots then reach back to pos
            else:
                if pos > self._done:  # catch up to pos alone (the decode a checkpoint costs)
                    t0 = perf_counter()
                    self._decode_range(pos, 0)
                    self.rollbacks.split_seconds += perf_counter() - t0
                self._copy(pin)
                intent = None
        self._decode_range(end, want)
        if intent is not None:  # back to the checkpoint's position natively; the rest is deferred
            pos, pin = intent
            self._drop(pos)
            self._copy(pin)

    def _final_chunk(self, end: int) -> int:
        return min(end - self._done, self.n_batch)

    def sync(self, committed: Sequence[int]) -> None:
        """Bring the cache to the speculative loop's invariant, reusing the longest common
        prefix: it holds every committed token but the last (``tokens == committed[:-1]``).
        A recurrent state is checkpointed there, for the next request's common prefix."""
        keep = common_prefix(self.tokens, committed[:-1])
        self.truncate(keep)
        self.decode(committed[keep:-1], logits="none")
        if self.behind:
            self._decode_range(len(self.tokens), 0)
        self.checkpoint(pin=True)

    def sync_through(self, committed: Sequence[int]) -> np.ndarray:
        """``sync``, but the last committed token is decoded too, in the same batch as what the
        cache lacked before it (as llama.cpp's own tools decode a prompt), and its (n_vocab,)
        logits row is returned (a view, valid until the next decode): the cache then holds all
        of ``committed``, and committing the token picked from that row restores the loop's
        invariant. KV caches only (a recurrent state would be checkpointed in the wrong place)."""
        if self.rollback != rb.KV:
            raise ValueError("sync_through needs a KV cache")
        keep = common_prefix(self.tokens, committed[:-1])
        self.truncate(keep)
        rows = self.decode(committed[keep:], logits="last")
        assert rows is not None
        return rows[0]

    def truncate(self, n: int) -> None:
        """Roll the cache back to its first ``n`` positions (``tokens`` is exactly
        ``tokens[:n]`` after; on a recurrent state some may be deferred)."""
        n = max(n, 0)
        if n < len(self.tokens):
            del self.tokens[n:]
        if self._intent is not None and self._intent[0] > n:
            self._intent = None
        if n < self._done:
            self._physical(n)

    @property
    def can_shift(self) -> bool:
        """Whether ``shift`` works here: a KV cache whose positions llama.cpp can move."""
        return self.rollback == rb.KV and bool(self._call(ll.llama_memory_can_shift, self._memory))

    def shift(self, keep: int, discard: int) -> None:
        """A context shift: drop positions keep..keep+discard-1 and move what follows down by
        ``discard`` (llama.cpp re-rotates the moved keys), so ``tokens`` loses that middle part
        and position p still holds ``tokens[p]`` (``can_shift`` must hold)."""
        end = len(self.tokens)
        if not (0 <= keep and 0 < discard and keep + discard <= end):
            raise ValueError(f"no shift of {discard} tokens after {keep} in a cache of {end}")
        if not self._call(ll.llama_memory_seq_rm, self._memory, self.seq_id, keep, keep + discard):
            raise FlyError(f"{self.model.name}: llama.cpp refused to drop positions {keep}..{keep + discard - 1}")
        self._call(ll.llama_memory_seq_add, self._memory, self.seq_id, keep + discard, end, -discard)
        del self.tokens[keep:keep + discard]
        self._done = len(self.tokens)

    def checkpoint(self, pos: int | None = None, *, pin: bool = False) -> None:
        """Make a later rollback to ``pos`` tokens (default: all of ``tokens``) cheap: nothing on
        a KV cache; on a recurrent state a copy of it there, taken now, or during the next
        decode when ``pos`` lies ahead (up to the tokens that decode appends), or by going back
        to ``pos`` with snapshots (what follows is then deferred). ``pin``: keep it past the
        rounds' checkpoints (the end of a prompt)."""
        if self.rollback not in (rb.SNAPSHOTS, rb.CHECKPOINTS):
            return
        pos = len(self.tokens) if pos is None else pos
        if (existing := self._checkpoints.at(pos)) is not None:
            existing.pinned = existing.pinned or pin
        elif pos == self._done:
            self._copy(pin)
        elif pos > self._done:
            self._intent = (pos, pin)
        elif self.rollback == rb.SNAPSHOTS and self._done - pos <= self._room and pos <= len(self.tokens):
            self._drop(pos)
            self._copy(pin)

    def _drop(self, n: int) -> None:
        """Drop the cache's tokens from ``n`` on natively (snapshots); they stay in ``tokens``, deferred."""
        if not self._call(ll.llama_memory_seq_rm, self._memory, self.seq_id, n, -1):
            raise FlyError(f"{self.model.name}: llama.cpp refused to drop {self._done - n} tokens it keeps snapshots for")
        self.rollbacks.native += 1
        self.rollbacks.redecoded += min(self._done, len(self.tokens)) - n
        self._done, self._room = n, 0
        self._checkpoints.drop_after(n)

    def _physical(self, n: int, failed: bool = False) -> None:
        """Bring the cache itself back to at most ``n`` tokens: exactly where the cache allows,
        else to the nearest checkpoint at or before n (or empty), the rest deferred. ``failed``:
        a decode failed, and a recurrent state may be anywhere past n."""
        self._checkpoints.drop_after(n)
        costs = self.rollbacks
        if self.rollback == rb.KV:
            if not self._call(ll.llama_memory_seq_rm, self._memory, self.seq_id, n, -1):
                raise FlyError(f"{self.model.name}: llama.cpp refused to roll sequence {self.seq_id} back to {n} tokens")
            self._done = n
            return
        if self.rollback == rb.SNAPSHOTS and not failed and self._done - n <= self._room:
            if self._call(ll.llama_memory_seq_rm, self._memory, self.seq_id, n, -1):
                costs.native += 1
                self._done, self._room = n, 0
                return
        self._room = 0
        best = self._checkpoints.best(n)
        if best is not None and self._restore(best):
            self._done = best.pos
        else:
            self._checkpoints.clear()
            self._call(ll.llama_memory_seq_rm, self._memory, self.seq_id, 0, -1)  # dropping everything always works
            costs.rebuilds += n > 0
            self._done = 0
        costs.redecoded += min(n, len(self.tokens)) - self._done

    def _copy(self, pin: bool = False) -> None:
        """Checkpoint the recurrent state as it is now (the cache holds ``tokens[:_done]``)."""
        t0 = perf_counter()
        partial = ll.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = self._call(ll.llama_state_seq_get_size_ext, self.ptr, self.seq_id, partial)
        data = None if pin or self._checkpoints.at(self._done) else self._checkpoints.spare()
        if data is None or len(data) != size:
            data = (ctypes.c_uint8 * size)()
        if self._call(ll.llama_state_seq_get_data_ext, self.ptr, data, size, self.seq_id, partial) != size:
            return  # no checkpoint: a rollback here starts from an earlier one
        self._checkpoints.add(rb.Checkpoint(self._done, data, pin))
        self.rollbacks.copies += 1
        self.rollbacks.copy_seconds += perf_counter() - t0

    def _restore(self, checkpoint: rb.Checkpoint) -> bool:
        t0 = perf_counter()
        partial = ll.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        data = checkpoint.data
        if self._call(ll.llama_state_seq_set_data_ext, self.ptr, data, len(data), self.seq_id, partial) != len(data):
            return False
        # the attention layers' cache still holds what came after: drop it
        if not self._call(ll.llama_memory_seq_rm, self._memory, self.seq_id, checkpoint.pos, -1):
            return False
        self.rollbacks.restores += 1
        self.rollbacks.restore_seconds += perf_counter() - t0
        return True


class Context(_Cache):
    """One llama.cpp context over a model: a KV cache for sequence 0 and a reusable batch.

    ``tokens`` is the truth about the cache: position p holds ``tokens[p]``; a rollback of a
    recurrent or hybrid model may leave the last few deferred (``_Cache``). A context made with
    ``n_seq`` > 1 is used only through its sequences' views (``seq``)."""

    def __init__(self, model: Model, *, n_ctx: int, n_threads: int, n_batch: int = 512, n_ubatch: int = 512,
                 type_k: str = "f16", type_v: str = "f16", flash_attn: str = "auto", precise: bool = False,
                 rollback: str = "auto", n_seq: int = 1, kv_unified: bool = False) -> None:
        """``n_ctx``: tokens the context holds (llama.cpp rounds its cache up to a multiple of
        256; the context still holds only ``n_ctx``). ``type_k``/``type_v``: KV cache types
        ("f16", "q8_0", ...); ``flash_attn``: "on", "off" or "auto". ``precise``: an F32 KV cache
        and no flash attention, so that logits match a float64 reference forward pass to ~1e-5
        (for checking converted models; slower). ``rollback`` (recurrent and hybrid models):
        "snapshots", "checkpoints", or "auto" (snapshots where llama.cpp keeps them for the
        architecture and the micro-batch holds them, else checkpoints). ``n_seq`` > 1: that many
        sequences, used only through their views (``seq``), each with n_ctx / n_seq cells of its
        own (as llama-server's slots), or all sharing the n_ctx cells of one cache
        (``kv_unified``); a recurrent state then goes back by checkpoints, each sequence's own
        (llama.cpp's snapshots would serve one sequence's rounds only)."""
        self.model = model
        recurrent = model.recurrent
        if recurrent and n_seq > 1 and rollback == rb.SNAPSHOTS:
            raise FlyError(f"{model.name}: rollback by snapshots serves one sequence; with several (--parallel > 1) "
                           "use rollback 'checkpoints' or 'auto'")
        # llama.cpp caps the batch at the context; so does the batch allocated here, which
        # otherwise holds n_batch entries whatever the context (a huge n_batch: an OOM kill, or
        # seconds of allocating); n_ctx 0 is the model's own context length
        n_batch = max(1, min(n_batch, n_ctx or model.n_ctx_train or n_batch))
        params = ll.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = max(1, min(n_batch, n_ubatch))
        params.n_seq_max = max(1, n_seq)
        params.kv_unified = n_seq > 1 and kv_unified
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.no_perf = True
        params.type_k, params.type_v = _ggml_type(type_k), _ggml_type(type_v)
        params.flash_attn_type = _FLASH_ATTN[flash_attn]
        if precise:
            params.type_k = params.type_v = ll.GGML_TYPE_F32
            params.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
        # llama.cpp keeps a decode's last n_rs_seq + 1 tokens in one micro-batch (it asserts on less)
        if recurrent and n_seq == 1 and rollback != rb.CHECKPOINTS and params.n_ubatch > rb.SNAPSHOT_DEPTH + 1:
            params.n_rs_seq = rb.SNAPSHOT_DEPTH
        elif recurrent and rollback == rb.SNAPSHOTS:
            raise FlyError(f"{model.name}: rollback by snapshots needs n_ubatch > {rb.SNAPSHOT_DEPTH + 1} "
                           f"(got {params.n_ubatch}); use rollback 'checkpoints' or 'auto'")
        _log_tail.clear()
        self._call = model.call
        self.ptr = self._call(ll.llama_init_from_model, model.ptr, params)
        if not self.ptr:
            reason = last_log_error()
            raise FlyError(f"llama.cpp could not create a context for {model.name}" + (f": {reason}" if reason else ""))
        self.n_ctx: int = min(n_ctx, ll.llama_n_ctx(self.ptr)) if n_ctx > 0 else ll.llama_n_ctx(self.ptr)
        self.n_batch = min(n_batch, ll.llama_n_batch(self.ptr))  # llama.cpp caps n_batch at n_ctx
        self.n_ubatch: int = ll.llama_n_ubatch(self.ptr)
        self.n_threads: int = ll.llama_n_threads(self.ptr)
        self._memory = ll.llama_get_memory(self.ptr)
        self._batch = ll.llama_batch_init(self.n_batch, 0, 1)
        self.seq_id = 0  # the sequence this context's own ``tokens`` and rollbacks are about
        self.n_rs_seq = ll.llama_n_rs_seq(self.ptr) if recurrent else 0
        self._track(self._rollback_kind(recurrent))
        if recurrent and rollback == rb.SNAPSHOTS and self.rollback != rb.SNAPSHOTS:
            self.close()
            raise FlyError(f"{model.name}: llama.cpp keeps no recurrent-state snapshots for its architecture; "
                           "use rollback 'checkpoints' or 'auto'")
        self._hidden: np.ndarray | None = None  # (positions, n_embd): the target's hidden state at each position (MTP)
        self._hidden_valid = 0  # rows of _hidden that hold the state after tokens[:p + 1]
        self.n_seq = max(1, n_seq)
        self.kv_unified = params.kv_unified
        self._shared = _Batcher(self) if n_seq > 1 else None
        self._drafting: dict[tuple[int, int], native.DraftContext] = {}  # (n_vocab, seq) -> what a draft run decodes in

    def keep_hidden(self) -> None:
        """Record, from now on, the hidden state every decoded position ends with (what an MTP
        head reads: ``hidden``). Costs a copy of n_embd floats per decoded token."""
        if self._hidden is None:
            _cxx("llama_set_embeddings_nextn")(self.ptr, True, False)  # every row, not only those with logits
            self._hidden = np.zeros((0, self.model.n_embd), dtype=np.float32)
            self._hidden_valid = 0

    def hidden(self, lo: int, hi: int) -> np.ndarray:
        """The hidden states of positions lo..hi-1 (``keep_hidden``), each the state after the
        tokens up to and including that position; the rows must have been decoded."""
        if self._hidden is None or hi > self._hidden_valid or lo < 0:
            raise FlyError(f"no hidden state recorded for positions {lo}..{hi - 1} (have {self._hidden_valid})")
        return self._hidden[lo:hi]

    def _record_hidden(self, lo: int, hi: int) -> None:
        if self._hidden is None:
            return
        rows = np.ctypeslib.as_array(_cxx("llama_get_embeddings_nextn")(self.ptr), shape=(hi - lo, self._hidden.shape[1]))
        if hi > len(self._hidden):
            grown = np.zeros((max(hi, 2 * len(self._hidden), 256), self._hidden.shape[1]), dtype=np.float32)
            grown[: len(self._hidden)] = self._hidden
            self._hidden = grown
        self._hidden[lo:hi] = rows
        if lo <= self._hidden_valid:
            self._hidden_valid = max(self._hidden_valid, hi)

    @property
    def sharing(self) -> tuple[int, int, int] | None:
        """With several sequences: (shared decodes, the sequences and the rows they held, in
        all) since the context was made; None with one."""
        b = self._shared
        return None if b is None else (b.shared, b.seqs, b.rows)

    def seq(self, seq_id: int) -> Seq:
        """Sequence ``seq_id``'s view of a context made with ``n_seq`` > 1."""
        if self._shared is None or not 0 <= seq_id < self.n_seq:
            raise ValueError(f"sequence {seq_id} outside this context's {self.n_seq}")
        return Seq(self, self._shared, seq_id)

    def _rollback_kind(self, recurrent: bool) -> str:
        if not recurrent:
            return rb.KV
        if self.n_rs_seq > 0:
            return rb.SNAPSHOTS
        partial = ll.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        if self._memory and self._call(ll.llama_state_seq_get_size_ext, self.ptr, 0, partial) > 0:
            return rb.CHECKPOINTS
        return rb.NONE

    def _decode_range(self, end: int, want: int) -> None:
        tokens = self.tokens
        batch = self._batch
        for lo, hi in _chunks(self._done, end, self.n_batch):
            for i in range(hi - lo):
                batch.token[i] = tokens[lo + i]
                batch.pos[i] = lo + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = lo + i >= end - want
            batch.n_tokens = hi - lo
            rc = self._call(ll.llama_decode, self.ptr, batch)
            if rc != 0:
                self._physical(lo, failed=True)  # a failed decode may leave part of the chunk behind
                raise _decode_failed(self.model.name, rc)
            self._done = hi
            self._room = min(self.n_rs_seq, hi - lo - 1)
            self._record_hidden(lo, hi)

    def _rows(self, want: int) -> np.ndarray:
        return np.ctypeslib.as_array(self._call(ll.llama_get_logits, self.ptr), shape=(want, self.model.n_vocab))

    def truncate(self, n: int) -> None:
        """Roll the cache back to its first ``n`` positions (``tokens`` is exactly
        ``tokens[:n]`` after; on a recurrent state some may be deferred)."""
        self._hidden_valid = min(self._hidden_valid, max(n, 0))
        super().truncate(n)

    def shift(self, keep: int, discard: int) -> None:
        self._hidden_valid = min(self._hidden_valid, keep)  # the moved positions' states are not moved
        super().shift(keep, discard)

    @property
    def runs_natively(self) -> bool:
        """Whether ``greedy_run`` can decode here: a plain KV cache of one sequence on this
        machine (no rpc servers), no hidden states kept, and the native library has runs."""
        return (self.rollback == rb.KV and self._shared is None and self._hidden is None
                and not self.model.call.endpoints and _BATCH_MATCHES and native.has_greedy_run())

    def greedy_run(self, token: int, n: int, stop: np.ndarray | None) -> list[int]:
        """Target-only greedy decoding without returning to Python per token (``runs_natively``
        must hold): decode ``token`` (appended to ``tokens``), take its row's argmax (lowest id
        on ties, as ``rows.argmax``), decode that, ... up to ``n`` tokens, or through the first
        one marked in ``stop`` ((n_vocab,) uint8). Returns the tokens picked; every one but the
        last has been decoded after ``token``, so ``tokens`` ends with all but the last of them."""
        start = len(self.tokens)
        n = min(n, self.n_ctx - start)
        if n <= 0 or self.behind or self._intent is not None:
            raise FlyError(f"no room for a greedy run at {start} of n_ctx={self.n_ctx}")
        decode, logits = _run_entry_points()
        got, status = native.greedy_run(decode, logits, self.ptr, ctypes.addressof(self._batch), token, start, 0,
                                        self.model.n_vocab, stop, n)
        self.tokens.extend([token, *got[:-1]] if got else [])
        self._done = len(self.tokens)
        if status != 0:
            self._physical(len(self.tokens), failed=True)
            raise _decode_failed(self.model.name, status, {-1: "no logits"})  # -1: the run's own
        return got

    @property
    def drafts_natively(self) -> bool:
        """Whether ``draft_run`` can decode here (``runs_natively``'s conditions, and the native
        library has draft runs)."""
        return self.runs_natively and native.has_draft_run()

    def draft_run(self, hist: np.ndarray, n_hist: int, rules: native.DraftRules, n_vocab: int,
                  cache: _Cache | None = None) -> tuple[list[int], list[float], int]:
        """A round of greedy drafting without returning to Python per token (``drafts_natively``
        must hold; ``native.draft_run`` says what it does) in ``cache`` (this context's own
        sequence, or one of its ``Seq`` views): the text is ``hist[:n_hist]``, of which the
        cache's ``tokens`` must be a prefix, shorter than it (the rest, the catch-up, is decoded
        with the first step). Returns (the drafted tokens, their confidences when asked, the
        draft's own token after ``tokens``); ``tokens`` then holds the text and all drafted
        tokens but the last (fewer where the draft lost confidence in a guess)."""
        cache = self if cache is None else cache
        start = len(cache.tokens)
        if start >= n_hist or cache.behind or cache._intent is not None or n_hist + rules.limit - 1 > cache.n_ctx:
            raise FlyError(f"no room for a draft run at {start} of n_ctx={cache.n_ctx}")
        where = self._drafting.get((n_vocab, cache.seq_id))
        if where is None:
            decode, logits = _run_entry_points()
            where = self._drafting[n_vocab, cache.seq_id] = native.DraftContext(
                decode, logits, _entry_point("llama_memory_seq_rm"), self.ptr, self._memory,
                ctypes.addressof(self._batch), self.n_batch, cache.seq_id, self.model.n_vocab, n_vocab,
                self.model.eog_mask.ctypes.data)
        out, conf, done, last, status = native.draft_run(where, rules, hist, n_hist, start)
        cache.tokens.extend(hist[start:done].tolist())
        cache._done = len(cache.tokens)
        if status != 0:
            cache._physical(len(cache.tokens), failed=True)
            if status == -3:
                raise FlyError(f"{self.model.name}: llama.cpp refused to roll the KV cache back")
            if status == -2:
                raise ValueError("bad draft run arguments")
            raise _decode_failed(self.model.name, status, {-1: "no logits"})
        return out, conf, last

    def close(self) -> None:
        if getattr(self, "ptr", None):
            ll.llama_batch_free(self._batch)
            self._call.release(ll.llama_free, self.ptr)
            self.ptr = None
            self._checkpoints = rb.Checkpoints()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
_BATCH_MATCHES = tuple(f[0] for f in ll.llama_batch._fields_) == _BATCH_FIELDS and ctypes.sizeof(ll.llama_batch) == 56


def _run_entry_points() -> tuple[int, int]:
    """The addresses of llama_decode and llama_get_logits, for the native greedy runs."""
    global _entry_points
    if _entry_points is None:
        _entry_points = (_entry_point("llama_decode"), _entry_point("llama_get_logits"))
    return _entry_points


def _entry_point(name: str) -> int:
    """The address of one of libllama's C functions (for the native library to call)."""
    return ctypes.cast(getattr(library(), name), ctypes.c_void_p).value or 0


_cxx_bound: dict[str, Any] = {}


def _cxx(name: str) -> Any:
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


class MtpContext:
    """The context of a model's MTP head, bound to the target's context (llama.cpp's
    ``LLAMA_CONTEXT_TYPE_MTP`` with ``ctx_other``): its own KV cache for the MTP layer, where
    position p holds token p paired with the target's hidden state after position p - 1.
    ``tokens`` is the truth about that cache, as ``Context.tokens`` is for the target's; the
    target records its hidden states (``Context.keep_hidden``) from here on."""

    def __init__(self, target: Context) -> None:
        model = target.model
        if not model.mtp_loaded:
            raise FlyError(f"{model.name} has no MTP layers (draft-mtp needs a model that keeps its MTP head)")
        target.keep_hidden()
        params = ll.llama_context_default_params()
        params.n_ctx = target.n_ctx
        params.n_batch = params.n_ubatch = target.n_batch
        params.n_seq_max = 1
        params.n_rs_seq = 0
        params.n_threads = params.n_threads_batch = target.n_threads
        params.no_perf = True
        params.ctx_type = ll.LLAMA_CONTEXT_TYPE_MTP
        params.ctx_other = target.ptr
        _log_tail.clear()
        self.target, self.model, self.n_batch = target, model, target.n_batch
        self.ptr = model.call(ll.llama_init_from_model, model.ptr, params)
        if not self.ptr:
            reason = last_log_error()
            raise FlyError(f"llama.cpp could not create an MTP context for {model.name}" + (f": {reason}" if reason else ""))
        # the head's own state at every row: masked (rows with logits only), a batch of several
        # tokens gave its first row's state in place of the last one's
        _cxx("llama_set_embeddings_nextn")(self.ptr, True, False)
        self._memory = ll.llama_get_memory(self.ptr)
        self._batch = ll.llama_batch_ext_init(self.ptr)
        self._pos = ll.llama_pos(0)
        self.n_embd = model.n_embd
        self.tokens: list[int] = []
        self.exact = 0  # tokens[:exact] are paired with the target's own states (the rest with the head's)

    def decode(self, tokens: Sequence[int], states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Append ``tokens``, each with the hidden state it pairs with (``states``: one row per
        token), in one batch; returns the last row's logits (n_vocab,) and the head's hidden
        state there (n_embd,), copies."""
        n = len(tokens)
        if not 0 < n <= self.n_batch or states.shape != (n, self.n_embd):
            raise ValueError(f"an MTP batch needs 1..{self.n_batch} tokens with one state each")
        if len(self.tokens) + n > self.target.n_ctx:
            raise FlyError(f"context full: {len(self.tokens) + n} tokens do not fit in n_ctx={self.target.n_ctx}")
        states = np.ascontiguousarray(states, dtype=np.float32)
        batch, start = self._batch, len(self.tokens)
        ll.llama_batch_ext_clear(batch)
        row = ctypes.POINTER(ctypes.c_float)
        for i, token in enumerate(tokens):
            idx = ll.llama_batch_ext_add_token(batch, 0, int(token))
            self._pos.value = start + i
            embd = ll.llama_embd(ctypes.cast(states.ctypes.data + i * 4 * self.n_embd, row), 1, self.n_embd)
            if idx < 0 or not (ll.llama_batch_ext_set_pos(batch, idx, ctypes.byref(self._pos))
                               and ll.llama_batch_ext_set_embd_token(batch, idx, embd)
                               and ll.llama_batch_ext_set_output_logits(batch, idx, i == n - 1)):
                raise FlyError(f"llama.cpp refused an MTP batch entry for {self.model.name}")
        rc = self.model.call(ll.llama_process, self.ptr, ll.LLAMA_PROCESS_TYPE_DECODE, batch)
        if rc != 0:
            self.truncate(start)
            raise FlyError(f"llama_process failed on {self.model.name}'s MTP head: error {rc}")
        self.tokens.extend(int(t) for t in tokens)
        logits = np.ctypeslib.as_array(ll.llama_get_logits_ith(self.ptr, n - 1), shape=(self.model.n_vocab,))
        hidden = np.ctypeslib.as_array(_cxx("llama_get_embeddings_nextn_ith")(self.ptr, n - 1), shape=(self.n_embd,))
        return logits.copy(), hidden.copy()

    def truncate(self, n: int) -> None:
        """Drop the cache's positions from ``n`` on (a plain KV cache: always exact)."""
        n = max(n, 0)
        self.exact = min(self.exact, n)
        if n < len(self.tokens):
            ll.llama_memory_seq_rm(self._memory, 0, n, -1)
            del self.tokens[n:]

    def close(self) -> None:
        if getattr(self, "ptr", None):
            ll.llama_batch_ext_free(self._batch)
            self.model.call.release(ll.llama_free, self.ptr)
            self.ptr = None

def _grammar_init(model: Model, gbnf: str, root: str) -> tuple[Any, str]:
    """llama.cpp's grammar sampler, and what its parser wrote: the parser tells why a grammar
    is wrong on stderr, not through the log, so stderr is caught while it runs."""
    _log_tail.clear()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            ptr = ll.llama_sampler_init_grammar(model.vocab, gbnf.encode(), root.encode())
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        caught.seek(0)
        return ptr, caught.read().decode("utf-8", errors="replace")


class Grammar:
    """One state of llama.cpp's grammar sampler over ``model``'s vocabulary (GBNF text, its
    ``root`` rule). ``mask`` sets the logits of the tokens the grammar forbids next to -inf,
    ``allows`` asks about one token, ``accept`` advances, ``copy`` forks the state (rollback
    keeps one copy per position: ``fly_cpp.constrain``)."""

    def __init__(self, model: Model, gbnf: str, root: str = "root", *, _ptr: Any = None,
                 _cells: np.ndarray | None = None) -> None:
        self.model, self.ptr = model, None
        if _ptr is None:
            _ptr, said = _grammar_init(model, gbnf, root)
            if not _ptr:
                reason = next((ln.split("parsing grammar:", 1)[1].strip() for ln in said.splitlines()
                               if "parsing grammar:" in ln), "") or last_log_error()
                raise FlyError("invalid grammar" + (f": {reason}" if reason else ""))
        self.ptr = _ptr
        # (n_vocab,) llama_token_data records (id, logit, p), shared by a state and its forks
        # (one generation's, used by one thread): a copy per position must not copy the vocabulary
        if _cells is None:
            _cells = np.zeros(model.n_vocab, dtype=[("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
            _cells["id"] = np.arange(model.n_vocab, dtype=np.int32)
        self._cells = _cells
        self._one = np.zeros(1, dtype=_cells.dtype)

    def _apply(self, cells: np.ndarray) -> None:
        arr = ll.llama_token_data_array(cells.ctypes.data_as(ctypes.POINTER(ll.llama_token_data)), cells.shape[0],
                                        -1, False)
        ll.llama_sampler_apply(self.ptr, ctypes.byref(arr))

    def mask(self, row: np.ndarray) -> None:
        """Set the forbidden tokens' logits in ``row`` ((n_vocab,) float32, may be a view of
        llama.cpp's buffer) to -inf, in place."""
        cells = self._cells  # the grammar sampler only writes logits: the ids stay in place
        cells["logit"] = 0.0
        self._apply(cells)
        row[cells["logit"][: row.shape[0]] == -np.inf] = -np.inf

    def allows(self, token: int) -> bool:
        """Whether the grammar lets ``token`` come next."""
        if not 0 <= token < self.model.n_vocab:
            return False
        self._one["id"], self._one["logit"] = token, 0.0
        self._apply(self._one)
        return bool(self._one["logit"][0] != -np.inf)

    def accept(self, token: int) -> None:
        """Advance past ``token``, which must be allowed (llama.cpp aborts on one it forbids)."""
        ll.llama_sampler_accept(self.ptr, token)

    def copy(self) -> Grammar:
        return Grammar(self.model, "", _ptr=ll.llama_sampler_clone(self.ptr), _cells=self._cells)

    def close(self) -> None:
        if self.ptr:
            ll.llama_sampler_free(self.ptr)
            self.ptr = None

    def __del__(self) -> None:
        self.close()


# one character of a JSON string: any but the quote, the backslash and U+0000..U+001F, or an escape
JSON_CHAR = r'[^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])'


def json_schema_grammar(schema: str) -> str:
    """GBNF for a JSON schema (text), by llama-cpp-python's converter, with two of its gaps
    closed: integer bounds (``int_bounds``), which it ignores, are enforced, and a string's
    characters exclude the control characters JSON forbids raw (its ``char`` rule let a newline
    into a string, and the answer then failed to parse). FlyError on a bad schema."""
    try:
        parsed = json.loads(schema)
    except ValueError as e:
        raise FlyError(f"invalid JSON schema: {e}") from None
    return json_schema_rules({"": parsed})


def json_schema_rules(schemas: Mapping[str, Any]) -> str:
    """GBNF rules for several parsed JSON schemas at once, each under its own rule name (""
    names ``root``), the rules they share written once (see ``json_schema_grammar``)."""
    from llama_cpp import llama_grammar

    from fly_cpp import int_bounds

    class Converter(llama_grammar.SchemaConverter):
        def visit(self, schema: Any, name: str) -> str:
            if isinstance(schema, dict) and schema.get("type") == "integer" and \
                    any(k in schema for k in int_bounds.KEYWORDS):
                rule = name + "-" if name in llama_grammar.RESERVED_NAMES else name or "root"
                return self._add_rule(rule, int_bounds.integer_range(*int_bounds.bounds(schema)) + " space")
            return super().visit(schema, name)

    try:
        converter = Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
        for name, schema in schemas.items():
            converter.visit(converter.resolve_refs(copy.deepcopy(schema), "stdin"), name)  # it resolves in place
        if "char" in converter._rules:
            converter._rules["char"] = JSON_CHAR
        return converter.format_grammar()
    except FlyError:
        raise
    except Exception as e:  # the converter raises whatever its parsing hits
        raise FlyError(f"invalid JSON schema: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def gbnf(settings: Any) -> str:
    """The GBNF of a SamplingSettings' ``grammar`` or ``json_schema`` ("{}": any JSON object)."""
    if settings.grammar:
        return str(settings.grammar)
    if settings.json_schema.strip() in ("{}", "object", '{"type": "object"}', '{"type":"object"}'):
        from llama_cpp.llama_grammar import JSON_GBNF

        return JSON_GBNF
    return json_schema_grammar(settings.json_schema)


def quantize(src: str | os.PathLike[str], dst: str | os.PathLike[str], ftype: str, n_threads: int = 0, *,
             allow_requantize: bool = False) -> None:
    """Write a quantized copy of ``src`` with llama.cpp's quantizer (ftype e.g. "Q8_0", "F16").
    ``allow_requantize``: also convert tensors that are quantized already (llama.cpp dequantizes
    them first), e.g. an F16 copy of a Q4_K_M file."""
    check_gguf(src)
    _init_backend()
    code = getattr(ll, f"LLAMA_FTYPE_MOSTLY_{ftype.upper()}", None)
    if code is None:
        raise FlyError(f"unknown quantization type {ftype!r}")
    params = ll.llama_model_quantize_default_params()
    params.ftype = code
    params.nthread = n_threads
    params.allow_requantize = allow_requantize
    _log_tail.clear()
    if ll.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) != 0:
        reason = last_log_error()
        raise FlyError(f"quantizing {src} to {ftype} failed" + (f": {reason}" if reason else ""))


class _Job:
    """One sequence's tokens waiting for a shared decode; ``rows`` its logits once done.
    ``run``: a greedy run instead (``Seq.greedy_run``: at most that many tokens, ``stop`` its
    end marks), its tokens in ``got``; ``glet``: the task that waits for it."""

    __slots__ = ("seq", "pos", "tokens", "want", "rows", "error", "glet", "run", "stop", "got")

    def __init__(self, seq: int, pos: int, tokens: Sequence[int], want: int, run: int = 0,
                 stop: np.ndarray | None = None) -> None:
        self.seq, self.pos, self.tokens, self.want = seq, pos, tokens, want
        self.run, self.stop = run, stop
        self.rows: np.ndarray | None = None
        self.got: list[int] = []
        self.error: BaseException | None = None
        self.glet: Any = None

    @property
    def size(self) -> int:
        """Rows this job puts in the next batch."""
        return 1 if self.run else len(self.tokens)


class _Batcher:
    """Decodes for several sequences of one context in shared batches. A sequence's decode,
    inside a task of the engine's step loop (``fly_cpp.scheduler``), parks its job here until
    the loop ``flush``es every parked job that fits one batch in ONE llama_decode (the slots'
    verification rows share the batch, and a long prompt, asked for in n_batch chunks,
    interleaves with the other slots' rounds); outside a task it decodes at once. A step whose
    jobs are all greedy runs decodes them inside the native library for several tokens at once
    (``native.greedy_runs``). Only the step thread touches the context, so a sequence's cache
    edits and state copies happen between decodes by construction."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.jobs: list[_Job] = []
        self.decodes = 0  # llama_decode calls, and the rows they held (how wide the shared batches ran)
        self.rows = 0
        self.shared = 0  # shared decodes (one per batch: a llama_decode per sequence at n_ubatch 1)
        self.seqs = 0  # ... and the sequences they held
        self._runs: tuple[int, ...] | None = None  # what native runs need, once looked up

    def waiting(self) -> list[_Job]:
        return self.jobs

    def decode(self, job: _Job) -> None:
        """Decode ``job`` (with the other slots' jobs, inside a task); its ``rows`` / ``got``
        are set after, or its error raised."""
        if not scheduler.in_task():
            self._run([job])
        else:
            job.glet = scheduler.current()
            self.jobs.append(job)
            try:
                scheduler.park()
            finally:
                if job in self.jobs:  # cancelled while it waited: never decoded
                    self.jobs.remove(job)
        if job.error is not None:
            raise job.error

    def flush(self, halt: np.ndarray | None = None) -> list[_Job]:
        """Decode the parked jobs that fit one batch (in the order they came); the jobs done.
        Greedy runs decoded together end early once ``halt[0]`` is set ((1,) int32: the loop
        has news, a task to admit or to cancel)."""
        take, room = [], self.ctx.n_batch
        for j in self.jobs:
            if j.size <= room:
                take.append(j)
                room -= j.size
        taken = set(map(id, take))
        self.jobs = [j for j in self.jobs if id(j) not in taken]
        if take:
            try:
                self._run(take, halt)
            except Exception as e:  # each job's task raises it where it waits
                for j in take:
                    j.error = j.error or e
        return take

    def _run(self, jobs: list[_Job], halt: np.ndarray | None = None) -> None:
        # llama.cpp's split for a cache per sequence (split_equal) puts several sequences in one
        # micro-batch only while their ids follow one another in the batch (else it reads the
        # weights once per run of ids), hence the order; and it puts one row of each of two
        # sequences together even at n_ubatch 1, whose promise (a row's numbers independent of
        # its batch) then needs a llama_decode per sequence
        jobs = sorted(jobs, key=lambda j: j.seq)
        separate = self.ctx.n_ubatch == 1 and len(jobs) > 1
        if all(j.run for j in jobs) and self._native_runs():
            self._run_natively(jobs, separate, halt)
            return
        for group in ([[j] for j in jobs] if separate else [jobs]):
            self._run_one(group)
        self.shared += 1
        self.seqs += len(jobs)

    def _native_runs(self) -> bool:
        if self._runs is None:
            ok = _BATCH_MATCHES and native.has_greedy_runs() and not self.ctx.model.call.endpoints
            self._runs = (*_run_entry_points(),) if ok else ()
        return bool(self._runs)

    def _run_natively(self, jobs: list[_Job], separate: bool, halt: np.ndarray | None) -> None:
        ctx = self.ctx
        decode, logits = self._runs  # type: ignore[misc]
        stop = jobs[0].stop
        got, status = native.greedy_runs(
            decode, logits, ctx.ptr, ctypes.addressof(ctx._batch), np.array([j.tokens[0] for j in jobs], np.int32),
            np.array([j.pos for j in jobs], np.int32), np.array([j.seq for j in jobs], np.int32),
            np.array([j.run for j in jobs], np.int64), separate, ctx.model.n_vocab, stop, halt)
        steps = max(map(len, got), default=0)
        self.decodes += steps * (len(jobs) if separate else 1)
        self.rows += sum(map(len, got))
        self.shared += steps
        self.seqs += sum(map(len, got))
        for j, tokens in zip(jobs, got):
            j.got = tokens
            if status != 0 and len(tokens) < j.run and not (tokens and stop is not None and stop[tokens[-1]]):
                # a run that the failed decode cut: what it left past its tokens is dropped
                ctx._call(ll.llama_memory_seq_rm, ctx._memory, j.seq, j.pos + len(tokens), -1)
                j.error = _decode_failed(ctx.model.name, status, {-1: "no logits"})

    def _run_one(self, jobs: list[_Job]) -> None:
        ctx, batch, i = self.ctx, self.ctx._batch, 0
        for j in jobs:
            for k, token in enumerate(j.tokens if not j.run else j.tokens[:1]):
                batch.token[i] = token
                batch.pos[i] = j.pos + k
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = j.seq
                batch.logits[i] = 1 if j.run else k >= len(j.tokens) - j.want
                i += 1
        batch.n_tokens = i
        rc = ctx._call(ll.llama_decode, ctx.ptr, batch)
        self.decodes += 1
        self.rows += i
        if rc != 0:
            for j in jobs:  # a failed decode may leave part of the batch behind
                ctx._call(ll.llama_memory_seq_rm, ctx._memory, j.seq, j.pos, -1)
                j.error = _decode_failed(ctx.model.name, rc)
            return
        n_out = sum(1 if j.run else j.want for j in jobs)
        # (n_out, n_vocab): the rows with logits in batch order; each sequence keeps a copy, since
        # the next shared decode overwrites the buffer before its owner may have read it
        out = np.ctypeslib.as_array(ctx._call(ll.llama_get_logits, ctx.ptr), shape=(n_out, ctx.model.n_vocab))
        at = 0
        for j in jobs:
            if j.run:  # one token of its run in this batch
                j.got = [int(_argmax(out[at:at + 1])[0])]
                at += 1
            else:
                j.rows = out[at:at + j.want].copy()
                at += j.want


class Seq(_Cache):
    """One sequence of a context shared by several (``Context(n_seq=N)``), with the part of
    ``Context``'s interface the speculative loop and the draft model use: ``tokens`` (position
    p of this sequence holds ``tokens[p]``), ``decode``, ``truncate``, ``sync``,
    ``checkpoint``, ``greedy_run``. Its decodes are shared ones (``_Batcher``); a recurrent
    state goes back by checkpoints of this sequence's own, taken and restored between decodes,
    and a checkpoint asked for inside a decode splits this sequence's part of it in two shared
    decodes (the catch-up, then the rows), the copy taken between them."""

    def __init__(self, ctx: Context, shared: _Batcher, seq_id: int) -> None:
        self.ctx, self.shared, self.seq_id = ctx, shared, seq_id
        self.model, self.n_batch, self.n_ubatch, self.n_threads = ctx.model, ctx.n_batch, ctx.n_ubatch, ctx.n_threads
        self.n_ctx = ctx.n_ctx if ctx.kv_unified else ctx.n_ctx // ctx.n_seq  # the cells this sequence may hold
        self.ptr, self._memory, self._call = ctx.ptr, ctx._memory, ctx._call
        self.n_rs_seq = 0
        self._track(ctx.rollback)
        self._out: np.ndarray | None = None  # the last decode's rows with logits (this sequence's copy)

    def _decode_range(self, end: int, want: int) -> None:
        """As ``Context``'s, each n_batch chunk one shared decode (other sequences' rounds run
        between them)."""
        for lo, hi in _chunks(self._done, end, self.n_batch):
            job = _Job(self.seq_id, lo, self.tokens[lo:hi], want if hi == end else 0)
            try:
                self.shared.decode(job)
            except FlyError:
                self._physical(lo, failed=True)  # the batcher dropped what the failed decode left of a KV cache
                raise
            self._out = job.rows
            self._done = hi

    def _rows(self, want: int) -> np.ndarray:
        assert self._out is not None and len(self._out) == want
        return self._out

    @property
    def runs_natively(self) -> bool:
        """Whether ``greedy_run`` decodes here in runs: a plain KV cache on this machine (no rpc
        servers); the runs of every slot that runs one go together (``_Batcher``)."""
        return (self.rollback == rb.KV and not self.model.call.endpoints and _BATCH_MATCHES
                and native.has_greedy_runs())

    @property
    def drafts_natively(self) -> bool:
        """Whether ``draft_run`` drafts here: as for runs, and only while this sequence's task is
        the only one of the step loop (else its drafting steps share the draft model's batches
        with the other slots' steps)."""
        return self.runs_natively and native.has_draft_run() and scheduler.alone()

    def draft_run(self, hist: np.ndarray, n_hist: int, rules: native.DraftRules, n_vocab: int,
                  ) -> tuple[list[int], list[float], int]:
        """``Context.draft_run`` on this sequence (at once: nothing else decodes meanwhile)."""
        return self.ctx.draft_run(hist, n_hist, rules, n_vocab, self)

    def greedy_run(self, token: int, n: int, stop: np.ndarray | None) -> list[int]:
        """As ``Context.greedy_run``, one row of this sequence in each of the shared decodes
        (inside the native library while every running slot runs: ``_Batcher``). It may return
        fewer than ``n`` tokens: a step shared with other slots' rounds decodes one."""
        start = len(self.tokens)
        n = min(n, self.n_ctx - start)
        if n <= 0 or self.behind or self._intent is not None:
            raise FlyError(f"no room for a greedy run at {start} of n_ctx={self.n_ctx}")
        job = _Job(self.seq_id, start, [token], 0, run=n, stop=stop)
        try:
            self.shared.decode(job)
        except FlyError:
            self.tokens.extend([token, *job.got[:-1]] if job.got else [])
            self._physical(start + len(job.got), failed=True)
            raise
        got = job.got
        self.tokens.extend([token, *got[:-1]] if got else [])
        self._done = len(self.tokens)
        return got
