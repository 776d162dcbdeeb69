"""The app factory: ``create_app(fly)`` serves one ``Fly`` pair over HTTP."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

import fly_cpp
from fly_cpp.api.fly import Fly
from fly_cpp.config import ServerSettings
from fly_cpp.server import anthropic, errors, llama, oai, page, responses
from fly_cpp.server.auth import ApiKey
from fly_cpp.server.bodies import Bodies
from fly_cpp.server.compat import Compat
from fly_cpp.server.cors import Cors
from fly_cpp.server.metrics import CountErrors, Metrics
from fly_cpp.server.prepare import Defaults
from fly_cpp.server.runs import Runs
from fly_cpp.server.served import Loading, Served
from fly_cpp.server.sleep import Sleep, Waking
from fly_cpp.server.worker import Worker

log = logging.getLogger("fly_cpp.server")
HEALTH = ("/health", "/v1/health")


def create_app(fly: Fly | Callable[[], Fly], *, settings: ServerSettings | None = None, api_key: str | None = None,
               close_fly: bool = False, on_ready: Callable[[Fly], None] | None = None,
               on_load_failure: Callable[[BaseException], None] | None = None) -> FastAPI:
    """An ASGI app serving ``fly``: llama-server's /completion, /tokenize, /detokenize,
    /apply-template, /props, /slots, /health, /metrics, OpenAI's /v1/completions,
    /v1/chat/completions, /v1/models, Anthropic's /v1/messages, OpenAI's /v1/responses, and a chat page at /.

    ``fly``: a loaded pair, or a function that loads one: it then runs in the background when
    the app starts, and until it is done every endpoint but the page answers 503 "Loading
    model" (then ``on_ready(fly)`` is called; a failure goes to ``on_load_failure``).
    ``settings``: the server's limits, CORS and API key (``api_key`` overrides its key).
    ``close_fly``: close the models when the app shuts down (the app owns ``fly``).
    ``settings.sleep_idle_seconds`` frees the models while idle; only a ``fly`` given as a
    function that loads it can sleep (it is called again to wake).
    Generations run on the worker's threads, one per slot (-np); its state lives in this app only.
    ``app.state.stop_generations()`` ends every request cleanly when shutdown begins: the
    running generation stops after its round with a final event, waiting ones get 503."""
    settings = settings or ServerSettings()
    if api_key is not None:
        settings = dataclasses.replace(settings, api_key=api_key)  # validated: an empty key is refused
    served = Served(fly)
    # a thread per slot: the loaded engine's slots, else as many as the settings will load
    slots = fly.engine.n_seq if isinstance(fly, Fly) else settings.n_slots
    runs = Runs(Worker(settings.max_queue, slots,
                       lambda: served.fly.engine.generations_waiting if served.fly is not None else 0), Metrics())
    compat = Compat(settings.strict)
    sleep = (Sleep(served, runs, settings.sleep_idle_seconds, page.is_page)
             if settings.sleep_idle_seconds > 0 and served.can_sleep else None)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        previous = loop.get_exception_handler()
        loop.set_exception_handler(_quiet_accept_errors(previous))
        served.start(on_ready or (lambda fly: None),
                     on_load_failure or (lambda e: log.error("the models failed to load: %s", e)))
        watch = asyncio.ensure_future(sleep.watch()) if sleep is not None else None
        try:
            yield
        finally:
            if watch is not None:
                watch.cancel()
            loop.set_exception_handler(previous)
            runs.worker.close()  # end open generations, wait for the engine thread
            if close_fly and served.fly is not None:
                served.fly.close()

    app = FastAPI(title="fly-cpp", version=fly_cpp.__version__, lifespan=lifespan,
                  description="llama-server and OpenAI-compatible endpoints with FLy speculative decoding")
    errors.install(app, on_server_error=lambda: runs.metrics.count("errors"))
    if settings.ui:
        app.include_router(page.router())
    defaults = Defaults(settings.reasoning, settings.reasoning_format, settings.context_shift)
    app.include_router(llama.router(served, runs, compat, slots=settings.slots, metrics=settings.metrics,
                                    n_predict=settings.n_predict, defaults=defaults))
    app.include_router(oai.router(served, runs, compat, aliases=settings.alias_list, tags=settings.tag_list,
                                  n_predict=settings.n_predict, defaults=defaults, verbose=settings.verbose))
    app.include_router(anthropic.router(served, runs, compat, n_predict=settings.n_predict, defaults=defaults))
    app.include_router(responses.router(served, runs, compat, n_predict=settings.n_predict, defaults=defaults))
    # middlewares, innermost first: bodies are read (limits) only for callers with the key
    if sleep is not None:
        app.add_middleware(Waking, sleep=sleep)  # a sleeping pair wakes for callers with the key only
    app.add_middleware(Bodies, max_body=settings.max_body, timeout=settings.body_timeout)
    if settings.api_key:
        app.add_middleware(ApiKey, key=settings.api_key, open_path=lambda p: p in HEALTH or (settings.ui and page.is_page(p)))
    app.add_middleware(Loading, served=served, open_paths=page.is_page)
    app.add_middleware(Cors, origins=settings.cors_origin_list,
                       methods=[m.strip() for m in settings.cors_methods.split(",") if m.strip()],
                       headers=[h.strip() for h in settings.cors_headers.split(",") if h.strip()],
                       credentials=settings.cors_credentials)  # preflights answered before the key
    app.add_middleware(CountErrors, metrics=runs.metrics)  # outermost: 401s count too
    app.state.served, app.state.runs, app.state.stop_generations = served, runs, runs.worker.stop
    app.state.settings = settings
    return app


def _quiet_accept_errors(previous: Any) -> Any:
    """The event loop's exception handler, with accept() failures (out of file descriptors:
    asyncio retries by itself) logged as one line at most every 10 seconds, not a traceback
    per attempt."""
    last = [0.0]

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if "accept" in str(context.get("message", "")) and isinstance(context.get("exception"), OSError):
            now = time.monotonic()
            if now - last[0] >= 10:
                last[0] = now
                log.warning("cannot accept connections: %s (retrying)", context["exception"])
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    return handler
