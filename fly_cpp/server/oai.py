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

from fly_cpp import oai
from fly_cpp.errors import FlyError
from fly_cpp.generation import Generation
from fly_cpp.server import sse
from fly_cpp.server.compat import Compat
from fly_cpp.server.fields import ChatCompletionRequest, TextCompletionRequest
from fly_cpp.server.prepare import ChatDefaults, generation, limit, prepare, slot_of
from fly_cpp.server.runs import Runs
from fly_cpp.server.served import Served
from fly_cpp.server.timings import timings

Chunk = dict[str, Any]


def router(served: Served, runs: Runs, compat: Compat, aliases: list[str] | None = None,
           tags: list[str] | None = None, n_predict: int = -1, defaults: ChatDefaults = ChatDefaults()) -> APIRouter:
    r = APIRouter()
    created = int(time.time())

    @r.get("/v1/models")
    @r.get("/models")
    async def models() -> dict[str, Any]:
        fly = served.ready
        return {"object": "list", "data": [{
            "id": fly.model, "object": "model", "created": created, "owned_by": "fly-cpp",
            "aliases": list(aliases or [fly.model]), "tags": list(tags or ()),
            "meta": {"n_ctx": fly.n_ctx, "n_vocab": fly.info.n_vocab, "draft": fly.info.draft_name}}]}

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
        return await _answer(runs, request, gen, body, lambda: oai.completion_chunks(gen, top, shown, piece),
                             lambda: oai.completion(gen, top, shown, piece))

    @r.post("/v1/chat/completions")
    @r.post("/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:  # type: ignore[valid-type]
        compat.check(body, "/v1/chat/completions")
        fly = served.ready
        if body.top_logprobs is not None and not body.logprobs:
            raise FlyError("top_logprobs needs logprobs: true")
        shown = (body.top_logprobs or 0) if body.logprobs else None
        max_tokens = limit(body.n_predict, body.max_completion_tokens, body.max_tokens, default=n_predict)
        prepared = await prepare(lambda: generation(fly, body, messages=body.messages, max_tokens=max_tokens,
                                                    n_probs=0 if shown is None else max(shown, 1), chat=defaults))
        gen, piece, reading = prepared.gen, fly.engine.piece, prepared.reading
        top = oai.head("chat.completion", fly.model)
        return await _answer(runs, request, gen, body, lambda: oai.chat_chunks(gen, top, shown, piece, reading),
                             lambda: oai.chat_completion(gen, top, shown, piece, reading))

    return r


async def _answer(runs: Runs, request: Request, gen: Generation, body: Any, chunks: Callable[[], Iterator[Chunk]],
                  whole: Callable[[], Chunk]) -> Response:
    """Run ``gen`` on the worker: streamed as ``chunks()``, or collected and answered ``whole()``."""
    stream = body.stream

    def job() -> Iterator[Any]:
        try:
            yield from chunks() if stream else gen
        finally:
            gen.close()
            runs.metrics.record(gen.stats)
        if not stream:
            yield {**whole(), "timings": timings(gen.stats)}

    try:
        items = runs.start(job, gen.interrupt, pinned=slot_of(body) is not None)
    except BaseException:
        gen.close()
        raise
    if stream:
        return sse.response(runs.events(_events(items, gen, body.timings_per_token), after_error=sse.DONE))
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
