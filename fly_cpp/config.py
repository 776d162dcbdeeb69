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
from fly_cpp.rollback import CHOICES as ROLLBACK

MODES = ("fly", "spd", "target")
AUTO_SLOTS = 4  # -np auto, llama-server's choice
AUTO = "auto"  # k: the cost-aware controller picks each round's draft length
FLY_RULES = ("guarded", "paper")
LOOSEN = ("auto", "on", "off")
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
    spec_type: str = field(default="auto", metadata=_help(
        "who drafts: 'draft-mtp' = the target's own MTP head (a model that keeps its MTP layers, loaded without -d); "
        "'auto' = the draft model when -d is given, else the MTP head when the target has one, else n-gram lookup"))
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
    loosen: str = field(default="auto", metadata=_help(
        "fly: 'auto' = loose acceptance, except under k auto with a draft model a tenth of the target's bytes or more "
        "or a target under 256 MiB (asking the draft for its tokens would cost more than they "
        "save: fly then matches exactly), with one slot or several alike; 'on' = always; "
        "'off' = never (fly's text is then spd's)"))
    loose_min_ratio: float = field(default=0.5, metadata=_help(
        "fly, guarded: loosen a mismatch only where the target finds the drafted token at least this fraction "
        "as likely as its own top token, p(d)/p(top); 0 = any (docs/fly-rule.md: the measurements behind 0.5)"))
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
    cross_round: bool | None = field(default=None, metadata=_help(
        "fly: keep a gated mismatch near the end of a draft provisionally and finish its window in the next round "
        "[default: on under the guarded rule, off under the published one]",
        flag="cross-round-window"))
    k_max: int = field(default=16, metadata=_help("with k auto: the longest draft a round may make"))
    k_gpu: int | str = field(default=AUTO, metadata=_help(
        "with k auto on a target whose every layer is on a GPU, where a decode costs more when the batch's shape "
        "changes (measured on an H100, docs/benchmarks.md): 'auto' = every round of a generation drafts the one "
        "length k auto's measured costs and the draft's acceptance pick at its start; a number = draft that many "
        "every round; 0 = plan each round there too"))
    k_slots: int = field(default=3, metadata=_help(
        "with k auto and several slots generating at once: the draft length of their rounds, drafted for every "
        "slot together (one draft-model batch a step, every slot's rows in one target batch), as llama-server's "
        "slots draft; 0 = under load, draft only what fly's windows need"))
    cross_round_confidence: float = field(default=0.5, metadata=_help(
        "cross-round under --fly-rule paper: keep a tail mismatch only when the draft's running agreement makes "
        "completing its window at least this likely; 0 = always (the guarded rule always finishes a window, so "
        "that its text does not depend on how the rounds went)"))
    steady_batches: str = field(default="off", metadata=_help(
        "pad the target's verification batches to the widest of the recent rounds, so that their shape stays "
        "steady (a GPU reruns a decode of the shape it ran last faster; on an H100 it recovered part of planned "
        "rounds' loss, a fixed k more: --k-gpu); "
        "auto = on when the target is offloaded to a GPU or rpc server"))

    def __post_init__(self) -> None:
        _require(self.mode in MODES, f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.spec_type == "mtp":
            object.__setattr__(self, "spec_type", "draft-mtp")
        _require(self.spec_type in SPEC_TYPES,
                 f"spec_type must be one of {', '.join(SPEC_TYPES)} (or mtp), got {self.spec_type!r}")
        _require(self.k == AUTO or (isinstance(self.k, int) and not isinstance(self.k, bool) and self.k >= 1),
                 f"k must be >= 1 (or 'auto'), got {self.k!r}")
        _integer("k_max", self.k_max, 1)
        _require(self.k_gpu == AUTO or (isinstance(self.k_gpu, int) and not isinstance(self.k_gpu, bool)
                                        and self.k_gpu >= 0), f"k_gpu must be >= 0 (or 'auto'), got {self.k_gpu!r}")
        _integer("k_slots", self.k_slots, 0)
        _integer("window", self.window, 0)
        _number("entropy_threshold", self.entropy_threshold, 0, inf=True)
        _require(self.fly_rule in FLY_RULES, f"fly_rule must be one of {', '.join(FLY_RULES)}, got {self.fly_rule!r}")
        _require(self.loosen in LOOSEN, f"loosen must be one of {', '.join(LOOSEN)}, got {self.loosen!r}")
        _number("loose_min_ratio", self.loose_min_ratio, 0, 1)
        _integer("loose_top_n", self.loose_top_n, 0)
        _integer("ngram_max", self.ngram_max, 1)
        _integer("ngram_tokens", self.ngram_tokens, 1)
        _require(isinstance(self.p_min, (int, float)) and 0.0 <= self.p_min <= 1.0,
                 f"p_min must be in [0, 1], got {self.p_min}")
        _require(self.n_min >= 0, f"n_min must be >= 0, got {self.n_min}")
        _require(self.n_min <= self.max_draft, f"n_min ({self.n_min}) must be <= "
                 + (f"k ({self.k})" if self.k != AUTO else f"k_max ({self.k_max})"))
        _require(isinstance(self.cross_round_confidence, (int, float)) and 0.0 <= self.cross_round_confidence < 1.0,
                 f"cross_round_confidence must be in [0, 1), got {self.cross_round_confidence}")
        _require(self.steady_batches in STEADY,
                 f"steady_batches must be one of {', '.join(STEADY)}, got {self.steady_batches!r}")

    @property
    def auto(self) -> bool:
        """Whether each round's draft length is chosen by the cost-aware controller."""
        return self.k == AUTO

    @property
    def max_draft(self) -> int:
        """The longest draft of a round: k, or k_max with k auto."""
        return self.k_max if self.k == AUTO else int(self.k)

    @property
    def cross_round_window(self) -> bool:
        """Whether the cross-round window is on: as set, else with the guarded rule (the
        published rule stays the paper's bit for bit unless asked)."""
        return self.cross_round if self.cross_round is not None else self.fly_rule == "guarded"

    def policy(self) -> AcceptPolicy:
        """The accept rule's knobs for this mode: FLy's window and gate (with the safeguards
        unless the rule is the paper's), or exact matching."""
        if self.mode != "fly" or self.loosen == "off":
            return AcceptPolicy.exact()
        if self.fly_rule == "paper":
            return AcceptPolicy(self.window, self.entropy_threshold)
        return AcceptPolicy(self.window, self.entropy_threshold, top_n=self.loose_top_n,
                            min_ratio=self.loose_min_ratio, supported=True, loose_in_code=self.loose_in_code,
                            loose_digits=self.loose_digits, own_only=self.cross_round_window)

    @property
    def reproducible(self) -> bool:
        """Whether the text depends on the request alone (the prompt, the settings and the seed),
        not on how far each round drafted, which k auto decides from live timings: always for
        spd and target, and for fly under the guarded rule with the cross-round window (the
        defaults); not under the published rule, whose window must fit in one draft."""
        return self.mode != "fly" or not self.policy().loosens or self.policy().own_only


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
    logit_bias: tuple[tuple[int, float], ...] = field(default=(), metadata=_help(
        "add to token logits, target and draft alike: TOKEN+BIAS or TOKEN-BIAS, comma-separated "
        "(e.g. 15043+1.5,2-inf; -inf bans the token)", aliases=("-l",)))
    ignore_eos: bool = field(default=False, metadata=_help(
        "never end the text with an end-of-generation token (they are banned); it ends at max tokens"))
    grammar: str = field(default="", metadata=_help(
        "GBNF grammar (llama.cpp's) every generated token obeys, exact, loosely accepted or the target's own"))
    json_schema: str = field(default="", metadata=_help(
        "JSON schema the answer follows (converted to a grammar); {} = any JSON object", aliases=("-j",)))
    grammar_trigger: str = field(default="", metadata=_help(
        "a lazy grammar: the text is free until it writes this word, and the grammar (or schema) constrains "
        "what follows the word (tool calls use <tool_call>)"))
    preserved_tokens: tuple[str, ...] = field(default=(), metadata=_help(
        "special tokens written into the text when generated (others render as nothing), as a tool call's "
        "[TOOL_CALLS] or <|python_tag|> must be to be read"))

    def __post_init__(self) -> None:
        for name in ("grammar", "json_schema"):
            _require(isinstance(getattr(self, name), str), f"{name} must be a string, got {getattr(self, name)!r}")
        _require(not (self.grammar and self.json_schema), "give grammar or json_schema, not both")
        _require(isinstance(self.grammar_trigger, str), f"grammar_trigger must be a string, got {self.grammar_trigger!r}")
        _require(not self.grammar_trigger or (self.constrained and len(self.grammar_trigger) >= 2),
                 "grammar_trigger needs a grammar or json_schema, and at least 2 characters")
        _require(isinstance(self.preserved_tokens, tuple) and all(isinstance(t, str) and t for t in self.preserved_tokens),
                 f"preserved_tokens must be a list of token texts, got {self.preserved_tokens!r}")
        _number("temperature", self.temperature, 0)
        _integer("top_k", self.top_k, 0)
        _number("top_p", self.top_p, 0.0, 1.0, above=True)
        _number("min_p", self.min_p, 0.0, 1.0)
        _number("repeat_penalty", self.repeat_penalty, 0.0, above=True)
        _integer("repeat_last_n", self.repeat_last_n, 0)
        _number("presence_penalty", self.presence_penalty)
        _number("frequency_penalty", self.frequency_penalty)
        _require(self.seed is None or (isinstance(self.seed, int) and 0 <= self.seed <= MAX_SEED),
                 f"seed must be >= 0 and < 2**64, got {self.seed}")
        for pair in self.logit_bias:
            _require(isinstance(pair, tuple) and len(pair) == 2, f"logit_bias entries must be (token, bias) pairs, got {pair!r}")
            _integer("logit_bias token", pair[0], 0)
            bias = pair[1]
            if bias != -math.inf:
                _number(f"logit_bias of token {pair[0]}", bias)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def biased(self) -> bool:
        """Whether logits are changed before the sampler chain (logit_bias, ignore_eos)."""
        return bool(self.logit_bias) or self.ignore_eos

    @property
    def constrained(self) -> bool:
        """Whether a grammar or a JSON schema constrains the output."""
        return bool(self.grammar or self.json_schema)

    @property
    def penalised(self) -> bool:
        return self.repeat_last_n > 0 and (
            self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
        )



@dataclass(frozen=True)
class ServerSettings:
    """``fly-cpp serve``: where it listens, who may call it, and the limits that keep it up
    under hostile or heavy traffic."""

    host: str = field(default="127.0.0.1", metadata=_help(
        "address to listen on (0.0.0.0: every interface); several, comma-separated"))
    port: int = field(default=8080, metadata=_help("TCP port (0: any free one)"))
    api_key: str | None = field(default=None, repr=False, metadata=_help(
        "require 'Authorization: Bearer KEY' (or 'X-Api-Key: KEY') on every endpoint but /health and the chat page",
        envvar="FLY_CPP_API_KEY"))
    strict: bool = field(default=False, metadata=_help(
        "refuse (HTTP 400) request fields fly-cpp would ignore: unknown ones, and llama-server's samplers it "
        "does not implement; by default they are ignored and logged once per name"))
    cors_origins: str = field(default="*", metadata=_help(
        "origins web pages may call from: *, 'localhost' (pages on this machine only), or a comma-separated list"))
    cors_methods: str = field(default="GET,POST,DELETE,OPTIONS", metadata=_help("methods allowed from other origins, comma-separated"))
    cors_headers: str = field(default="*", metadata=_help("request headers allowed from other origins, comma-separated"))
    cors_credentials: bool = field(default=True, metadata=_help(
        "allow credentials (cookies) from the allowed origins (as llama-server does)"))
    n_predict: int = field(default=-1, metadata=_help(
        "tokens a request generates when it does not say (n_predict / max_tokens); -1 = until the end of the "
        "text or a full context", aliases=("--predict",)))
    ui: bool = field(default=True, metadata=_help("serve the chat page at / (--no-ui: the API only)"))
    slots: bool = field(default=True, metadata=_help("answer /slots (--no-slots: HTTP 501, as llama-server)"))
    metrics: bool = field(default=False, metadata=_help(
        "answer /metrics (Prometheus counters; off: HTTP 501, as llama-server without --metrics)"))
    sleep_idle_seconds: float = field(default=-1, metadata=_help(
        "free the models after this many seconds without work, load them again for the next request that needs "
        "them (-1: never)"))
    alias: str | None = field(default=None, metadata=_help(
        "the model name /v1/models and every response report; several, comma-separated, are all listed as "
        "its aliases and the first in sorted order is its id [default: the target's file name]", aliases=("-a",)))
    tags: str = field(default="", metadata=_help("comma-separated tags /v1/models reports for the model"))
    max_body: int = field(default=8 * 2**20, metadata=_help("largest request body in bytes (HTTP 413 beyond)"))
    header_timeout: float = field(default=10.0, metadata=_help(
        "seconds a connection gets to send a request's headers, new or kept alive, before it is closed"))
    body_timeout: float = field(default=60.0, metadata=_help("seconds a request gets to send its body (HTTP 408 after)"))
    keep_alive: float = field(default=5.0, metadata=_help("seconds an idle keep-alive connection stays open"))
    max_connections: int = field(default=512, metadata=_help(
        "open connections at most (also kept under the open-file limit): a new one displaces the longest idle "
        "one, else it gets HTTP 503"))
    max_queue: int = field(default=128, metadata=_help("generation requests waiting for the engine at most (HTTP 503 beyond)"))
    grace: float = field(default=10.0, metadata=_help(
        "seconds open requests get to end after SIGINT/SIGTERM (generations stop at once and say so)"))
    parallel: int | str = field(default=AUTO, metadata=_help(
        "slots: requests generated at once, their rows sharing the models' batches (auto: 4 sharing one cache "
        "as with --kv-unified, as llama-server; 1 where the target drafts with its own MTP head, which drafts for "
        "one sequence)",
        aliases=("-np",)))
    kv_unified: bool = field(default=False, metadata=_help(
        "the slots share all of -c's positions (one cache; off: each slot has -c / -np of its own, as llama-server)",
        aliases=("-kvu",)))
    cont_batching: bool = field(default=True, metadata=_help(
        "a new request joins the running slots between rounds (always so; accepted for llama-server's spelling)",
        aliases=("-cb",)))
    reasoning: str = field(default="auto", metadata=_help(
        "on|off|auto: the chat template's enable_thinking (false only with off, as llama-server); a request's "
        "chat_template_kwargs win", aliases=("-rea",)))
    reasoning_format: str = field(default="auto", metadata=_help(
        "auto|deepseek: a reasoning model's <think> block goes to reasoning_content; none: it stays in the content"))
    context_shift: bool = field(default=False, metadata=_help(
        "a text that fills the context keeps its first n_keep tokens (the request's, BOS included), drops half "
        "of the rest (or the request's n_discard) and goes on; off: it ends there (as llama-server)"))
    verbose: bool = field(default=False, metadata=_help(
        "OpenAI's whole answers carry __verbose: /completion's answer, the prompt as the model read it included "
        "(a request's verbose wins)"))

    def __post_init__(self) -> None:
        _require(isinstance(self.host, str) and bool(self.host.strip()), "host must not be empty")
        _require(self.reasoning in ("on", "off", "auto"), f"reasoning must be on, off or auto, got {self.reasoning!r}")
        _require(self.reasoning_format in ("auto", "deepseek", "none"),
                 f"reasoning_format must be auto, deepseek or none, got {self.reasoning_format!r}")
        _integer("port", self.port, 0, 65535)
        if self.api_key is not None:
            key = self.api_key.strip()
            _require(bool(key), "the API key is empty: give a non-empty --api-key (or FLY_CPP_API_KEY), or none "
                     "for a server without authentication")
            _require(key.isascii() and key.isprintable() and " " not in key,
                     "the API key must be printable ASCII without spaces (HTTP headers carry it)")
            object.__setattr__(self, "api_key", key)
        _integer("n_predict", self.n_predict, -1, 2**31 - 1)
        _integer("max_body", self.max_body, 1024, 2**40)
        _number("header_timeout", self.header_timeout, 0, 86400, above=True)
        _number("body_timeout", self.body_timeout, 0, 86400, above=True)
        _number("keep_alive", self.keep_alive, 0, 86400, above=True)
        _integer("max_connections", self.max_connections, 4, 2**20)
        _integer("max_queue", self.max_queue, 0, 2**20)
        _number("grace", self.grace, 0, 86400)
        _require(self.sleep_idle_seconds == -1 or 0 < self.sleep_idle_seconds <= 10**9,
                 f"sleep_idle_seconds must be > 0 (or -1: never), got {self.sleep_idle_seconds!r}")
        _require(self.parallel == AUTO or (isinstance(self.parallel, int) and not isinstance(self.parallel, bool)
                                           and 1 <= self.parallel <= 256),
                 f"parallel must be 1..256 (or 'auto'), got {self.parallel!r}")

    @property
    def n_slots(self) -> int:
        """The slots ``parallel`` asks for ('auto': 4, as llama-server; ``fly_cpp.fit.auto_slots``
        resolves it for a pair)."""
        return AUTO_SLOTS if self.parallel == AUTO else int(self.parallel)

    @property
    def unified(self) -> bool:
        """Whether the slots share one KV cache: as set, and with ``parallel`` 'auto' (as
        llama-server; the F16 Qwen pair at 4 clients ran 24.2 tok/s with one cache, 23.6 with a
        cache per slot, docs/slots.md)."""
        return self.kv_unified or self.parallel == AUTO

    @property
    def hosts(self) -> list[str]:
        """The addresses to listen on: ``host`` may name several, comma-separated."""
        return [h.strip() for h in self.host.split(",") if h.strip()]

    @property
    def alias_list(self) -> list[str]:
        return sorted({a.strip() for a in (self.alias or "").split(",") if a.strip()})

    @property
    def tag_list(self) -> list[str]:
        return [t.strip() for t in self.tags.split(",") if t.strip()]

    @property
    def cors_origin_list(self) -> list[str]:
        return [o.strip() for o in self.cors_origins.split(",") if o.strip()]
