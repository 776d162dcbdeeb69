"""Request bodies.

The sampling and speculative fields of every generation endpoint are made from the fields of
``SamplingSettings`` and ``SpecSettings`` (name, type, help text), so a setting is declared once;
their values are checked by those dataclasses (a bad value is a 400 naming it). Unset fields
keep the server's defaults (the ``serve`` command line). Unknown fields and wrong types are
refused (strict validation: ``"5"`` is not a number).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, create_model

from fly_cpp.config import SamplingSettings, SpecSettings

SETTINGS = (SpecSettings, SamplingSettings)


def _inf(value: Any) -> Any:
    return math.inf if value in ("inf", "Infinity") else value


def _field_type(name: str, hint: Any) -> Any:
    if isinstance(hint, types.UnionType):  # X | None: the request's None already means "unset"
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if name == "entropy_threshold":  # JSON has no infinity: "inf" is accepted, as on the command line
        return Annotated[float, BeforeValidator(_inf)]
    return hint


def _settings_fields() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for cls in SETTINGS:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            out[f.name] = (_field_type(f.name, hints[f.name]) | None,
                           Field(default=None, description=f.metadata.get("help")))
    return out


SETTING_NAMES = tuple(f.name for cls in SETTINGS for f in dataclasses.fields(cls))


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    def settings(self) -> dict[str, Any]:
        """The settings this request sets (seed -1 is llama.cpp's "random": unset)."""
        out = {name: getattr(self, name) for name in SETTING_NAMES if getattr(self, name) is not None}
        if out.get("seed") == -1:
            del out["seed"]
        return out


def _with_settings(name: str, base: type[_Body]) -> Any:
    return create_model(name, __base__=base, **_settings_fields())


Stop = str | list[str] | None


class _Completion(_Body):
    """llama-server's ``POST /completion``."""

    prompt: str | list[int]
    n_predict: int = Field(-1, description="tokens to generate; -1 = until end of text or the context is full")
    stop: Stop = None
    stream: bool = False
    n_probs: int = Field(0, ge=0, description="top-n target probabilities per generated token (after the generation)")
    cache_prompt: bool = Field(True, description="accepted for compatibility: the common prefix is always reused")


class _OpenAI(_Body):
    model: str | None = Field(None, description="accepted; the served pair answers whatever the name")
    max_tokens: int | None = Field(None, description="tokens to generate; unset = until end of text or the context is full")
    stop: Stop = None
    stream: bool = False
    stream_options: dict[str, Any] | None = Field(None, description="accepted; usage is always in the last chunk")
    n: int = Field(1, ge=1, le=1, description="one choice per request")
    user: str | None = None


class _TextCompletion(_OpenAI):
    prompt: str | list[int]


class _ChatCompletion(_OpenAI):
    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = Field(None, description="the newer name of max_tokens")


CompletionRequest = _with_settings("CompletionRequest", _Completion)
TextCompletionRequest = _with_settings("TextCompletionRequest", _TextCompletion)
ChatCompletionRequest = _with_settings("ChatCompletionRequest", _ChatCompletion)


class TokenizeRequest(_Body):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_Body):
    tokens: list[int]


def settings_dict(*settings: Any) -> dict[str, Any]:
    """Settings dataclasses as one JSON-safe dict (infinity as "inf", as requests accept it)."""
    out: dict[str, Any] = {}
    for s in settings:
        for name, value in dataclasses.asdict(s).items():
            out[name] = "inf" if isinstance(value, float) and math.isinf(value) else value
    return out
