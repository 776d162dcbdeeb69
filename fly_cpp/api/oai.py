"""OpenAI's response shapes, made from a generation: the one place they are built.

``Fly.create_completion`` / ``create_chat_completion`` return them, and the server sends them.
Whole responses are made from a finished generation; chunk streams consume a generation as it
runs. Every finished shape carries ``usage`` and fly-cpp's counters under ``fly``.

Two additions OpenAI clients ignore: every chunk with text carries ``fly_token`` (``drafted``,
``loose``: how the step that released the text was accepted, as ``chat --show-accepts``
colours it), and ``logprobs`` come from the target's own pass (``Step.probs``): asked for with
``logprobs=N`` here (``n_probs`` on the generation).
"""

from __future__ import annotations

import importlib.metadata
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from fly_cpp.api import reply
from fly_cpp.engine.generation import Generation
from fly_cpp.rounds.step import Progress, Step, TokenProbs

Chunk = dict[str, Any]
Piece = Callable[[int], bytes]


try:
    FINGERPRINT = f"b{importlib.metadata.version('fly-cpp')}-fly-cpp"
except importlib.metadata.PackageNotFoundError:  # a source tree that is not installed
    FINGERPRINT = "b0-fly-cpp"


def head(kind: str, model: str) -> dict[str, Any]:
    """``id``, ``object``, ``created``, ``model`` and ``system_fingerprint`` (the build that
    answered, "b" and fly-cpp's version, as llama-server spells its build) of one response.
    kind: "text_completion" or "chat.completion" (its chunks say "chat.completion.chunk")."""
    prefix = "chatcmpl" if kind.startswith("chat") else "cmpl"
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()), "model": model,
            "system_fingerprint": FINGERPRINT}


def tail(gen: Generation) -> dict[str, Any]:
    """``usage`` and ``fly`` (the generation's counters) for a finished generation."""
    n_prompt, n_out = len(gen.request.prompt), len(gen.tokens)
    finish = gen.finish
    return {"usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out},
            "fly": {**gen.stats.as_dict(pacing=False), "context_full": gen.context_full,
                    "interrupted": finish is not None and finish.interrupted}}


def step_flags(step: Step) -> dict[str, bool]:
    """How a step's token was accepted: target's own (both false), drafted exact, or loose."""
    return {"drafted": step.drafted, "loose": step.loose}


# -- logprobs -------------------------------------------------------------------------------

def _entry(piece: Piece, token: int, logprob: float) -> dict[str, Any]:
    raw = piece(token)
    return {"token": raw.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(raw)}


def chat_logprobs(tokens: Sequence[int], probs: Sequence[TokenProbs | None], n: int, piece: Piece) -> dict[str, Any]:
    """The chat shape: ``{"content": [{token, logprob, bytes, top_logprobs: [n of those]}]}``."""
    content = []
    for token, p in zip(tokens, probs):
        if p is not None:
            content.append({**_entry(piece, token, p.logprob),
                            "top_logprobs": [_entry(piece, t, lp) for t, lp in p.top[:n]]})
    return {"content": content}


def text_logprobs(tokens: Sequence[int], probs: Sequence[TokenProbs | None], n: int, piece: Piece,
                  offset: int = 0) -> dict[str, Any]:
    """The legacy completions shape: parallel lists ``tokens``, ``token_logprobs``,
    ``top_logprobs`` (one {text: logprob} per token) and ``text_offset``."""
    out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token, p in zip(tokens, probs):
        if p is None:
            continue
        text = piece(token).decode("utf-8", "replace")
        out["tokens"].append(text)
        out["token_logprobs"].append(p.logprob)
        out["top_logprobs"].append({piece(t).decode("utf-8", "replace"): lp for t, lp in p.top[:n]})
        out["text_offset"].append(offset)
        offset += len(text)
    return out


# -- text completions -----------------------------------------------------------------------

def completion(gen: Generation, top: dict[str, Any], logprobs: int | None = None, piece: Piece | None = None) -> Chunk:
    """A finished generation as a ``text_completion`` (``logprobs``: top-n per token, from a
    generation made with ``n_probs``; needs ``piece``, the engine's token -> bytes)."""
    lp = text_logprobs(gen.tokens, gen.probs, logprobs, piece) if logprobs is not None and piece else None
    return {**top, "choices": [_text_choice(gen.text, gen.finish_reason, lp)], **tail(gen)}


