"""What a pair asks of this machine, read from the GGUF headers before any weights load: the
context size and whether its KV caches fit in memory, the slots ``-np auto`` gives, and where
"every layer" (-ngl's default) goes here. ``Engine`` and ``Engine.preflight`` (the server's check
before it binds its port) ask it the same questions.
"""

from __future__ import annotations

from fly_cpp.backend.lib import gpu_names
from fly_cpp.backend.model import gguf_hparams, kv_bytes_per_token
from fly_cpp.basics.errors import FlyError
from fly_cpp.config import AUTO_SLOTS, ModelSettings

DEFAULT_MAX_CTX = 4096


def available_memory() -> int | None:
    """Bytes of memory available to new allocations (Linux's MemAvailable), None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def size_text(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} PiB"


KV_SIZE = {"f32": 2.0, "f16": 1.0, "bf16": 1.0, "q8_0": 0.53, "q5_1": 0.38, "q5_0": 0.34, "q4_1": 0.31,
           "q4_0": 0.28, "iq4_nl": 0.28}  # bytes per KV element, relative to F16


def check_context(target: ModelSettings, draft: ModelSettings | None) -> int:
    """The context size ``target`` asks for (0: the model's trained context, at most 4096), or a
    FlyError before llama.cpp allocates anything: KV caches that cannot fit in this machine's
    memory (CPU-only engines). More than the model was trained for is allowed, as llama.cpp
    allows it (the text degrades past the trained length)."""
    models = [(target, gguf_hparams(target.path))]
    if draft is not None:
        models.append((draft, gguf_hparams(draft.path)))
    trained = models[0][1].get("context_length", 0)
    n_ctx = target.n_ctx or min(trained or DEFAULT_MAX_CTX, DEFAULT_MAX_CTX)
    if any(s.offloaded_layers != 0 for s, _ in models):
        return n_ctx  # the caches live on the devices (GPUs, rpc-servers): llama.cpp reports what does not fit
    # the KV caches, and the attention scores of one micro-batch against the whole context
    need = sum(n_ctx * kv_bytes_per_token(h) * (KV_SIZE.get(s.type_k, 1.0) + KV_SIZE.get(s.type_v, 1.0)) / 2
               + min(s.n_ubatch, s.n_batch, n_ctx) * n_ctx * 4 * h.get("attention.head_count", 1) for s, h in models)
    free = available_memory()
    if free is not None and need > free:
        raise FlyError(f"n_ctx {n_ctx} needs about {size_text(need)} for the KV caches, more than the "
                       f"{size_text(free)} of memory available; lower -c/--n-ctx")
    return n_ctx


def auto_slots(target: ModelSettings, draft: ModelSettings | None) -> int:
    """The slots ``-np auto`` gives a pair: llama-server's 4, or 1 where the target drafts with
    its own MTP head (no draft model and MTP layers in its GGUF), since the head drafts for one
    sequence; from the GGUF header alone."""
    if draft is None and gguf_hparams(target.path).get("nextn_predict_layers", 0) > 0:
        return 1
    return AUTO_SLOTS


def placed(model: ModelSettings | str) -> ModelSettings:
    """A model's settings as they load here: "every layer" is none without a GPU or rpc server."""
    settings = model if isinstance(model, ModelSettings) else ModelSettings(path=str(model))
    return settings.placed(local_gpus=bool(gpu_names()))
