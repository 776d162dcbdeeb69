"""OpenAI's endpoints: /v1/completions, /v1/chat/completions (``stream: true`` as SSE ending
with ``data: [DONE]``) and /v1/models. The shapes are ``fly_cpp.oai``'s, the same ``Fly``
returns; streams always carry ``usage`` (and fly-cpp's counters, ``fly``) in their last chunk."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from fly_cpp import oai
from fly_cpp.api import Fly
from fly_cpp.generation import Generation
from fly_cpp.server import sse
from fly_cpp.server.fields import ChatCompletionRequest, TextCompletionRequest
from fly_cpp.server.runs import Runs

Chunk = dict[str, Any]


def router(fly: Fly, runs: Runs) -> APIRouter:
    r = APIRouter()
    created = int(time.time())

    @r.get("/v1/models")
    @r.get("/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{
            "id": fly.model, "object": "model", "created": created, "owned_by": "fly-cpp",
            "meta": {"n_ctx": fly.n_ctx, "n_vocab": fly.info.n_vocab, "draft": fly.info.draft_name}}]}

    @r.post("/v1/completions")
    async def completions(body: TextCompletionRequest, request: Request) -> Response:  # type: ignore[valid-type]
        gen = fly.generate(body.prompt, max_tokens=body.max_tokens, stop=body.stop, **body.settings())
        top = oai.head("text_completion", fly.model)
        return await _answer(runs, request, gen, body.stream, lambda: oai.completion_chunks(gen, top),
                             lambda: oai.completion(gen, top))

    @r.post("/v1/chat/completions")
    @r.post("/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:  # type: ignore[valid-type]
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        gen = fly.generate_chat(body.messages, max_tokens=max_tokens, stop=body.stop, **body.settings())
        top = oai.head("chat.completion", fly.model)
        return await _answer(runs, request, gen, body.stream, lambda: oai.chat_chunks(gen, top),
                             lambda: oai.chat_completion(gen, top))

    return r


async def _answer(runs: Runs, request: Request, gen: Generation, stream: bool, chunks: Callable[[], Iterator[Chunk]],
                  whole: Callable[[], Chunk]) -> Response:
    """Run ``gen`` on the worker: streamed as ``chunks()``, or collected and answered ``whole()``."""

    def job() -> Iterator[Any]:
        try:
            yield from chunks() if stream else gen
        finally:
            gen.close()
            runs.metrics.record(gen.stats)
        if not stream:
            yield whole()

    items = runs.start(job)
    if stream:
        return sse.response(runs.events(_events(items)))
    got = await runs.collect(request, items)
    if got is None:
        return Response(status_code=499)
    return JSONResponse(got[-1])


async def _events(items: AsyncIterator[Chunk]) -> AsyncIterator[bytes]:
    async for chunk in items:
        yield sse.event(chunk)
    yield sse.DONE
