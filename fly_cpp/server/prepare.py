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

from fly_cpp.api import reply, tools
from fly_cpp.api.fly import Fly
from fly_cpp.basics.errors import FlyError
from fly_cpp.engine.generation import Generation
from fly_cpp.rounds.request import Shift
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
    reading: reply.Options = reply.Options()  # how a chat answer is split (reasoning, tool calls)


@dataclass(frozen=True)
class Defaults:
    """The server's options every generation request follows: ``--reasoning`` (on, off, auto:
    the template's enable_thinking, false only for off) and ``--reasoning-format`` (auto,
    deepseek, none), which requests may override, and ``--context-shift``."""

    reasoning: str = "auto"
    reasoning_format: str = "auto"
    context_shift: bool = False


def template_vars(body: Any, defaults: Defaults) -> dict[str, Any]:
    """The chat template's extra variables, as llama-server sets them: ``enable_thinking`` from
    ``--reasoning`` (on and auto: true; off: false) unless ``chat_template_kwargs`` sets it;
    ``reasoning_effort`` passed on ("none": thinking off)."""
    extra = dict(getattr(body, "chat_template_kwargs", None) or {})
    if (clash := RESERVED & extra.keys()):
        raise FlyError(f"chat_template_kwargs may not set {sorted(clash)[0]!r}")
    if "enable_thinking" in extra and not isinstance(extra["enable_thinking"], bool):
        raise FlyError("chat_template_kwargs: enable_thinking must be true or false")
    # llama-server always sets it: true unless --reasoning off (its auto turns thinking on where
    # the template knows the variable; a template that does not read it is unchanged either way)
    extra.setdefault("enable_thinking", defaults.reasoning != "off")
    effort = getattr(body, "reasoning_effort", None)
    if effort == "none":
        extra["enable_thinking"] = False
    elif effort is not None:
        extra.setdefault("reasoning_effort", effort)
    return extra


def limit(*given: int | None, default: int = -1) -> int | None:
    """The first limit given (llama-server's n_predict wins, as there), else the server's
    default; -1: no limit (until end of text or the context is full)."""
    n = next((n for n in given if n is not None), default)
    return None if n == -1 else n


def generation(fly: Fly, body: GenerationBody, *, prompt: Any = None,
               messages: list[dict[str, Any]] | None = None, max_tokens: int | None,
               n_probs: int = 0, chat: Defaults = Defaults()) -> Prepared:
    """The Generation a generation body asks for (one ``prompt`` of any shape ``prompts``
    reads, or chat ``messages``)."""
    settings = body.settings()
    bias = logit_bias(body.logit_bias, lambda text: fly.tokenize(text, add_special=False, parse_special=True))
    if bias is not None:
        settings["logit_bias"] = bias
    stop: tuple[str, ...] = _stops(body.stop)
    reading = reply.Options()
    if messages is not None:
        tokens, tool_settings, reading = _chat_turn(fly, body, messages, chat)
        settings = tools.with_grammar(settings, tool_settings)
        stop = (*fly.chat_format.stop, *stop)
    else:
        tokens = prompts.tokens(fly, prompt if prompt is not None else [])
    tokens, truncated = keep(tokens, fly.n_ctx, body.n_keep)
    shift = shift_of(body, len(tokens), fly.info.add_bos) if chat.context_shift else None
    gen = fly.generate(tokens, max_tokens=max_tokens, stop=stop, n_probs=n_probs, cache_prompt=body.cache_prompt,
                       slot=slot_of(body), shift=shift, **settings)
    return Prepared(gen, truncated, reading)


def chat_prompt(fly: Fly, body: GenerationBody, messages: list[dict[str, Any]],
                chat: Defaults = Defaults()) -> list[int]:
    """The prompt tokens of a chat body: its messages (and tools) through the chat template,
    with the body's template variables (what a generation would decode, and what the
    token-counting endpoints count)."""
    return _chat_turn(fly, body, messages, chat)[0]


def _chat_turn(fly: Fly, body: GenerationBody, messages: list[dict[str, Any]],
               chat: Defaults) -> tuple[list[int], dict[str, Any], reply.Options]:
    return fly.chat_turn(
        messages, tools=getattr(body, "tools", None), tool_choice=getattr(body, "tool_choice", None),
        parallel_tool_calls=getattr(body, "parallel_tool_calls", None),
        reasoning_format=getattr(body, "reasoning_format", None) or chat.reasoning_format,
        **template_vars(body, chat))


def slot_of(body: Any) -> int | None:
    """The slot a body asks for (llama-server's ``id_slot``; -1 or absent: any)."""
    slot = getattr(body, "id_slot", -1)
    return None if slot is None or slot < 0 else slot


def shift_of(body: Any, n_prompt: int, add_bos: bool) -> Shift:
    """The context shift a body asks for, counted as llama-server counts it: ``n_keep`` tokens
    (-1: the whole prompt) and one more for the BOS token a model adds."""
    n_keep = n_prompt if body.n_keep < 0 else body.n_keep
    return Shift(n_keep + int(add_bos), body.n_discard)


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
