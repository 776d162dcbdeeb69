"""Cross-origin requests, answered as llama-server answers them: an allowed origin is echoed
back in ``Access-Control-Allow-Origin`` (with ``Access-Control-Allow-Credentials: true`` when
credentials are on); a refused one gets its answer without that header, so the browser keeps it
from the page; a preflight (``OPTIONS``) is answered 200 here, before the API key is asked."""

from __future__ import annotations

import re
from typing import Any

LOCAL_ORIGINS = re.compile(r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?")


class Cors:
    """Pure ASGI middleware (streams pass through untouched). Header names are sent spelled as
    llama-server spells them: HTTP does not care, but some clients compare them exactly."""

    def __init__(self, app: Any, origins: list[str], methods: list[str], headers: list[str],
                 credentials: bool) -> None:
        self.app = app
        self.any = "*" in origins
        self.local = "localhost" in origins
        self.origins = {o for o in origins if o not in ("*", "localhost")}
        self.methods = ", ".join(methods)
        self.headers = ", ".join(headers)
        self.credentials = credentials

    def allowed(self, origin: str) -> bool:
        return self.any or origin in self.origins or (self.local and LOCAL_ORIGINS.fullmatch(origin) is not None)

    def _cors_headers(self, origin: str) -> list[tuple[bytes, bytes]]:
        if not self.allowed(origin):
            return []
        out = [(b"Access-Control-Allow-Origin", origin.encode("latin-1")), (b"Vary", b"Origin")]
        if self.credentials:
            out.append((b"Access-Control-Allow-Credentials", b"true"))
        return out

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        origin = _header(scope, b"origin") if scope["type"] == "http" else None
        if origin is None:
            await self.app(scope, receive, send)
            return
        extra = self._cors_headers(origin)
        if scope["method"] == "OPTIONS" and _header(scope, b"access-control-request-method") is not None:
            if extra:
                extra += [(b"Access-Control-Allow-Methods", self.methods.encode()),
                          (b"Access-Control-Allow-Headers", self.headers.encode()),
                          (b"Access-Control-Max-Age", b"600")]
            await send({"type": "http.response.start", "status": 200,
                        "headers": [*extra, (b"content-length", b"0"), (b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b""})
            return

        async def send_with(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and extra:
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with)


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None
