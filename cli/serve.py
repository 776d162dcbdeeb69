"""``fly-cpp serve``: llama-server- and OpenAI-compatible HTTP endpoints over one model pair,
and a chat page at /."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

import click
from fly_cpp.cli.models_opt import model_options, model_settings, template_fallback
from fly_cpp.cli.options import pick, settings_options

from fly_cpp.api.chat_format import BUILTIN, is_builtin
from fly_cpp.basics.errors import FlyError
from fly_cpp.config import AUTO, SamplingSettings, ServerSettings, SpecSettings

API_KEY_ENV = "FLY_CPP_API_KEY"


@click.command()
@settings_options(ServerSettings)
@click.option("--chat-format", "--chat-template", "--chat-template-file", "chat_format",
              help=f"{', '.join(BUILTIN)}, a Jinja template file, or Jinja text [default: the model's "
              "tokenizer.chat_template, else chatml, as llama-server]")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info",
              show_default=True, help="server log level (info logs each request)")
@model_options
@settings_options(SpecSettings)
@settings_options(SamplingSettings)
def serve(chat_format: str | None, log_level: str, **options: Any) -> None:
    """Serve a target/draft pair over HTTP: llama-server's /completion, /tokenize, /detokenize,
    /apply-template, /props, /slots, /health, /metrics (with --metrics), OpenAI's
    /v1/completions, /v1/chat/completions, /v1/responses, /v1/models, Anthropic's /v1/messages,
    and a chat page at / (open it in a browser).

    The sampling and FLy options set the defaults; every request may change them (mode, k,
    window, entropy_threshold, ...). Requests are served -np/--parallel at a time (default auto:
    4 in one cache, as llama-server), in arrival order. The port is bound first; /health answers 503 until the models are loaded. With no
    -m/-d, the bundled tiny story model and its draft are used.
    """
    import uvicorn

    from fly_cpp.api.fly import Fly
    from fly_cpp.backend.fit import auto_slots
    from fly_cpp.engine.engine import Engine
    from fly_cpp.server import create_app
    from fly_cpp.server.connections import limits, protocol

    if API_KEY_ENV in os.environ and options.get("api_key") is None:
        options["api_key"] = os.environ[API_KEY_ENV]  # set but empty: refused below, never "no key"
    settings = ServerSettings(**pick(options, ServerSettings))
    if chat_format is not None and not is_builtin(chat_format) and "{" not in chat_format:
        try:
            with open(chat_format, encoding="utf-8") as f:
                chat_format = f.read()
        except OSError as e:
            raise FlyError(f"cannot read chat template {chat_format}: {e.strerror}") from None
    spec = SpecSettings(**pick(options, SpecSettings))
    sampling = SamplingSettings(**pick(options, SamplingSettings))
    target, draft = model_settings(options)  # checked (and downloaded) before the port is bound
    Engine.preflight(target, draft)  # files, context size and memory, from the GGUF headers
    if settings.parallel == AUTO and spec.draft_tree:  # a tree forks the cache of one slot
        settings = dataclasses.replace(settings, parallel=1)
    if settings.parallel == AUTO:  # llama-server's -np auto: 4 slots in one cache (1 for an MTP head)
        settings = dataclasses.replace(settings, parallel=auto_slots(target, draft), kv_unified=True)
    if spec.draft_tree and settings.n_slots > 1:
        raise FlyError(f"--draft-tree verifies trees in one slot's cache: serve them with -np 1 (got -np {settings.n_slots})")
    cap, backlog = limits(settings.max_connections)
    _log_to_stderr(log_level)
    socks: list[socket.socket] = []
    for host in settings.hosts:  # the first binds the port (0: any free one), the others the same
        socks.append(_listen(host, socks[0].getsockname()[1] if socks else settings.port, backlog))
    sock = socks[0]
    bound_host, bound_port = sock.getsockname()[:2]
    url = f"http://{_url_host(bound_host)}:{bound_port}"
    failure: list[BaseException] = []

    def load() -> Fly:
        fly = template_fallback(Fly.from_engine(Engine(target, draft, n_seq=settings.n_slots, kv_unified=settings.unified,
                                                       max_draft=spec.max_draft, branches=spec.draft_tree > 0),
                                                chat_format=chat_format, spec=spec, sampling=sampling), chat_format)
        if settings.alias_list:
            fly.model = settings.alias_list[0]
        return fly

    def ready(fly: Fly) -> None:
        note = fly.info.draft_name or "n-gram lookup only"
        click.echo(f"fly-cpp: {fly.info.placement}", err=True)
        click.echo(f"fly-cpp: serving {fly.model} (draft: {note}) on {url}", err=True)
        if settings.context_shift and not fly.engine.can_shift:
            click.echo("fly-cpp: --context-shift is off: these models' caches cannot shift (a recurrent state, or "
                       "an MTP head); a text that fills the context ends there", err=True)

    def failed(error: BaseException) -> None:
        failure.append(error)
        server.should_exit = True

    app = create_app(load, settings=settings, close_fly=True, on_ready=ready, on_load_failure=failed)
    config = uvicorn.Config(app, log_level=log_level, lifespan="on", http=protocol(cap, settings.header_timeout),
                            timeout_graceful_shutdown=settings.grace,  # type: ignore[arg-type]
                            timeout_keep_alive=settings.keep_alive,  # type: ignore[arg-type]
                            limit_concurrency=cap + 1, backlog=backlog)
    server = _server(config, on_exit=app.state.stop_generations)
    click.echo(f"fly-cpp: listening on {url}, loading the models", err=True)
    # uvicorn re-raises the signal that stopped it once it is done; after a clean shutdown that
    # must not turn into KeyboardInterrupt or a kill, so the process exits with status 0
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=socks)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for each in socks:
            each.close()
        served = app.state.served
        if served.fly is not None:
            served.fly.close()  # the lifespan closes it too (closing twice is fine)
    if failure:
        e = failure[0]
        raise e if isinstance(e, FlyError) else FlyError(f"loading the models failed: {type(e).__name__}: {e}")
    if not server.started:
        raise FlyError(f"the server on {settings.host}:{settings.port} did not start (see the log above)")
    if any(t.name == "fly-cpp-load" and t.is_alive() for t in threading.enumerate()):
        # stopped while llama.cpp was still loading: its thread cannot be interrupted, and the
        # interpreter must not tear down under it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _server(config: Any, on_exit: Callable[[], None]) -> Any:
    """uvicorn's server, ending open generations as soon as a signal asks it to stop (so
    streams finish within the grace period instead of being cancelled at its end)."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            on_exit()
            super().handle_exit(sig, frame)

    return Server(config)


def _log_to_stderr(level: str) -> None:
    """The server's own notes (fields it ignores, load failures) as one line each on stderr."""
    log = logging.getLogger("fly_cpp.server")
    if not any(getattr(h, "fly_cpp", False) for h in log.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("fly-cpp: %(message)s"))
        handler.fly_cpp = True  # type: ignore[attr-defined]
        log.addHandler(handler)
    log.setLevel(level.upper())
    log.propagate = False


def _listen(host: str, port: int, backlog: int) -> socket.socket:
    """A listening socket for uvicorn, or one clear error line."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise FlyError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except OSError as e:
        sock.close()
        raise FlyError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.set_inheritable(True)
    return sock


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
