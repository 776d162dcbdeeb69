"""The app factory: ``create_app(fly)`` serves one ``Fly`` pair over HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

import fly_cpp
from fly_cpp.api import Fly
from fly_cpp.server import errors, llama, oai
from fly_cpp.server.auth import ApiKey
from fly_cpp.server.bodies import JsonBodies
from fly_cpp.server.metrics import CountErrors, Metrics
from fly_cpp.server.runs import Runs
from fly_cpp.server.worker import Worker


def create_app(fly: Fly, *, api_key: str | None = None, close_fly: bool = False) -> FastAPI:
    """An ASGI app serving ``fly``: llama-server's /completion, /tokenize, /detokenize, /props,
    /health, /metrics and OpenAI's /v1/completions, /v1/chat/completions, /v1/models.

    ``api_key``: every endpoint but /health then wants ``Authorization: Bearer KEY``.
    ``close_fly``: close the models when the app shuts down (the app owns ``fly``).
    Generations run on one worker thread, one at a time; its state lives in this app only.
    ``app.state.stop_generations()`` ends open generations at once and refuses new ones (503):
    call it when shutdown begins, so that streams end while the server drains its connections."""
    runs = Runs(Worker(), Metrics())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        runs.worker.close()  # abandon open generations, wait for the engine thread
        if close_fly:
            fly.close()

    app = FastAPI(title="fly-cpp", version=fly_cpp.__version__, lifespan=lifespan,
                  description="llama-server and OpenAI-compatible endpoints with FLy speculative decoding")
    errors.install(app, on_server_error=lambda: runs.metrics.count("errors"))
    app.include_router(llama.router(fly, runs))
    app.include_router(oai.router(fly, runs))
    if api_key:
        app.add_middleware(ApiKey, key=api_key)
    app.add_middleware(JsonBodies)
    app.add_middleware(CountErrors, metrics=runs.metrics)  # outermost: 401s count too
    app.state.fly, app.state.runs, app.state.stop_generations = fly, runs, runs.worker.stop
    return app
