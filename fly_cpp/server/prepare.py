"""From a validated request body to a ready Generation: the CPU work of a request before its
first token (chat template rendering, tokenisation, logit_bias strings, prompt truncation).

It runs on a thread of its own (``prepare``), never on the event loop: a 5 MB prompt takes
seconds to tokenise, and every other client (health checks and open streams included) would
wait that long.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from starlette.concurrency import run_in_threadpool

from fly_cpp.api import Fly
from fly_cpp.errors import FlyError
from fly_cpp.generation import Generation
from fly_cpp.server import prompts
from fly_cpp.server.fields import GenerationBody, logit_bias

T = TypeVar("T")
RESERVED = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token"})


async def prepare(work: Callable[[], T]) -> T:
    """Run a request's CPU work off the event loop."""
    return await run_in_threadpool(work)


@dataclass
class Prepared:
    gen: Generation
    truncated: bool  # the prompt lost a middle part to fit (n_keep)


def limit(*given: int | None, default: int = -1) -> int | None:
    """The first limit given (llama-server's n_predict wins, as there), else the server's
    default; -1: no limit (until end of text or the context is full)."""
    n = next((n for n in given if n is not None), default)
    return None if n == -1 else n


def generation(fly: Fly, body: GenerationBody, *, prompt: Any = None,
               messages: list[dict[str, Any]] | None = None, max_tokens: int | None,
               n_probs: int = 0) -> Prepared:
    """The Generation a generation body asks for (one ``prompt`` of any shape ``prompts``
    reads, or chat ``messages``)."""
    settings = body.settings()
    bias = logit_bias(body.logit_bias, lambda text: fly.tokenize(text, add_special=False, parse_special=True))
    if bias is not None:
        settings["logit_bias"] = bias
    stop: tuple[str, ...] = _stops(body.stop)
    if messages is not None:
        tokens = chat_prompt(fly, body, messages)
        stop = (*fly.chat_format.stop, *stop)
    else:
        tokens = prompts.tokens(fly, prompt if prompt is not None else [])
    tokens, truncated = keep(tokens, fly.n_ctx, body.n_keep)
    gen = fly.generate(tokens, max_tokens=max_tokens, stop=stop, n_probs=n_probs, cache_prompt=body.cache_prompt,
                       slot=_slot(body), **settings)
    return Prepared(gen, truncated)


def chat_prompt(fly: Fly, body: GenerationBody, messages: list[dict[str, Any]]) -> list[int]:
    """The prompt tokens of a chat body: its messages through the chat template, with the
    body's template variables (what a generation would decode, and what the token-counting
    endpoints count)."""
    extra = dict(getattr(body, "chat_template_kwargs", None) or {})
    if (clash := RESERVED & extra.keys()):
        raise FlyError(f"chat_template_kwargs may not set {sorted(clash)[0]!r}")
    if getattr(body, "reasoning_effort", None) is not None:
        extra.setdefault("reasoning_effort", body.reasoning_effort)
    return fly.chat_tokens(messages, **extra)


def _slot(body: Any) -> int | None:
    """The slot a body asks for (llama-server's ``id_slot``; -1 or absent: any)."""
    slot = getattr(body, "id_slot", -1)
    return None if slot is None or slot < 0 else slot


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def keep(tokens: Sequence[int], n_ctx: int, n_keep: int) -> tuple[list[int], bool]:
    """llama-server's prompt truncation: a prompt that fills the context keeps its first
    ``n_keep`` tokens (-1: as many as can be kept) and drops whole blocks of half the remaining
    room after them, so the end of the prompt stays. ``n_keep`` 0 truncates nothing (fly-cpp
    then refuses a prompt longer than the context)."""
    tokens = list(tokens)
    if n_keep == 0 or len(tokens) < n_ctx:
        return tokens, False
    n_keep = min(len(tokens) if n_keep < 0 else n_keep, n_ctx - 4)
    block = (n_ctx - n_keep) // 2
    if n_keep < 0 or block <= 0:
        return tokens, False
    erased = (len(tokens) - n_keep - block) // block
    return tokens[:n_keep] + tokens[n_keep + erased * block:], True
