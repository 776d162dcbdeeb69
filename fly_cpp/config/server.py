"""``fly-cpp serve``: where it listens, who may call it, its limits."""

from __future__ import annotations

from dataclasses import dataclass, field

from fly_cpp.config.checks import AUTO, AUTO_SLOTS, _help, _integer, _number, _require


@dataclass(frozen=True)
class ServerSettings:
    """``fly-cpp serve``: where it listens, who may call it, and the limits that keep it up
    under hostile or heavy traffic."""

    host: str = field(default="127.0.0.1", metadata=_help(
        "address to listen on (0.0.0.0: every interface); several, comma-separated"))
    port: int = field(default=8080, metadata=_help("TCP port (0: any free one)"))
    api_key: str | None = field(default=None, repr=False, metadata=_help(
        "require 'Authorization: Bearer KEY' (or 'X-Api-Key: KEY') on every endpoint but /health and the chat page",
        envvar="FLY_CPP_API_KEY"))
    strict: bool = field(default=False, metadata=_help(
        "refuse (HTTP 400) request fields fly-cpp would ignore: unknown ones, and llama-server's samplers it "
        "does not implement; by default they are ignored and logged once per name"))
    cors_origins: str = field(default="*", metadata=_help(
        "origins web pages may call from: *, 'localhost' (pages on this machine only), or a comma-separated list"))
    cors_methods: str = field(default="GET,POST,DELETE,OPTIONS", metadata=_help("methods allowed from other origins, comma-separated"))
    cors_headers: str = field(default="*", metadata=_help("request headers allowed from other origins, comma-separated"))
    cors_credentials: bool = field(default=True, metadata=_help(
        "allow credentials (cookies) from the allowed origins (as llama-server does)"))
    n_predict: int = field(default=-1, metadata=_help(
        "tokens a request generates when it does not say (n_predict / max_tokens); -1 = until the end of the "
        "text or a full context", aliases=("--predict",)))
    ui: bool = field(default=True, metadata=_help("serve the chat page at / (--no-ui: the API only)"))
    slots: bool = field(default=True, metadata=_help("answer /slots (--no-slots: HTTP 501, as llama-server)"))
    metrics: bool = field(default=False, metadata=_help(
        "answer /metrics (Prometheus counters; off: HTTP 501, as llama-server without --metrics)"))
    sleep_idle_seconds: float = field(default=-1, metadata=_help(
        "free the models after this many seconds without work, load them again for the next request that needs "
        "them (-1: never)"))
    alias: str | None = field(default=None, metadata=_help(
        "the model name /v1/models and every response report; several, comma-separated, are all listed as "
        "its aliases and the first in sorted order is its id [default: the target's file name]", aliases=("-a",)))
    tags: str = field(default="", metadata=_help("comma-separated tags /v1/models reports for the model"))
    max_body: int = field(default=8 * 2**20, metadata=_help("largest request body in bytes (HTTP 413 beyond)"))
    header_timeout: float = field(default=10.0, metadata=_help(
        "seconds a connection gets to send a request's headers, new or kept alive, before it is closed"))
    body_timeout: float = field(default=60.0, metadata=_help("seconds a request gets to send its body (HTTP 408 after)"))
    keep_alive: float = field(default=5.0, metadata=_help("seconds an idle keep-alive connection stays open"))
    max_connections: int = field(default=512, metadata=_help(
        "open connections at most (also kept under the open-file limit): a new one displaces the longest idle "
        "one, else it gets HTTP 503"))
    max_queue: int = field(default=128, metadata=_help("generation requests waiting for the engine at most (HTTP 503 beyond)"))
    grace: float = field(default=10.0, metadata=_help(
        "seconds open requests get to end after SIGINT/SIGTERM (generations stop at once and say so)"))
    parallel: int | str = field(default=AUTO, metadata=_help(
        "slots: requests generated at once, their rows sharing the models' batches (auto: 4 sharing one cache "
        "as with --kv-unified, as llama-server; 1 where the target drafts with its own MTP head, which drafts for "
        "one sequence)",
        aliases=("-np",)))
    kv_unified: bool = field(default=False, metadata=_help(
        "the slots share all of -c's positions (one cache; off: each slot has -c / -np of its own, as llama-server)",
        aliases=("-kvu",)))
    cont_batching: bool = field(default=True, metadata=_help(
        "a new request joins the running slots between rounds (always so; accepted for llama-server's spelling)",
        aliases=("-cb",)))
    reasoning: str = field(default="auto", metadata=_help(
        "on|off|auto: the chat template's enable_thinking (false only with off, as llama-server); a request's "
        "chat_template_kwargs win", aliases=("-rea",)))
    reasoning_format: str = field(default="auto", metadata=_help(
        "auto|deepseek: a reasoning model's <think> block goes to reasoning_content; none: it stays in the content"))
    context_shift: bool = field(default=False, metadata=_help(
        "a text that fills the context keeps its first n_keep tokens (the request's, BOS included), drops half "
        "of the rest (or the request's n_discard) and goes on; off: it ends there (as llama-server)"))
    verbose: bool = field(default=False, metadata=_help(
        "OpenAI's whole answers carry __verbose: /completion's answer, the prompt as the model read it included "
        "(a request's verbose wins)"))

    def __post_init__(self) -> None:
        _require(isinstance(self.host, str) and bool(self.host.strip()), "host must not be empty")
        _require(self.reasoning in ("on", "off", "auto"), f"reasoning must be on, off or auto, got {self.reasoning!r}")
        _require(self.reasoning_format in ("auto", "deepseek", "none"),
                 f"reasoning_format must be auto, deepseek or none, got {self.reasoning_format!r}")
        _integer("port", self.port, 0, 65535)
        if self.api_key is not None:
            key = self.api_key.strip()
            _require(bool(key), "the API key is empty: give a non-empty --api-key (or FLY_CPP_API_KEY), or none "
                     "for a server without authentication")
            _require(key.isascii() and key.isprintable() and " " not in key,
                     "the API key must be printable ASCII without spaces (HTTP headers carry it)")
            object.__setattr__(self, "api_key", key)
        _integer("n_predict", self.n_predict, -1, 2**31 - 1)
        _integer("max_body", self.max_body, 1024, 2**40)
        _number("header_timeout", self.header_timeout, 0, 86400, above=True)
        _number("body_timeout", self.body_timeout, 0, 86400, above=True)
        _number("keep_alive", self.keep_alive, 0, 86400, above=True)
        _integer("max_connections", self.max_connections, 4, 2**20)
        _integer("max_queue", self.max_queue, 0, 2**20)
        _number("grace", self.grace, 0, 86400)
        _require(self.sleep_idle_seconds == -1 or 0 < self.sleep_idle_seconds <= 10**9,
                 f"sleep_idle_seconds must be > 0 (or -1: never), got {self.sleep_idle_seconds!r}")
        _require(self.parallel == AUTO or (isinstance(self.parallel, int) and not isinstance(self.parallel, bool)
                                           and 1 <= self.parallel <= 256),
                 f"parallel must be 1..256 (or 'auto'), got {self.parallel!r}")

    @property
    def n_slots(self) -> int:
        """The slots ``parallel`` asks for ('auto': 4, as llama-server; ``fly_cpp.backend.fit.auto_slots``
        resolves it for a pair)."""
        return AUTO_SLOTS if self.parallel == AUTO else int(self.parallel)

    @property
    def unified(self) -> bool:
        """Whether the slots share one KV cache: as set, and with ``parallel`` 'auto' (as
        llama-server; the F16 Qwen pair at 4 clients ran 24.2 tok/s with one cache, 23.6 with a
        cache per slot, docs/slots.md)."""
        return self.kv_unified or self.parallel == AUTO

    @property
    def hosts(self) -> list[str]:
        """The addresses to listen on: ``host`` may name several, comma-separated."""
        return [h.strip() for h in self.host.split(",") if h.strip()]

    @property
    def alias_list(self) -> list[str]:
        return sorted({a.strip() for a in (self.alias or "").split(",") if a.strip()})

    @property
    def tag_list(self) -> list[str]:
        return [t.strip() for t in self.tags.split(",") if t.strip()]

    @property
    def cors_origin_list(self) -> list[str]:
        return [o.strip() for o in self.cors_origins.split(",") if o.strip()]
