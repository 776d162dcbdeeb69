"""Server-sent events: ``data: <json>\\n\\n`` per event; OpenAI streams end with ``data: [DONE]``.
Anthropic's and OpenAI Responses' events also name their type (``event: <type>``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse

HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def event(data: Any) -> bytes:
    # allow_nan=False: NaN is not JSON; a value that would write it fails here, not in a client
    return b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode() + b"\n\n"


def named(data: dict[str, Any]) -> bytes:
    """An event whose ``event:`` line is its data's ``type``."""
    return b"event: " + str(data["type"]).encode() + b"\n" + event(data)


DONE = b"data: [DONE]\n\n"


def response(events: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers=HEADERS)
