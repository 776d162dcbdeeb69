"""OpenAI's endpoints: /v1/completions, /v1/chat/completions (``stream: true`` as SSE ending
with ``data: [DONE]``) and /v1/models. The shapes are ``fly_cpp.oai``'s, the same ``Fly``
returns; streams always carry ``usage`` (and fly-cpp's counters, ``fly``) in their last chunk,
and, as llama-server does, responses and last chunks carry ``timings``."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from fly_cpp import oai
from fly_cpp.api import Fly
from fly_cpp.errors import FlyError
from fly_cpp.generation import Generation
from fly_cpp.server import errors, sse
from fly_cpp.server.compat import Compat
from fly_cpp.server.fields import ChatCompletionRequest, TextCompletionRequest
from fly_cpp.server.prepare import generation, limit, prepare
from fly_cpp.server.runs import Runs
from fly_cpp.server.served import Served
from fly_cpp.server.timings import timings

Chunk = dict[str, Any]


def router(served: Served, runs: Runs, compat: Compat, aliases: list[str] | None = None,
           tags: list[str] | None = None, n_predict: int = -1) -> APIRouter:
    r = APIRouter()
    created = int(time.time())

    def listed(fly: Fly) -> dict[str, Any]:
        return {"object": "list", "data": [{
            "id": fly.model, "object": "model", "created": created, "owned_by": "fly-cpp",
            "aliases": list(aliases or [fly.model]), "tags": list(tags or ()),
            "meta": {"n_ctx": fly.n_ctx, "n_vocab": fly.info.n_vocab, "draft": fly.info.draft_name}}]}

    served.snapshots["models"] = listed

    @r.get("/v1/models")
    @r.get("/models")
    async def models() -> dict[str, Any]:
        return served.snapshot["models"] if served.sleeping else listed(served.ready)

    @r.post("/v1/completions")
    async def completions(body: TextCompletionRequest, request: Request) -> Response:  # type: ignore[valid-type]
        compat.check(body, "/v1/completions")
        fly = served.ready
        shown = body.logprobs
        max_tokens = limit(body.n_predict, body.max_tokens, default=n_predict)
        prepared = await prepare(lambda: generation(fly, body, prompt=body.prompt, max_tokens=max_tokens,
                                                    n_probs=0 if shown is None else max(shown, 1)))
        gen, piece = prepared.gen, fly.engine.piece
        top = oai.head("text_completion", fly.model)
        return await answer(runs, request, gen, body.stream, lambda: oai.completion_chunks(gen, top, shown, piece),
                            lambda: {**oai.completion(gen, top, shown, piece), "timings": timings(gen.stats)},
                            lambda items: _events(items, gen, body.timings_per_token))

    @r.post("/v1/chat/completions")
    @r.post("/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:  # type: ignore[valid-type]
        fly, gen = await chat_generation(served, compat, body, "/v1/chat/completions", n_predict)
        shown, piece = shown_logprobs(body), fly.engine.piece
        top = oai.head("chat.completion", fly.model)
        return await answer(runs, request, gen, body.stream, lambda: oai.chat_chunks(gen, top, shown, piece),
                            lambda: {**oai.chat_completion(gen, top, shown, piece), "timings": timings(gen.stats)},
                            lambda items: _events(items, gen, body.timings_per_token))

    return r


def chat_body(converted: dict[str, Any]) -> Any:
    """Another API's body, converted to a chat body, validated as one (a bad field: FlyError)."""
    try:
        return ChatCompletionRequest.model_validate(converted)
    except ValidationError as e:
        raise FlyError(errors.describe(list(e.errors()))) from None


def shown_logprobs(body: Any) -> int | None:
    """How many top log-probabilities a chat body shows per token (None: no logprobs)."""
    if body.top_logprobs is not None and not body.logprobs:
        raise FlyError("top_logprobs needs logprobs: true")
    return (body.top_logprobs or 0) if body.logprobs else None


async def chat_generation(served: Served, compat: Compat, body: Any, where: str, n_predict: int) -> tuple[Fly, Generation]:
    """The generation a chat body asks for (OpenAI's chat, and the surfaces converted to it:
    Anthropic's messages, OpenAI's Responses), checked and prepared off the event loop."""
    compat.check(body, where)
    fly = served.ready
    shown = shown_logprobs(body)
    max_tokens = limit(body.n_predict, body.max_completion_tokens, body.max_tokens, default=n_predict)
    prepared = await prepare(lambda: generation(fly, body, messages=body.messages, max_tokens=max_tokens,
                                                n_probs=0 if shown is None else max(shown, 1)))
    return fly, prepared.gen


async def answer(runs: Runs, request: Request, gen: Generation, stream: bool, chunks: Callable[[], Iterator[Chunk]],
                 whole: Callable[[], Chunk], events: Callable[[AsyncIterator[Chunk]], AsyncIterator[bytes]],
                 after_error: bytes = sse.DONE) -> Response:
    """Run ``gen`` on the worker: streamed as ``chunks()`` turned into SSE bytes by ``events``,
    or collected and answered ``whole()`` (``after_error``: what ends a stream after an error
    event). Every surface that answers a chat or text
    generation (OpenAI's, Anthropic's, Responses) goes through here."""

    def job() -> Iterator[Any]:
        try:
            yield from chunks() if stream else gen
        finally:
            gen.close()
            runs.metrics.record(gen.stats)
        if not stream:
            yield whole()

    try:
        items = runs.start(job, gen.interrupt)
    except BaseException:
        gen.close()
        raise
    if stream:
        return sse.response(runs.events(events(items), after_error=after_error))
    got = await runs.collect(request, items)
    if got is None:
        return Response(status_code=499)
    return JSONResponse(got[-1])


async def _events(items: AsyncIterator[Chunk], gen: Generation, every: bool) -> AsyncIterator[bytes]:
    async for chunk in items:
        if every or "usage" in chunk:  # the last chunk, or every one with timings_per_token
            chunk = {**chunk, "timings": timings(gen.stats)}
        yield sse.event(chunk)
    yield sse.DONE
