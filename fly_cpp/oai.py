"""OpenAI's response shapes, made from a generation: the one place they are built.

``Fly.create_completion`` / ``create_chat_completion`` return them, and the server sends them.
Whole responses are made from a finished generation; chunk streams consume a generation as it
runs. Every finished shape carries ``usage`` and fly-cpp's counters under ``fly``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from fly_cpp.generation import Generation
from fly_cpp.step import Step

Chunk = dict[str, Any]


def head(kind: str, model: str) -> dict[str, Any]:
    """``id``, ``object``, ``created`` and ``model`` of one response. kind: "text_completion"
    or "chat.completion" (its chunks say "chat.completion.chunk")."""
    prefix = "chatcmpl" if kind.startswith("chat") else "cmpl"
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()), "model": model}


def tail(gen: Generation) -> dict[str, Any]:
    """``usage`` and ``fly`` (the generation's counters) for a finished generation."""
    n_prompt, n_out = len(gen.request.prompt), len(gen.tokens)
    return {"usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out},
            "fly": {**gen.stats.as_dict(), "context_full": gen.context_full}}


def completion(gen: Generation, top: dict[str, Any]) -> Chunk:
    """A finished generation as a ``text_completion``."""
    return {**top, "choices": [_text_choice(gen.text, gen.finish_reason)], **tail(gen)}


def completion_chunks(gen: Generation, top: dict[str, Any]) -> Iterator[Chunk]:
    """``text_completion`` chunks as the generation runs; the last carries ``finish_reason``,
    ``usage`` and ``fly``. Closing the stream closes the generation."""
    try:
        for step in gen:
            if step.text:
                yield {**top, "choices": [_text_choice(step.text, None)]}
        yield {**top, "choices": [_text_choice("", gen.finish_reason)], **tail(gen)}
    finally:
        gen.close()


def chat_completion(gen: Generation, top: dict[str, Any]) -> Chunk:
    """A finished chat generation as a ``chat.completion`` (the answer's leading whitespace
    dropped, as ``answer_text`` drops it when streaming)."""
    message = {"role": "assistant", "content": gen.text.lstrip()}
    return {**top, "choices": [{"index": 0, "message": message, "logprobs": None,
                                "finish_reason": gen.finish_reason}], **tail(gen)}


def chat_chunks(gen: Generation, top: dict[str, Any]) -> Iterator[Chunk]:
    """``chat.completion.chunk`` dicts as the generation runs: the role first, then content
    deltas, then one with ``finish_reason``, ``usage`` and ``fly``. Closing the stream closes
    the generation."""
    top = {**top, "object": "chat.completion.chunk"}
    try:
        yield {**top, "choices": [_delta({"role": "assistant", "content": ""}, None)]}
        for text in answer_text(gen):
            yield {**top, "choices": [_delta({"content": text}, None)]}
        yield {**top, "choices": [_delta({}, gen.finish_reason)], **tail(gen)}
    finally:
        gen.close()


def answer_text(steps: Iterable[Step]) -> Iterator[str]:
    """The non-empty text pieces of a chat answer, without the whitespace it starts with (the
    plain format's "Assistant:" makes base models begin with a space)."""
    started = False
    for step in steps:
        text = step.text if started else step.text.lstrip()
        if text:
            started = True
            yield text


def _text_choice(text: str, finish: str | None) -> dict[str, Any]:
    return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}


def _delta(delta: dict[str, str], finish: str | None) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
