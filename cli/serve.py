"""``fly-cpp serve``: llama-server- and OpenAI-compatible HTTP endpoints over one model pair."""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable
from typing import Any

import click

from fly_cpp.chat_format import BUILTIN, is_builtin
from fly_cpp.cli.models_opt import model_options, open_engine
from fly_cpp.cli.options import pick, settings_options
from fly_cpp.config import SamplingSettings, SpecSettings
from fly_cpp.errors import FlyError

GRACE = 10  # seconds open connections get to finish after SIGINT/SIGTERM


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on (0.0.0.0: every interface)")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="TCP port (0: any free one)")
@click.option("--api-key", envvar="FLY_CPP_API_KEY", help="require 'Authorization: Bearer KEY' on every endpoint "
              "but /health [env: FLY_CPP_API_KEY]")
@click.option("--chat-format", help=f"{', '.join(BUILTIN)}, or a Jinja template file [default: the model's "
              "tokenizer.chat_template, else plain]")
@click.option("-a", "--alias", help="the model name /v1/models and every response report [default: the target's "
              "file name]")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info",
              show_default=True, help="server log level (info logs each request)")
@model_options
@settings_options(SpecSettings)
@settings_options(SamplingSettings)
def serve(host: str, port: int, api_key: str | None, chat_format: str | None, alias: str | None, log_level: str,
          **options: Any) -> None:
    """Serve a target/draft pair over HTTP: llama-server's /completion, /tokenize, /detokenize,
    /props, /health, /metrics, and OpenAI's /v1/completions, /v1/chat/completions, /v1/models.

    The sampling and FLy options set the defaults; every request may change them (mode, k,
    window, entropy_threshold, ...). Requests are served one generation at a time, in arrival
    order. With no -m/-d, the bundled tiny story model and its draft are used.
    """
    import uvicorn

    from fly_cpp.api import Fly
    from fly_cpp.server import create_app

    if chat_format is not None and not is_builtin(chat_format):
        try:
            with open(chat_format, encoding="utf-8") as f:
                chat_format = f.read()
        except OSError as e:
            raise FlyError(f"cannot read chat template {chat_format}: {e.strerror}") from None
    spec = SpecSettings(**pick(options, SpecSettings))
    sampling = SamplingSettings(**pick(options, SamplingSettings))
    sock = _listen(host, port)  # before loading models: a busy port fails at once
    try:
        fly = Fly.from_engine(open_engine(options), chat_format=chat_format, spec=spec, sampling=sampling)
        if alias:
            fly.model = alias
    except BaseException:
        sock.close()
        raise
    app = create_app(fly, api_key=api_key, close_fly=True)
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=GRACE, lifespan="on")
    server = _server(config, on_exit=app.state.stop_generations)
    bound_host, bound_port = sock.getsockname()[:2]
    draft = fly.info.draft_name or "n-gram lookup only"
    click.echo(f"fly-cpp: serving {fly.model} (draft: {draft}) on http://{_url_host(bound_host)}:{bound_port}", err=True)
    # uvicorn re-raises the signal that stopped it once it is done; after a clean shutdown that
    # must not turn into KeyboardInterrupt or a kill, so the process exits with status 0
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
        fly.close()  # the lifespan closes it too (closing twice is fine); this covers a failed start
    if not server.started:
        raise FlyError(f"the server on {host}:{port} did not start (see the log above)")


def _server(config: Any, on_exit: Callable[[], None]) -> Any:
    """uvicorn's server, ending open generations as soon as a signal asks it to stop (so
    streams finish within the grace period instead of being cancelled at its end)."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            on_exit()
            super().handle_exit(sig, frame)

    return Server(config)


def _listen(host: str, port: int) -> socket.socket:
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
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise FlyError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.set_inheritable(True)
    return sock


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
