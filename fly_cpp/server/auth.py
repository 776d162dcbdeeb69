"""``--api-key``: every endpoint but the health check wants ``Authorization: Bearer KEY``
(or llama-server's ``X-Api-Key: KEY``)."""

from __future__ import annotations

import secrets
from typing import Any

from fly_cpp.server import errors

OPEN_PATHS = frozenset({"/health", "/v1/health"})


class ApiKey:
    """Pure ASGI middleware (no response buffering, so streams and disconnects pass through)."""

    def __init__(self, app: Any, key: str) -> None:
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        await errors.response(401, "invalid or missing API key (send 'Authorization: Bearer KEY')")(scope, receive, send)

    def _allowed(self, scope: dict[str, Any]) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                given = value[7:].strip()
            elif name == b"x-api-key":
                given = value.strip()
            else:
                continue
            if secrets.compare_digest(given, self.key):
                return True
        return False
