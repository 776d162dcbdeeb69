"""GGUF files and loaded weights: the header check and hyperparameters read without loading
(``gguf_hparams``, the KV estimate), ``Model`` (weights, vocabulary, tokenizer, metadata) and
``quantize``.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fly_cpp.backend import rpc as _rpc
from fly_cpp.backend.lib import clear_log, cpu_has_amx, gpu_names, init_backend, last_log_error, library, ll, load_mode
from fly_cpp.basics.errors import FlyError

GGUF_MAGIC = b"GGUF"
_SPLIT = {"none": 0, "layer": 1, "row": 2}
_VOCAB_TYPES = {0: "none", 1: "SPM", 2: "BPE", 3: "WPM", 4: "UGM", 5: "RWKV", 6: "PLAMO2"}


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
                if out and key.startswith("tokenizer."):
                    # llama.cpp's converters write the architecture's keys before the tokenizer's,
                    # whose arrays (151,936 strings twice for Qwen) took 1.1 s to walk per process
                    break
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

class Model:
    """Weights and vocabulary of one GGUF file.

    ``rpc``: llama.cpp rpc-servers (HOST:PORT) whose devices come first in the model's device
    list; every llama.cpp call of such a model and its contexts goes through ``self.call``
    (``fly_cpp.backend.rpc.Runner``), which raises RpcServerLost when a server dies."""

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
        init_backend()
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
        self.offloaded = 0 if vocab_only else self._offloaded(n_gpu_layers)

    def _offloaded(self, n_gpu_layers: int) -> int:
        """Layers llama.cpp put on a GPU or rpc server, of ``n_layer`` + 1 (the output layer
        counts, as llama.cpp's log counts it): -1 is all; none without such a device."""
        if not (self.call.endpoints or gpu_names()):
            return 0
        return self.n_layer + 1 if n_gpu_layers < 0 else min(n_gpu_layers, self.n_layer + 1)

    @property
    def placement(self) -> str:
        """Where the layers went: "on the CPU", or "29/29 layers on NVIDIA H200"."""
        if not self.offloaded:
            return "on the CPU"
        devices = [*(f"rpc-server {e}" for e in self.call.endpoints), *gpu_names()]
        return f"{self.offloaded}/{self.n_layer + 1} layers on {', '.join(devices)}"

    def _load(self, n_gpu_layers: int, split_mode: str, main_gpu: int, tensor_split: Sequence[float],
              vocab_only: bool, repack: bool | None, mmap: bool | None, mlock: bool) -> ctypes.c_void_p:
        params = ll.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        params.split_mode = _SPLIT[split_mode]
        params.main_gpu = main_gpu
        params.vocab_only = vocab_only
        params.load_mode = load_mode(mmap, mlock)
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
        clear_log()
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
        a suffix only through snapshots or checkpoints (``fly_cpp.backend.rollback``)."""
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


def quantize(src: str | os.PathLike[str], dst: str | os.PathLike[str], ftype: str, n_threads: int = 0, *,
             allow_requantize: bool = False) -> None:
    """Write a quantized copy of ``src`` with llama.cpp's quantizer (ftype e.g. "Q8_0", "F16").
    ``allow_requantize``: also convert tensors that are quantized already (llama.cpp dequantizes
    them first), e.g. an F16 copy of a Q4_K_M file."""
    check_gguf(src)
    init_backend()
    code = getattr(ll, f"LLAMA_FTYPE_MOSTLY_{ftype.upper()}", None)
    if code is None:
        raise FlyError(f"unknown quantization type {ftype!r}")
    params = ll.llama_model_quantize_default_params()
    params.ftype = code
    params.nthread = n_threads
    params.allow_requantize = allow_requantize
    clear_log()
    if ll.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) != 0:
        reason = last_log_error()
        raise FlyError(f"quantizing {src} to {ftype} failed" + (f": {reason}" if reason else ""))


