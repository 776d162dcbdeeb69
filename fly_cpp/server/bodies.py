"""Request bodies, read whole before the endpoint sees them: within a size limit (HTTP 413
beyond ``max_body``) and a time limit (HTTP 408 when the client stops sending for
``body_timeout`` seconds), and read as JSON whatever their Content-Type says, as llama-server
does (``curl -d`` sends ``application/x-www-form-urlencoded`` by default, and users expect
that to work)."""

from __future__ import annotations

import asyncio
from typing import Any

from fly_cpp.server import errors


class Bodies:
    """Pure ASGI middleware: a POST/PUT/PATCH body is read here (the limits), then handed on
    in one piece; later ``receive()`` calls (waiting for a disconnect) pass through."""

    def __init__(self, app: Any, max_body: int, timeout: float) -> None:
        self.app = app
        self.max_body = max_body
        self.timeout = timeout

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if length is not None and length.isdigit() and int(length) > self.max_body:
            await self._too_large(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.001))
            except asyncio.TimeoutError:
                await errors.response(408, f"the request body did not arrive within {self.timeout:g} s "
                                           "(--body-timeout)", close=True)(scope, receive, send)
                return
            if message["type"] == "http.disconnect":
                return  # the client left: nobody to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                await self._too_large(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        data = b"".join(chunks)
        chunks.clear()
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": data, "more_body": False}
            return await receive()  # type: ignore[no-any-return]

        headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
        kept = [v for k, v in scope["headers"] if k == b"content-type" and b"json" in v]
        scope = {**scope, "headers": [*headers, (b"content-type", kept[0] if kept else b"application/json")]}
        await self.app(scope, replay, send)

    async def _too_large(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await errors.response(413, f"the request body is larger than {self.max_body} bytes "
                                   "(--max-body)", close=True)(scope, receive, send)
