"""llama-server's endpoints: /completion, /tokenize, /detokenize, /apply-template, /props,
/slots, /health, /metrics."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

import fly_cpp
from fly_cpp.api.fly import Fly
from fly_cpp.api.tools import template_messages
from fly_cpp.backend import rpc
from fly_cpp.server import errors
from fly_cpp.server.compat import IGNORED, OFF, Compat
from fly_cpp.server.completion import complete
from fly_cpp.server.fields import (
    SETTING_NAMES,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    settings_dict,
)
from fly_cpp.server.prepare import Defaults, prepare, template_vars
from fly_cpp.server.runs import Runs
from fly_cpp.server.served import Served
from fly_cpp.server.slots import slot_states

SERVING = ("{n} at a time per model pair (-np/--parallel), in arrival order: other requests wait in a queue "
           "(a request whose client disconnects is dropped, and a stream it leaves is aborted)")
N_PROBS = ("top-n target log-probabilities per generated token, from the target pass that verified it (the "
           "target's raw distribution, as with post_sampling_probs off); streams carry them per token")


def router(served: Served, runs: Runs, compat: Compat, slots: bool = True, metrics: bool = True,
           n_predict: int = -1, defaults: Defaults = Defaults()) -> APIRouter:
    r = APIRouter()
    started = str(int(time.time()))  # llama-server's Process-Start-Time-Unix header on /metrics
    slot_totals: list[dict[str, int]] = []
    sharing: dict[str, tuple[int, int, int]] = {}

    @r.get("/health")
    @r.get("/v1/health")
    async def health() -> Any:
        if (loss := rpc.lost()) is not None:  # no generation can succeed: tell load balancers
            return JSONResponse(errors.body(503, f"an rpc-server stopped answering ({loss}): restart it, then "
                                                 "this server"), status_code=503)
        return {"status": "ok"}

    @r.get("/props")
    async def props() -> dict[str, Any]:
        pair = served.snapshot["props"] if served.sleeping else _pair_props(served.ready)
        return {
            **pair, "is_sleeping": served.sleeping,
            "per_request_settings": list(SETTING_NAMES), "n_probs": N_PROBS, "strict": compat.strict,
            "ignored_fields": {name: rule.why for name, rule in IGNORED.items()},
            "ignored_fields_seen": dict(compat.seen),
            "build_info": f"fly-cpp {fly_cpp.__version__}",
        }

    served.snapshots["props"] = _pair_props

    @r.get("/slots", response_model=None)
    async def slot_list() -> list[dict[str, Any]] | JSONResponse:
        if not slots:
            return errors.response(501, "this server does not answer /slots (started with --no-slots)")
        fly = served.ready
        return slot_states(fly)

    @r.get("/metrics", response_model=None)
    async def prometheus() -> PlainTextResponse | JSONResponse:
        if not metrics:
            return errors.response(501, "this server does not answer /metrics (start it with --metrics)")
        engine = served.fly.engine if served.fly is not None else None  # none while loading or asleep
        if engine is not None:  # asleep, the slots' counters and shared decodes are the ones seen last
            slot_totals[:] = [view.totals for view in engine.slot_views()]
            sharing.clear()
            sharing.update(engine.sharing())
        text = runs.metrics.render({
            "requests_processing": ("Number of requests processing (at most -np/--parallel).",
                                    engine.generations_running if engine is not None else 0),
            "requests_deferred": ("Number of requests deferred (waiting for a slot).",
                                  runs.worker.waiting + (engine.generations_waiting if engine is not None else 0))},
            slot_totals, sharing)
        out = PlainTextResponse(text, media_type="text/plain; version=0.0.4")
        # spelled as llama-server spells it (clients that read headers as a plain dict look for
        # this case); Starlette would lower-case a header given the usual way
        out.raw_headers.append((b"Process-Start-Time-Unix", started.encode()))
        return out

    @r.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> Response:
        compat.check(body, "/tokenize")
        fly = served.ready

        def work() -> Response:
            tokens = fly.tokenize(body.content, add_special=body.add_special, parse_special=body.parse_special)
            if not body.with_pieces:
                return JSONResponse({"tokens": tokens})
            return JSONResponse({"tokens": [{"id": t, "piece": fly.engine.piece(t).decode("utf-8", "replace")}
                                            for t in tokens]})

        return await prepare(work)

    @r.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> Response:
        compat.check(body, "/detokenize")
        fly = served.ready

        def work() -> Response:
            fly.engine.check_tokens(body.tokens)
            return JSONResponse({"content": fly.detokenize(body.tokens)})

        return await prepare(work)

    @r.post("/apply-template")
    async def apply_template(body: ChatCompletionRequest) -> Response:  # type: ignore[valid-type]
        compat.check(body, "/apply-template")
        fly = served.ready

        def work() -> Response:
            extra = template_vars(body, defaults)  # enable_thinking from --reasoning, as the chat endpoint
            if body.tools and body.tool_choice != "none":
                extra.setdefault("tools", body.tools)
            return JSONResponse({"prompt": fly.chat_format.render(template_messages(body.messages), **extra,
                                                                  add_generation_prompt=body.add_generation_prompt)})

        return await prepare(work)

    @r.post("/completion")
    @r.post("/completions")
    async def completion(body: CompletionRequest, request: Request) -> Response:  # type: ignore[valid-type]
        compat.check(body, "/completion")
        return await complete(served.ready, runs, request, body, n_predict, defaults)

    return r


def _pair_props(fly: Fly) -> dict[str, Any]:
    """What /props says of the served pair (kept while the server sleeps)."""
    info = fly.info
    settings = {**OFF, **settings_dict(fly.spec, fly.sampling)}
    return {
        "model": fly.model, "model_path": info.target.path, "draft_model": info.draft_name,
        "draft_model_path": info.draft.path if info.draft is not None else None,
        "n_ctx": fly.n_ctx, "n_vocab": info.n_vocab,
        "chat_format": fly.chat_format.name, "chat_template": fly.chat_format.template,
        # flat as fly-cpp has always given them, and under params as llama-server gives them
        "default_generation_settings": {**settings, "n_ctx": fly.n_ctx, "params": settings},
        "total_slots": fly.engine.n_seq, "serving": SERVING.format(n=_generations(fly.engine.n_seq)),
    }


def _generations(n: int) -> str:
    return "one generation" if n == 1 else f"{n} generations"
