"""Settings, as frozen dataclasses validated on creation.

The CLI options and the server's request fields are derived from these fields (their
``metadata["help"]`` is the one place an option is described), so a setting is declared once.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any

from fly_cpp.accept import AcceptPolicy
from fly_cpp.errors import FlyError

MODES = ("fly", "spd", "target")
AUTO = "auto"  # k: the cost-aware controller picks each round's draft length
FLY_RULES = ("guarded", "paper")
SPLIT_MODES = ("none", "layer", "row")
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")  # llama.cpp's KV cache types
FLASH_ATTN = ("auto", "on", "off")


def _help(text: str, *, aliases: tuple[str, ...] = (), draft: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
    """A field's metadata: its help text, and the spellings llama.cpp gives the option
    (``aliases``; ``draft``: those of the draft model's copy, e.g. ``-td``), which the command
    line accepts besides the field's own name (``extra`` may name llama-cpp-python's keyword for
    it, ``python="use_mmap"``, which the Python API accepts)."""
    return {"help": text, "aliases": aliases, "draft_aliases": draft, **extra}


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise FlyError(message)


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
    n_gpu_layers: int = field(default=0, metadata=_help(
        "layers to offload to the GPU; -1 = all", aliases=("-ngl", "--gpu-layers"),
        draft=("-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft", "--spec-draft-ngl")))
    split_mode: str = field(default="layer", metadata=_help("multi-GPU split: none, layer or row",
                                                            aliases=("-sm", "--split-mode")))
    tensor_split: tuple[float, ...] = field(default=(), metadata=_help("share of the model per GPU, e.g. 3,1",
                                                                       aliases=("-ts",)))
    main_gpu: int = field(default=0, metadata=_help("GPU used when split_mode is none", aliases=("-mg",)))
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

    def __post_init__(self) -> None:
        _require(self.n_ctx >= 0, f"n_ctx must be >= 0, got {self.n_ctx}")
        _require(self.n_threads >= 0, f"n_threads must be >= 0, got {self.n_threads}")
        _require(self.n_batch >= 1, f"n_batch must be >= 1, got {self.n_batch}")
        _require(self.n_ubatch >= 1, f"n_ubatch must be >= 1, got {self.n_ubatch}")
        _require(self.split_mode in SPLIT_MODES, f"split_mode must be one of {', '.join(SPLIT_MODES)}, got {self.split_mode!r}")
        _require(all(s >= 0 for s in self.tensor_split), "tensor_split entries must be >= 0")
        _require(self.main_gpu >= 0, f"main_gpu must be >= 0, got {self.main_gpu}")
        for name in ("type_k", "type_v"):
            value = getattr(self, name)
            _require(isinstance(value, str) and value.lower() in CACHE_TYPES,
                     f"{name} must be one of {', '.join(CACHE_TYPES)}, got {value!r}")
            object.__setattr__(self, name, value.lower())
        if isinstance(self.flash_attn, bool):  # llama-cpp-python's flash_attn=True
            object.__setattr__(self, "flash_attn", "on" if self.flash_attn else "off")
        _require(self.flash_attn in FLASH_ATTN, f"flash_attn must be one of {', '.join(FLASH_ATTN)}, got {self.flash_attn!r}")

    @property
    def threads(self) -> int:
        return self.n_threads or int(os.environ.get("FLY_CPP_THREADS") or 0) or os.cpu_count() or 1

    def for_draft(self, path: str, **changes: Any) -> ModelSettings:
        """The draft model's settings: this (the target's) settings, its own ``path``, and the
        ``changes`` the draft sets itself. As llama.cpp's draft does, it follows the target's
        threads and GPU offload; here it also follows its KV cache types, flash attention and
        loading, unless told otherwise."""
        return dataclasses.replace(self, path=path, **changes)


@dataclass(frozen=True)
class SpecSettings:
    """Which decoding mode runs and how drafts are made and judged.

    ``window`` counts the positions of the deferred window *including the mismatch itself*,
    as the authors' released code does: window 6 keeps a mismatch only when the target then
    agrees with the next 5 drafted tokens. (vLLM's ``fly_window_size`` counts only the tokens
    after the mismatch: vLLM's 5 is our 6.) ``window`` 1 keeps every mismatch the entropy gate
    lets through; ``window`` 0 switches loose acceptance off (exact-match decoding).

    ``fly_rule`` "paper" is the published rule exactly (window and gate); "guarded" adds the
    ``loose_*`` safeguards of ``fly_cpp.accept`` and never loosens a token the target's own
    sampler could not produce.
    """

    mode: str = field(default="fly", metadata=_help("fly (loose acceptance), spd (exact match) or target (no drafting)"))
    k: int | str = field(default=AUTO, metadata=_help(
        "tokens drafted per round: a number, or 'auto' (each round drafts what pays most on this machine, "
        "measured: 0 = a plain target decode)", aliases=("--draft-max", "--draft-n", "--spec-draft-n-max")))
    window: int = field(default=6, metadata=_help("deferred window, counting the mismatch itself; 0 = no loose accepts"))
    entropy_threshold: float = field(default=0.3, metadata=_help(
        "entropy gate in nats: a mismatch may be loosely accepted only where the target's top-3 entropy is at "
        "least this (the target was unsure); top-3 entropy is at most ln 3 = 1.10, so a higher value, or 'inf', "
        "switches loose accepts off"))
    fly_rule: str = field(default="guarded", metadata=_help(
        "fly: 'paper' = the published rule (deferred window and entropy gate only); 'guarded' = also the "
        "--loose-* safeguards, and never a token the target's sampler could not produce"))
    loose_min_ratio: float = field(default=0.0, metadata=_help(
        "fly, guarded: loosen a mismatch only where the target finds the drafted token at least this fraction "
        "as likely as its own top token, p(d)/p(top); 0 = any"))
    loose_top_n: int = field(default=0, metadata=_help(
        "fly, guarded: loosen a mismatch only where the drafted token is among the target's n most likely; 0 = any"))
    loose_in_code: bool = field(default=True, metadata=_help(
        "fly, guarded: loosen mismatches inside ``` code blocks of the answer too"))
    loose_digits: bool = field(default=True, metadata=_help(
        "fly, guarded: loosen mismatches where the drafted or the target's token holds a digit too"))
    ngram: bool = field(default=True, metadata=_help("speed up the drafter with n-gram lookup"))
    ngram_max: int = field(default=4, metadata=_help("longest n-gram looked up"))
    ngram_tokens: int = field(default=6, metadata=_help("tokens proposed per n-gram hit"))
    p_min: float = field(default=0.0, metadata=_help(
        "stop a draft when the draft's top probability falls below this",
        aliases=("--draft-p-min", "--spec-draft-p-min")))
    n_min: int = field(default=0, metadata=_help(
        "drop drafts shorter than this (the target then decodes one token alone that round); a round that "
        "may draft fewer (near the end of -n or of the context) keeps a draft of that length",
        aliases=("--draft-min", "--draft-n-min", "--spec-draft-n-min")))
    cross_round: bool = field(default=False, metadata=_help(
        "fly: keep a gated mismatch near the end of a draft provisionally and finish its window in the next round",
        flag="cross-round-window"))
    k_max: int = field(default=16, metadata=_help("with k auto: the longest draft a round may make"))
    cross_round_confidence: float = field(default=0.5, metadata=_help(
        "cross-round: keep a tail mismatch only when the draft's running agreement makes completing its "
        "window at least this likely; 0 = always"))

    def __post_init__(self) -> None:
        _require(self.mode in MODES, f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        _require(self.k == AUTO or (isinstance(self.k, int) and not isinstance(self.k, bool) and self.k >= 1),
                 f"k must be >= 1 (or 'auto'), got {self.k!r}")
        _require(self.k_max >= 1, f"k_max must be >= 1, got {self.k_max}")
        _require(self.window >= 0, f"window must be >= 0, got {self.window}")
        _require(not math.isnan(self.entropy_threshold) and self.entropy_threshold >= 0,
                 f"entropy_threshold must be >= 0, got {self.entropy_threshold}")
        _require(self.fly_rule in FLY_RULES, f"fly_rule must be one of {', '.join(FLY_RULES)}, got {self.fly_rule!r}")
        _require(0.0 <= self.loose_min_ratio <= 1.0, f"loose_min_ratio must be in [0, 1], got {self.loose_min_ratio}")
        _require(self.loose_top_n >= 0, f"loose_top_n must be >= 0, got {self.loose_top_n}")
        _require(self.ngram_max >= 1, f"ngram_max must be >= 1, got {self.ngram_max}")
        _require(self.ngram_tokens >= 1, f"ngram_tokens must be >= 1, got {self.ngram_tokens}")
        _require(0.0 <= self.p_min <= 1.0, f"p_min must be in [0, 1], got {self.p_min}")
        _require(self.n_min >= 0, f"n_min must be >= 0, got {self.n_min}")
        _require(self.n_min <= self.max_draft, f"n_min ({self.n_min}) must be <= "
                 + (f"k ({self.k})" if self.k != AUTO else f"k_max ({self.k_max})"))
        _require(0.0 <= self.cross_round_confidence < 1.0,
                 f"cross_round_confidence must be in [0, 1), got {self.cross_round_confidence}")

    @property
    def auto(self) -> bool:
        """Whether each round's draft length is chosen by the cost-aware controller."""
        return self.k == AUTO

    @property
    def max_draft(self) -> int:
        """The longest draft of a round: k, or k_max with k auto."""
        return self.k_max if self.k == AUTO else int(self.k)

    def policy(self) -> AcceptPolicy:
        """The accept rule's knobs for this mode: FLy's window and gate (with the safeguards
        unless the rule is the paper's), or exact matching."""
        if self.mode != "fly":
            return AcceptPolicy.exact()
        if self.fly_rule == "paper":
            return AcceptPolicy(self.window, self.entropy_threshold)
        return AcceptPolicy(self.window, self.entropy_threshold, top_n=self.loose_top_n,
                            min_ratio=self.loose_min_ratio, supported=True, loose_in_code=self.loose_in_code,
                            loose_digits=self.loose_digits)


@dataclass(frozen=True)
class SamplingSettings:
    """llama.cpp's sampling chain: penalties, top-k, top-p, min-p, temperature.

    Temperature 0 is greedy decoding (the default). The entropy gate always reads the raw,
    untempered target logits.
    """

    temperature: float = field(default=0.0, metadata=_help("0 = greedy", aliases=("--temp",)))
    top_k: int = field(default=40, metadata=_help("keep the k most likely tokens; 0 = all"))
    top_p: float = field(default=0.95, metadata=_help("nucleus sampling; 1 = off"))
    min_p: float = field(default=0.05, metadata=_help("drop tokens below min_p times the top probability; 0 = off"))
    repeat_penalty: float = field(default=1.0, metadata=_help("penalise recent tokens; 1 = off"))
    repeat_last_n: int = field(default=64, metadata=_help("how many recent tokens the penalties look at"))
    presence_penalty: float = field(default=0.0, metadata=_help("subtract once from every recent token; 0 = off"))
    frequency_penalty: float = field(default=0.0, metadata=_help("subtract per occurrence of a recent token; 0 = off"))
    seed: int | None = field(default=None, metadata=_help("random seed; unset = a fresh one per generation",
                                                          aliases=("-s",)))

    def __post_init__(self) -> None:
        _require(math.isfinite(self.temperature) and self.temperature >= 0,
                 f"temperature must be >= 0, got {self.temperature}")
        _require(self.top_k >= 0, f"top_k must be >= 0, got {self.top_k}")
        _require(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}")
        _require(0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}")
        _require(self.repeat_penalty > 0, f"repeat_penalty must be > 0, got {self.repeat_penalty}")
        _require(self.repeat_last_n >= 0, f"repeat_last_n must be >= 0, got {self.repeat_last_n}")
        _require(self.seed is None or self.seed >= 0, f"seed must be >= 0, got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalised(self) -> bool:
        return self.repeat_last_n > 0 and (
            self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
        )

