"""llama-server's endpoints: /completion, /tokenize, /detokenize, /props, /health, /metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

import fly_cpp
from fly_cpp import rpc
from fly_cpp.api import Fly
from fly_cpp.errors import FlyError
from fly_cpp.generation import Generation
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
    engine, info = fly.engine, fly.info

    @r.get("/health")
    @r.get("/v1/health")
    async def health() -> Any:
        if (loss := rpc.lost()) is not None:  # no generation can succeed: tell load balancers
            return JSONResponse(errors.body(503, f"an rpc-server stopped answering ({loss}): restart it, then "
                                                 "this server"), status_code=503)
        return {"status": "ok"}

    @r.get("/props")
    async def props() -> dict[str, Any]:
        return {
            "model": fly.model, "model_path": info.target.path, "draft_model": info.draft_name,
            "draft_model_path": info.draft.path if info.draft is not None else None,
            "n_ctx": fly.n_ctx, "n_vocab": info.n_vocab,
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
        return {"tokens": [{"id": t, "piece": engine.piece(t).decode("utf-8", "replace")} for t in tokens]}

    @r.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, str]:
        engine.check_tokens(body.tokens)
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
            return sse.response(runs.events(_stream(fly.model, gen, items, body.n_probs)))
        got = await runs.collect(request, items)
        if got is None:
            return Response(status_code=499)
        return JSONResponse(_result(fly.model, gen, got[-1], body.n_probs))

    return r


async def _stream(model: str, gen: Generation, items: AsyncIterator[Any], n_probs: int) -> AsyncIterator[bytes]:
    async for item in items:
        if isinstance(item, Step):
            if item.text:
                yield sse.event({"index": 0, "content": item.text, "tokens": [item.token], "stop": False,
                                 "id_slot": 0})
        else:
            yield sse.event({**_result(model, gen, item, n_probs), "content": ""})


def _result(model: str, gen: Generation, probs: list[dict[str, Any]], n_probs: int) -> dict[str, Any]:
    s = gen.stats
    finish = gen.finish
    out = {
        "index": 0, "id_slot": 0, "content": gen.text, "stop": True, "model": model,
        "tokens_predicted": len(gen.tokens), "tokens_evaluated": len(gen.prompt), "truncated": False,
        "stop_type": finish.kind if finish is not None else "none",
        "stopping_word": finish.word if finish is not None else "", "finish_reason": gen.finish_reason,
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
