"""OpenAI's ``response_format`` as a JSON schema (``SamplingSettings.json_schema``), for the
Python API and the server alike."""

from __future__ import annotations

import json
from typing import Any

from fly_cpp.basics.errors import FlyError


def response_format(raw: dict[str, Any] | None) -> str | None:
    """OpenAI's ``response_format`` as a JSON schema's text (None: unconstrained). ``json_object``
    takes llama-server's optional ``schema``; ``json_schema`` OpenAI's ``{"json_schema": {"schema": ...}}``
    (``strict`` or not, the schema is enforced)."""
    if raw is None:
        return None
    kind = raw.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = raw.get("schema", {})
    elif kind == "json_schema":
        inner = raw.get("json_schema")
        schema = inner.get("schema") if isinstance(inner, dict) else None
        if schema is None:
            raise FlyError("response_format json_schema needs json_schema.schema")
    else:
        raise FlyError(f"response_format type must be text, json_object or json_schema, got {kind!r}")
    if not isinstance(schema, dict):
        raise FlyError("response_format's schema must be a JSON object")
    return json.dumps(schema)
