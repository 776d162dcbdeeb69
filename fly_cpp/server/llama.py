"""llama-server's endpoints: /completion, /tokenize, /detokenize, /props, /health, /metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

import fly_cpp
from fly_cpp.api import Fly
from fly_cpp.engine import Generation
from fly_cpp.errors import FlyError
from fly_cpp import rpc
from fly_cpp.server import errors, sse
from fly_cpp.server.fields import (SETTING_NAMES, CompletionRequest, DetokenizeRequest, TokenizeRequest,
                                   settings_dict)
from fly_cpp.server.probs import top_logprobs
from fly_cpp.server.runs import Runs
from fly_cpp.step import Step

SERVING = ("one generation at a time per model pair, in arrival order: other requests wait in a queue "
           "(a request whose client disconnects is dropped, and a stream it leaves is aborted)")
N_PROBS = ("top-n target log-probabilities per generated token, from one teacher-forced target pass after "
           "the generation (the target's raw distribution, as with post_sampling_probs off); when "
           "streaming they come in the final event")


def router(fly: Fly, runs: Runs) -> APIRouter:
    r = APIRouter()
    engine = fly.engine

    @r.get("/health")
    @r.get("/v1/health")
    async def health() -> Any:
        if (loss := rpc.lost()) is not None:  # no generation can succeed: tell load balancers
            return JSONResponse(errors.body(503, f"an rpc-server stopped answering ({loss}): restart it, then "
                                                 "this server"), status_code=503)
        return {"status": "ok"}

    @r.get("/props")
    async def props() -> dict[str, Any]:
        draft = engine.draft_settings
        return {
            "model": fly.model, "model_path": engine.target_settings.path,
            "draft_model": engine.draft_model.name if engine.draft_model is not None else None,
            "draft_model_path": draft.path if draft is not None else None,
            "n_ctx": fly.n_ctx, "n_vocab": engine.target_model.n_vocab,
            "chat_format": fly.chat_format.name, "chat_template": fly.chat_format.template,
            "default_generation_settings": {**settings_dict(fly.spec, fly.sampling), "n_ctx": fly.n_ctx},
            "per_request_settings": list(SETTING_NAMES), "total_slots": 1, "serving": SERVING, "n_probs": N_PROBS,
            "build_info": f"fly-cpp {fly_cpp.__version__}",
        }

    @r.get("/metrics")
    async def metrics() -> PlainTextResponse:
        worker = runs.worker
        text = runs.metrics.render({
            "requests_processing": ("generations running (0 or 1)", worker.running),
            "requests_deferred": ("generations waiting for the engine", worker.waiting)})
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @r.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        tokens = fly.tokenize(body.content, add_special=body.add_special, parse_special=body.parse_special)
        if not body.with_pieces:
            return {"tokens": tokens}
        return {"tokens": [{"id": t, "piece": engine.target_model.piece(t).decode("utf-8", "replace")} for t in tokens]}

    @r.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, str]:
        n_vocab = engine.target_model.n_vocab
        if bad := [t for t in body.tokens if not 0 <= t < n_vocab]:
            raise FlyError(f"token id {bad[0]} is outside the vocabulary (0..{n_vocab - 1})")
        return {"content": fly.detokenize(body.tokens)}

    @r.post("/completion")
    @r.post("/completions")
    async def completion(body: CompletionRequest, request: Request) -> Response:  # type: ignore[valid-type]
        if body.n_predict < -1:
            raise FlyError(f"n_predict must be >= -1 (-1: until end of text or the context is full), got {body.n_predict}")
        gen = fly.generate(body.prompt, max_tokens=None if body.n_predict == -1 else body.n_predict,
                           stop=body.stop, **body.settings())

        def steps() -> Iterator[Step | list[dict[str, Any]]]:
            try:
                yield from gen
            finally:
                gen.close()
                runs.metrics.record(gen.stats)
            yield top_logprobs(engine, gen.prompt, gen.tokens, body.n_probs)

        items = runs.start(steps)
        if body.stream:
            return sse.response(runs.events(_stream(fly, gen, items, body.n_probs)))
        got = await runs.collect(request, items)
        if got is None:
            return Response(status_code=499)
        return JSONResponse(_result(fly, gen, got[-1], body.n_probs))

    return r


async def _stream(fly: Fly, gen: Generation, items: AsyncIterator[Any], n_probs: int) -> AsyncIterator[bytes]:
    async for item in items:
        if isinstance(item, Step):
            if item.text:
                yield sse.event({"index": 0, "content": item.text, "tokens": [item.token], "stop": False,
                                 "id_slot": 0})
        else:
            yield sse.event({**_result(fly, gen, item, n_probs), "content": ""})


def _result(fly: Fly, gen: Generation, probs: list[dict[str, Any]], n_probs: int) -> dict[str, Any]:
    s = gen.stats
    stop_type, word = _stop_type(fly, gen)
    out = {
        "index": 0, "id_slot": 0, "content": gen.text, "stop": True, "model": fly.model,
        "tokens_predicted": len(gen.tokens), "tokens_evaluated": len(gen.prompt), "truncated": False,
        "stop_type": stop_type, "stopping_word": word, "finish_reason": gen.finish_reason,
        "generation_settings": {**settings_dict(gen.spec, gen.sampling), "seed": gen.seed,
                                "n_predict": gen.max_tokens, "stop": list(gen.stop), "n_probs": n_probs},
        "timings": {
            "prompt_n": s.n_prompt, "prompt_ms": s.prompt_seconds * 1e3,
            "prompt_per_token_ms": s.prompt_seconds * 1e3 / s.n_prompt if s.n_prompt else 0.0,
            "prompt_per_second": s.n_prompt / s.prompt_seconds if s.prompt_seconds > 0 else 0.0,
            "predicted_n": s.n_tokens, "predicted_ms": s.seconds * 1e3,
            "predicted_per_token_ms": s.seconds * 1e3 / s.n_tokens if s.n_tokens else 0.0,
            "predicted_per_second": s.tokens_per_second,
            "draft_n": s.n_drafted, "draft_n_accepted": s.n_exact + s.n_loose, "draft_n_loose": s.n_loose,
        },
        "fly": {**s.as_dict(), "context_full": gen.context_full},
    }
    if n_probs:
        out["completion_probabilities"] = probs
    return out


def _stop_type(fly: Fly, gen: Generation) -> tuple[str, str]:
    """llama-server's stop_type ("eos", "word", "limit") and the stop string that ended the text.

    A generation says only "stop" for both an end-of-text token and a stop string. A stop string
    is recognised afterwards: the tokens after it were generated but not emitted (more tokens
    counted than emitted), or the last emitted token's text goes on past the end of the text
    with the stop string."""
    if gen.finish_reason == "length":
        return "limit", ""
    if gen.finish_reason != "stop":
        return "none", ""
    stops = [s for s in gen.stop if s]
    if stops and gen.stats.n_tokens > len(gen.tokens):
        return "word", stops[0] if len(stops) == 1 else ""
    full = b"".join(fly.engine.target_model.piece(t) for t in gen.tokens).decode("utf-8", "replace")
    rest = full[len(gen.text):] if full.startswith(gen.text) else ""
    for s in stops:
        if rest and (rest.startswith(s) or s.startswith(rest)):
            return "word", s
    return "eos", ""
