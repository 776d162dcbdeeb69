"""OpenAI's endpoints: /v1/completions, /v1/chat/completions (``stream: true`` as SSE ending
with ``data: [DONE]``) and /v1/models. The shapes are ``Fly``'s own; streams always carry
``usage`` (and fly-cpp's counters, ``fly``) in their last chunk."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from fly_cpp.api import Fly
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
        engine = fly.engine
        return {"object": "list", "data": [{
            "id": fly.model, "object": "model", "created": created, "owned_by": "fly-cpp",
            "meta": {"n_ctx": fly.n_ctx, "n_vocab": engine.target_model.n_vocab,
                     "draft": engine.draft_model.name if engine.draft_model is not None else None}}]}

    @r.post("/v1/completions")
    async def completions(body: TextCompletionRequest, request: Request) -> Response:  # type: ignore[valid-type]
        chunks = fly.create_completion(body.prompt, body.max_tokens, stop=body.stop, stream=True, **body.settings())
        return await _answer(runs, request, chunks, body.stream, _join_completion)

    @r.post("/v1/chat/completions")
    @r.post("/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:  # type: ignore[valid-type]
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        chunks = fly.create_chat_completion(body.messages, max_tokens, stop=body.stop, stream=True,
                                            **body.settings())
        return await _answer(runs, request, chunks, body.stream, _join_chat)

    return r


async def _answer(runs: Runs, request: Request, chunks: Iterator[Chunk], stream: bool, join: Any) -> Response:
    def job() -> Iterator[Chunk]:
        try:
            for chunk in chunks:
                if "fly" in chunk:
                    runs.metrics.record_dict(chunk["fly"])
                yield chunk
        finally:
            chunks.close()  # type: ignore[attr-defined]

    items = runs.start(job)
    if stream:
        return sse.response(runs.events(_events(items)))
    got = await runs.collect(request, items)
    if got is None:
        return Response(status_code=499)
    return JSONResponse(join(got))


async def _events(items: AsyncIterator[Chunk]) -> AsyncIterator[bytes]:
    async for chunk in items:
        yield sse.event(chunk)
    yield sse.DONE


def _join_completion(chunks: list[Chunk]) -> Chunk:
    last = chunks[-1]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    return {**last, "choices": [{**last["choices"][0], "text": text}]}


def _join_chat(chunks: list[Chunk]) -> Chunk:
    last = chunks[-1]
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    choice = {"index": 0, "message": {"role": "assistant", "content": content}, "logprobs": None,
              "finish_reason": last["choices"][0]["finish_reason"]}
    return {**last, "object": "chat.completion", "choices": [choice]}
