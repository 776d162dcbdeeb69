"""How a model is loaded: its file, threads, context and batch sizes, offload, cache types."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from fly_cpp.basics.errors import FlyError
from fly_cpp.config.checks import (
    CACHE_TYPES,
    FLASH_ATTN,
    MAX_CTX,
    ROLLBACK,
    SPLIT_MODES,
    _endpoint_error,
    _help,
    _integer,
    _number,
    _require,
    _threads,
    cpu_cores,
)


@dataclass(frozen=True)
class ModelSettings:
    """How one GGUF model is loaded and how its llama.cpp context is made."""

    path: str
    n_ctx: int = field(default=0, metadata=_help(
        "context size; 0 = the model's training context, at most 4096", aliases=("-c", "--ctx-size")))
    n_threads: int = field(default=0, metadata=_help(
        "CPU threads; 0 = $FLY_CPP_THREADS, else all cores", aliases=("-t", "--threads"),
        draft=("-td", "--threads-draft", "--spec-draft-threads")))
    n_batch: int = field(default=512, metadata=_help("largest batch handed to llama_decode",
                                                     aliases=("-b", "--batch-size")))
    n_ubatch: int = field(default=512, metadata=_help(
        "physical batch size; 1 makes batched verification numerically identical to one-token decoding (slow)",
        aliases=("-ub", "--ubatch-size")))
    n_gpu_layers: int = field(default=-1, metadata=_help(
        "layers to offload to the GPUs or rpc servers; -1 = all (on a build without a GPU backend, and with no "
        "rpc servers, the CPU keeps them); 0 = none, or all when rpc servers are given",
        aliases=("-ngl", "--gpu-layers"),
        draft=("-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft", "--spec-draft-ngl")))
    split_mode: str = field(default="layer", metadata=_help("multi-GPU split: none, layer or row",
                                                            aliases=("-sm", "--split-mode")))
    tensor_split: tuple[float, ...] = field(default=(), metadata=_help(
        "share of the offloaded layers per device (rpc servers first, then GPUs), e.g. 3,1", aliases=("-ts",)))
    main_gpu: int = field(default=0, metadata=_help("GPU used when split_mode is none", aliases=("-mg",)))
    rpc: tuple[str, ...] = field(default=(), metadata=_help(
        "llama.cpp rpc-servers that hold the offloaded layers, as devices before the local GPUs "
        "(no authentication: trusted networks only)", metavar="HOST:PORT[,HOST:PORT...]"))
    type_k: str = field(default="f16", metadata=_help(
        f"KV cache data type for K: {', '.join(CACHE_TYPES)}", aliases=("-ctk", "--cache-type-k"),
        draft=("-ctkd", "--cache-type-k-draft", "--spec-draft-type-k")))
    type_v: str = field(default="f16", metadata=_help(
        f"KV cache data type for V: {', '.join(CACHE_TYPES)} (quantized V needs flash attention)",
        aliases=("-ctv", "--cache-type-v"), draft=("-ctvd", "--cache-type-v-draft", "--spec-draft-type-v")))
    flash_attn: str = field(default="auto", metadata=_help(
        "flash attention: on, off or auto (a bare -fa means on)", aliases=("-fa",), bare="on"))
    mmap: bool | None = field(default=None, metadata=_help(
        "memory-map the model file; unset = llama.cpp's choice (mmap unless a device cannot)", python="use_mmap"))
    mlock: bool = field(default=False, metadata=_help("keep the model in RAM (no swapping or compressing)",
                                                      python="use_mlock"))
    repack: bool | None = field(default=None, metadata=_help(
        "let llama.cpp repack quantized weights for the CPU; unset = on, except on AMX CPUs where it crashes"))
    rollback: str = field(default="auto", metadata=_help(
        "recurrent and hybrid models (Qwen3.5/3.6, LFM2, Mamba, ...): how the cache drops rejected drafts: "
        "snapshots (llama.cpp keeps the last tokens' states, on the architectures that support it), "
        "checkpoints (copies of the recurrent state, restored and the kept tokens decoded again), "
        "or auto (the cheaper of the two, measured once per model on this machine)"))

    def __post_init__(self) -> None:
        _integer("n_ctx", self.n_ctx, 0, MAX_CTX)
        _threads("n_threads", self.n_threads)
        # llama.cpp caps both at n_ctx (so does fly-cpp's batch, see backend.context.Context); here
        # they only have to be counts a context could hold
        _integer("n_batch", self.n_batch, 1, MAX_CTX)
        _integer("n_ubatch", self.n_ubatch, 1, MAX_CTX)
        _integer("n_gpu_layers", self.n_gpu_layers, -1, MAX_CTX)
        _require(self.split_mode in SPLIT_MODES, f"split_mode must be one of {', '.join(SPLIT_MODES)}, got {self.split_mode!r}")
        for share in self.tensor_split:
            _number("tensor_split entries", share, 0)
        _integer("main_gpu", self.main_gpu, 0, 4096)
        if self.n_threads == 0 and os.environ.get("FLY_CPP_THREADS"):
            self.threads  # noqa: B018 -- a bad $FLY_CPP_THREADS fails here, where settings are made
        rpc = self.rpc
        if isinstance(rpc, str):
            rpc = tuple(s.strip() for s in rpc.split(","))
        _require(isinstance(rpc, (tuple, list)) and all(isinstance(s, str) for s in rpc),
                 f"rpc must be 'HOST:PORT' strings, got {self.rpc!r}")
        for endpoint in rpc:
            _require(_endpoint_error(endpoint) is None, f"rpc: {endpoint!r}: {_endpoint_error(endpoint)}")
        _require(len(set(rpc)) == len(rpc), f"rpc names a server twice: {', '.join(rpc)}")
        object.__setattr__(self, "rpc", tuple(rpc))
        for name in ("type_k", "type_v"):
            value = getattr(self, name)
            _require(isinstance(value, str) and value.lower() in CACHE_TYPES,
                     f"{name} must be one of {', '.join(CACHE_TYPES)}, got {value!r}")
            object.__setattr__(self, name, value.lower())
        if isinstance(self.flash_attn, bool):  # llama-cpp-python's flash_attn=True
            object.__setattr__(self, "flash_attn", "on" if self.flash_attn else "off")
        _require(self.flash_attn in FLASH_ATTN, f"flash_attn must be one of {', '.join(FLASH_ATTN)}, got {self.flash_attn!r}")
        _require(self.rollback in ROLLBACK, f"rollback must be one of {', '.join(ROLLBACK)}, got {self.rollback!r}")

    @property
    def threads(self) -> int:
        """n_threads, else $FLY_CPP_THREADS, else every core."""
        if self.n_threads:
            return self.n_threads
        env = os.environ.get("FLY_CPP_THREADS", "").strip()
        if env:
            try:
                n = int(env)
            except ValueError:
                raise FlyError(f"FLY_CPP_THREADS must be an integer, got {env!r}") from None
            _threads("FLY_CPP_THREADS", n)
            if n:
                return n
        return cpu_cores()

    @property
    def offloaded_layers(self) -> int:
        """``n_gpu_layers`` as llama.cpp takes it: all layers go to the rpc servers unless told
        otherwise (``--rpc`` alone must not leave the model local)."""
        return -1 if self.rpc and self.n_gpu_layers == 0 else self.n_gpu_layers

    def placed(self, local_gpus: bool) -> ModelSettings:
        """These settings on a machine with (``local_gpus``) or without a GPU llama.cpp can use:
        without one and without rpc servers, "all layers" (-1) is none (0), so that a CPU-only
        build runs exactly as with ``-ngl 0``."""
        if self.n_gpu_layers < 0 and not self.rpc and not local_gpus:
            return dataclasses.replace(self, n_gpu_layers=0)
        return self

    def for_draft(self, path: str, **changes: Any) -> ModelSettings:
        """The draft model's settings: this (the target's) settings, its own ``path``, and the
        ``changes`` the draft sets itself. As llama.cpp's draft does, it follows the target's
        threads and GPU offload; here it also follows its KV cache types, flash attention and
        loading, unless told otherwise. It does not follow the target onto rpc servers (nor the
        tensor_split over them): a draft runs here unless ``changes`` give it servers."""
        remote = {"rpc": (), "tensor_split": ()} if self.rpc else {}
        return dataclasses.replace(self, path=path, **{**remote, **changes})