def completion_chunks(gen: Generation, top: dict[str, Any], logprobs: int | None = None,
                      piece: Piece | None = None, progress: bool = False) -> Iterator[Chunk]:
    """``text_completion`` chunks as the generation runs; the last carries ``finish_reason``,
    ``usage`` and ``fly``. ``progress``: first an empty chunk per batch of the prompt with its
    ``prompt_progress`` (llama-server's ``return_progress``). Closing the stream closes the
    generation."""
    pending: list[Step] = []
    offset = 0
    try:
        for step in gen.events() if progress else gen:
            if isinstance(step, Progress):
                yield {**top, "choices": [_text_choice("", None, None)], "prompt_progress": step.as_dict()}
                continue
            pending.append(step)
            if step.text:
                lp = _text_lp(pending, logprobs, piece, offset)
                offset += sum(len(t) for t in lp["tokens"]) if lp else 0
                yield {**top, "choices": [_text_choice(step.text, None, lp)], "fly_token": step_flags(step)}
                pending = []
        yield {**top, "choices": [_text_choice("", gen.finish_reason, _text_lp(pending, logprobs, piece, offset))],
               **tail(gen)}
    finally:
        gen.close()


def _text_lp(steps: list[Step], n: int | None, piece: Piece | None, offset: int) -> dict[str, Any] | None:
    if n is None or piece is None:
        return None
    return text_logprobs([s.token for s in steps], [s.probs for s in steps], n, piece, offset)


# -- chat -----------------------------------------------------------------------------------

def chat_completion(gen: Generation, top: dict[str, Any], logprobs: int | None = None,
                    piece: Piece | None = None, opts: reply.Options = reply.Options()) -> Chunk:
    """A finished chat generation as a ``chat.completion``: its text split by ``opts``
    (``fly_cpp.api.reply``: reasoning_content, content, tool_calls; the answer's leading whitespace
    dropped, as the stream drops it); ``logprobs``: top-n per token."""
    got = reply.split(gen.text, opts)
    lp = chat_logprobs(gen.tokens, gen.probs, logprobs, piece) if logprobs is not None and piece else None
    return {**top, "choices": [{"index": 0, "message": got.message(), "logprobs": lp,
                                "finish_reason": _finish(gen, got)}], **tail(gen)}


def _finish(gen: Generation, got: reply.Reply) -> str | None:
    """OpenAI's ``tool_calls`` when an answer that ended by itself made calls."""
    return "tool_calls" if got.calls and gen.finish_reason == "stop" else gen.finish_reason


def chat_chunks(gen: Generation, top: dict[str, Any], logprobs: int | None = None,
                piece: Piece | None = None, opts: reply.Options = reply.Options(),
                progress: bool = False) -> Iterator[Chunk]:
    """``chat.completion.chunk`` dicts as the generation runs: the role first (its content null,
    as OpenAI and llama-server send it), then ``reasoning_content`` and ``content`` deltas (text
    that can still turn out to be a tag is held back), then each tool call whole in one
    ``delta.tool_calls`` chunk, then one with ``finish_reason``, ``usage`` and ``fly``.
    ``progress``: the role comes with each batch of the prompt instead, with its
    ``prompt_progress`` (llama-server's ``return_progress``). Closing the stream closes the
    generation."""
    top = {**top, "object": "chat.completion.chunk"}
    pending: list[Step] = []
    splitter = reply.Splitter(opts)
    role = {**top, "choices": [_delta({"role": "assistant", "content": None}, None)]}
    try:
        if not progress:
            yield role
        for step in gen.events() if progress else gen:
            if isinstance(step, Progress):
                yield {**role, "prompt_progress": step.as_dict()}
                continue
            pending.append(step)
            if (delta := splitter.feed(step.text)):
                yield {**top, "choices": [_delta(delta, None, _chat_lp(pending, logprobs, piece))],
                       "fly_token": step_flags(step)}
                pending = []
        delta, got = splitter.finish()
        if delta:
            yield {**top, "choices": [_delta(delta, None)]}
        if got.calls:
            yield {**top, "choices": [_delta({"tool_calls": reply.call_deltas(got.calls)}, None)]}
        yield {**top, "choices": [_delta({}, _finish(gen, got), _chat_lp(pending, logprobs, piece))], **tail(gen)}
    finally:
        gen.close()


def _chat_lp(steps: list[Step], n: int | None, piece: Piece | None) -> dict[str, Any] | None:
    if n is None or piece is None:
        return None
    return chat_logprobs([s.token for s in steps], [s.probs for s in steps], n, piece)


def answer_steps(steps: Iterable[Step]) -> Iterator[tuple[Step, str]]:
    """Every step of a chat answer with the text it shows: its own, except that the whitespace
    the answer starts with is dropped (the plain format's "Assistant:" makes base models begin
    with a space)."""
    started = False
    for step in steps:
        text = step.text if started else step.text.lstrip()
        started = started or bool(text)
        yield step, text


def answer_text(steps: Iterable[Step]) -> Iterator[str]:
    """The non-empty text pieces of a chat answer, without the whitespace it starts with."""
    for _, text in answer_steps(steps):
        if text:
            yield text


def _text_choice(text: str, finish: str | None, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}


def _delta(delta: dict[str, Any], finish: str | None, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
