"""``--api-key``: every endpoint but the health check and the chat page wants
``Authorization: Bearer KEY`` (or llama-server's ``X-Api-Key: KEY``). The page asks its user
for the key and sends it with its own requests."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from fly_cpp.server import errors


class ApiKey:
    """Pure ASGI middleware (no response buffering, so streams and disconnects pass through)."""

    def __init__(self, app: Any, key: str, open_path: Callable[[str], bool]) -> None:
        self.app = app
        self.key = key.encode()
        self.open_path = open_path

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.open_path(scope["path"]) or self._allowed(scope):
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
