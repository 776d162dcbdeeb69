"""Request bodies are JSON whatever their Content-Type says, as with llama-server: ``curl -d``
sends ``application/x-www-form-urlencoded`` by default, and users expect that to work."""

from __future__ import annotations

from typing import Any


class JsonBodies:
    """Pure ASGI middleware: a POST without a JSON content type is read as JSON."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            kept = [v for k, v in scope["headers"] if k == b"content-type" and b"json" in v]
            scope = {**scope, "headers": [*headers, (b"content-type", kept[0] if kept else b"application/json")]}
        await self.app(scope, receive, send)
