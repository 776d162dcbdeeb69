"""OpenAI's endpoints: /v1/completions, /v1/chat/completions (``stream: true`` as SSE ending
with ``data: [DONE]``) and /v1/models. The shapes are ``fly_cpp.api.oai``'s, the same ``Fly``
returns; streams always carry ``usage`` (and fly-cpp's counters, ``fly``) in their last chunk,
and, as llama-server does, responses and last chunks carry ``timings``."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from fly_cpp.api import oai
from fly_cpp.api.fly import Fly
from fly_cpp.basics.errors import FlyError
from fly_cpp.engine.generation import Generation
from fly_cpp.server import errors, sse
from fly_cpp.server.compat import Compat
from fly_cpp.server.completion import outcome
from fly_cpp.server.fields import ChatCompletionRequest, GenerationBody, TextCompletionRequest
from fly_cpp.server.prepare import Defaults, Prepared, chat_prompt, generation, limit, prepare, slot_of
from fly_cpp.server.runs import Runs
from fly_cpp.server.served import Served
from fly_cpp.server.timings import timings

Chunk = dict[str, Any]


def router(served: Served, runs: Runs, compat: Compat, aliases: list[str] | None = None,
           tags: list[str] | None = None, n_predict: int = -1, defaults: Defaults = Defaults(),
           verbose: bool = False) -> APIRouter:
    """``verbose``: whole answers carry ``__verbose`` (/completion's answer) unless a request's
    ``verbose`` says otherwise."""
    r = APIRouter()

    def verbosely(body: Any, answer: Chunk, fly: Fly, gen: Generation) -> Chunk:
        if not (verbose if body.verbose is None else body.verbose):
            return answer
        return {**answer, "__verbose": {**outcome(fly, gen), "fly_pacing": gen.stats.pacing}}
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
        logprobs = body.logprobs
        max_tokens = limit(body.n_predict, body.max_tokens, default=n_predict)
        gens = []
        for choice in _choices(body):
            prepared = await prepare(lambda: generation(fly, choice, prompt=body.prompt, max_tokens=max_tokens,
                                                        n_probs=0 if logprobs is None else max(logprobs, 1),
                                                        chat=defaults))
            gens.append(prepared.gen)
        gen, piece = gens[0], fly.engine.piece
        top = oai.head("text_completion", fly.model)
        progress = body.return_progress
        return await answer(runs, request, gen, body.stream,
                            lambda: oai.completion_chunks(gen, top, logprobs, piece, progress),
                            lambda: verbosely(body, _whole([oai.completion(g, top, logprobs, piece) for g in gens], gen),
                                              fly, gen),
                            lambda items: _events(items, gen, body.timings_per_token, _usage_apart(body)),
                            more=gens[1:], pinned=slot_of(body) is not None)

    @r.post("/v1/chat/completions")
    @r.post("/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:  # type: ignore[valid-type]
        gens, readings = [], []
        for choice in _choices(body):
            fly, made = await chat_generation(served, compat, choice, "/v1/chat/completions", n_predict, defaults)
            gens.append(made.gen)
            readings.append(made.reading)
        gen, shown, piece, reading = gens[0], shown_logprobs(body), fly.engine.piece, readings[0]
        top = oai.head("chat.completion", fly.model)
        progress = body.return_progress
        return await answer(runs, request, gen, body.stream,
                            lambda: oai.chat_chunks(gen, top, shown, piece, reading, progress),
                            lambda: verbosely(body, _whole([oai.chat_completion(g, top, shown, piece, r)
                                                            for g, r in zip(gens, readings)], gen), fly, gen),
                            lambda items: _events(items, gen, body.timings_per_token, _usage_apart(body)),
                            more=gens[1:], pinned=slot_of(body) is not None)

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


async def chat_generation(served: Served, compat: Compat, body: Any, where: str, n_predict: int,
                          defaults: Defaults = Defaults()) -> tuple[Fly, Prepared]:
    """The generation a chat body asks for (OpenAI's chat, and the surfaces converted to it:
    Anthropic's messages, OpenAI's Responses), checked and prepared off the event loop."""
    compat.check(body, where)
    if body.continue_final_message and body.add_generation_prompt:
        raise FlyError("continue_final_message and add_generation_prompt cannot both be true: the answer either "
                       "continues the last message or opens a new one")
    fly = served.ready
    shown = shown_logprobs(body)
    max_tokens = limit(body.n_predict, body.max_completion_tokens, body.max_tokens, default=n_predict)
    prepared = await prepare(lambda: generation(fly, body, messages=body.messages, max_tokens=max_tokens,
                                                n_probs=0 if shown is None else max(shown, 1), chat=defaults))
    return fly, prepared


async def prompt_tokens(served: Served, compat: Compat, body: Any, where: str,
                        defaults: Defaults = Defaults()) -> int:
    """How many tokens a chat body's prompt is (the token-counting endpoints of Anthropic's and
    OpenAI's Responses API), checked and rendered off the event loop as a generation's is."""
    compat.check(body, where)
    fly = served.ready
    return len(await prepare(lambda: chat_prompt(fly, body, body.messages, defaults)))


def _choices(body: GenerationBody) -> list[Any]:
    """One body per choice (``n``): the others seeded one after another from the request's seed
    (a random seed draws one per choice). Several choices are answered whole."""
    if body.n > 1 and body.stream:
        raise FlyError("n > 1 is answered whole: stream one choice per request")
    seed = body.seed
    return [body if i == 0 or seed is None or seed == -1 else body.model_copy(update={"seed": seed + i})
            for i in range(body.n)]


def _whole(choices: list[Chunk], gen: Generation) -> Chunk:
    """The whole answer of ``n`` choices (``usage`` counts the prompt once and the tokens of
    every choice; ``fly`` and ``timings`` are the first choice's)."""
    out = {**choices[0], "timings": timings(gen.stats)}
    if len(choices) > 1:
        out["choices"] = [{**c["choices"][0], "index": i} for i, c in enumerate(choices)]
        done = sum(c["usage"]["completion_tokens"] for c in choices)
        prompt = out["usage"]["prompt_tokens"]
        out["usage"] = {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}
    return _cached(out, gen)


def _cached(chunk: Chunk, gen: Generation) -> Chunk:
    """``usage`` with llama-server's ``prompt_tokens_details.cached_tokens`` (prompt tokens the
    cache already held)."""
    return {**chunk, "usage": {**chunk["usage"], "prompt_tokens_details": {"cached_tokens": gen.stats.n_cached}}}


async def answer(runs: Runs, request: Request, gen: Generation, stream: bool, chunks: Callable[[], Iterator[Chunk]],
                 whole: Callable[[], Chunk], events: Callable[[AsyncIterator[Chunk]], AsyncIterator[bytes]],
                 after_error: bytes = sse.DONE, more: Sequence[Generation] = (),
                 error_event: Callable[[Chunk], bytes] = sse.event, pinned: bool = False) -> Response:
    """Run ``gen`` on the worker: streamed as ``chunks()`` turned into SSE bytes by ``events``,
    or collected (with the ``more`` generations of the other choices, one after another) and
    answered ``whole()`` (an error inside a stream: ``error_event`` of its body, then
    ``after_error``). Every
    surface that answers a chat or text generation (OpenAI's, Anthropic's, Responses) goes
    through here."""
    gens = [gen, *more]

    def job() -> Iterator[Any]:
        try:
            if stream:
                yield from chunks()
            else:
                for g in gens:
                    yield from g
        finally:
            for g in gens:
                g.close()
                runs.metrics.record(g.stats)
        if not stream:
            yield whole()

    def interrupt() -> None:
        for g in gens:
            g.interrupt()

    try:
        items = runs.start(job, interrupt, pinned=pinned)
    except BaseException:
        for g in gens:
            g.close()
        raise
    if stream:
        return sse.response(runs.events(events(items), after_error=after_error, error_event=error_event))
    got = await runs.collect(request, items)
    if got is None:
        return Response(status_code=499)
    return JSONResponse(got[-1])


async def _events(items: AsyncIterator[Chunk], gen: Generation, every: bool,
                  usage_apart: bool = False) -> AsyncIterator[bytes]:
    """OpenAI's SSE stream: ``timings`` on the last chunk (on every one but the role chunk with
    ``timings_per_token``); ``usage_apart`` (``stream_options.include_usage``): the last chunk's
    ``usage`` (and ``fly``, ``timings``) come in one more chunk with no choices, as OpenAI sends
    them."""
    async for chunk in items:
        role = bool(chunk.get("choices")) and "role" in chunk["choices"][0].get("delta", {})
        if (every and not role) or "usage" in chunk:
            chunk = {**chunk, "timings": timings(gen.stats)}
        if "usage" in chunk:
            chunk = _cached(chunk, gen)
        if usage_apart and "usage" in chunk:
            extra = {k: chunk.pop(k) for k in ("usage", "fly", "timings")}
            yield sse.event(chunk)
            chunk = {k: v for k, v in chunk.items() if k not in ("choices", "fly_token")} | {"choices": [], **extra}
        yield sse.event(chunk)
    yield sse.DONE


def _usage_apart(body: Any) -> bool:
    return bool((body.stream_options or {}).get("include_usage"))
