"""Request bodies.

The sampling and speculative fields of every generation endpoint are made from the fields of
``SamplingSettings`` and ``SpecSettings`` (name, type, help text), so a setting is declared once;
their values are checked by those dataclasses (a bad value is a 400 naming it). Unset fields
keep the server's defaults (the ``serve`` command line). Known fields are typed strictly
(``"5"`` is not a number). Fields fly-cpp does not use are kept aside, not refused: the
llama-server and OpenAI fields it accepts without acting on them are listed in
``compat.IGNORED``, anything else is unknown; ``compat.Compat`` decides what happens to both
(logged once, or refused with ``--strict``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, create_model, model_validator

from fly_cpp.api.structured import response_format
from fly_cpp.basics.errors import FlyError
from fly_cpp.config import AUTO, SamplingSettings, SpecSettings
from fly_cpp.server.compat import IGNORED

SETTINGS = (SpecSettings, SamplingSettings)
MAX_N_PROBS = 100  # top-n per token: beyond this the answer is mostly numbers nobody reads


def _inf(value: Any) -> Any:
    return math.inf if value in ("inf", "Infinity") else value


def _field_type(name: str, hint: Any) -> Any:
    if hint == int | str:  # a number, or the controller's "auto" (k, k_gpu)
        return int | Literal[AUTO]  # type: ignore[valid-type]
    if name == "logit_bias":  # llama-server's and OpenAI's shapes, resolved by logit_bias() below
        return dict[str, Any] | list[Any]
    if isinstance(hint, types.UnionType):  # X | None: the request's None already means "unset"
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if name == "json_schema":  # llama-server's and OpenAI's: the schema itself; text also accepted
        return dict[str, Any] | str
    if name == "entropy_threshold":  # JSON has no infinity: "inf" is accepted, as on the command line
        return Annotated[float, BeforeValidator(_inf)]
    if typing.get_origin(hint) is tuple:  # JSON has lists (preserved_tokens)
        return Annotated[hint, BeforeValidator(lambda v: tuple(v) if isinstance(v, list) else v)]
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


def _lone_surrogate(value: Any, where: str) -> str | None:
    """The place of the first string in a JSON value that is not valid Unicode."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            return f"{where}: not valid Unicode: character {e.start} is a lone surrogate (U+{ord(value[e.start]):04X})"
        return None
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        if (found := _lone_surrogate(key, where) if isinstance(key, str) else None) is not None:
            return found
        if (found := _lone_surrogate(item, f"{where}.{key}" if where else str(key))) is not None:
            return found
    return None


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    honoured: ClassVar[frozenset[str]] = frozenset()  # names of IGNORED this endpoint acts on

    @model_validator(mode="before")
    @classmethod
    def _unicode(cls, data: Any) -> Any:
        """JSON may spell a lone surrogate ("\\ud800"), which no tokenizer can take."""
        if (problem := _lone_surrogate(data, "")) is not None:
            raise ValueError(problem)
        return data

    def settings(self) -> dict[str, Any]:
        """The settings this request sets (seed -1 is llama.cpp's "random": unset; logit_bias
        needs the vocabulary: see ``logit_bias``)."""
        out = {name: getattr(self, name) for name in SETTING_NAMES
               if name != "logit_bias" and getattr(self, name, None) is not None}
        if out.get("seed") == -1:
            del out["seed"]
        if isinstance(out.get("json_schema"), dict):
            out["json_schema"] = json.dumps(out["json_schema"])
        if (schema := response_format(getattr(self, "response_format", None))) is not None:
            out["json_schema"] = schema
        return out

    def unused(self) -> dict[str, Any]:
        """The fields of this body that fly-cpp will not act on: unknown names, and accepted
        fields (``IGNORED``) given a value that would matter."""
        out = dict(self.model_extra or {})
        for name in (n for n in IGNORED if n not in self.honoured):
            value = getattr(self, name, None)
            if value is not None and not IGNORED[name].neutral(value):
                out[name] = value
        return out


def _ignored_fields() -> dict[str, Any]:
    return {name: (Any, Field(default=None, description=f"accepted, not used: {rule.why}"))
            for name, rule in IGNORED.items()}


def _body(name: str, base: type[_Body]) -> Any:
    """A body model: ``base``'s fields, the settings, and the ignored fields ``base`` does not
    honour itself."""
    ignored = {n: f for n, f in _ignored_fields().items() if n not in base.model_fields}
    model = create_model(name, __base__=base, **ignored, **_settings_fields())
    model.honoured = frozenset(IGNORED) & set(base.model_fields)
    return model


Stop = str | list[str] | None


class _Generation(_Body):
    """Fields every generation endpoint shares (llama-server takes them on all of them)."""

    n_predict: int | None = Field(None, ge=-1, description="tokens to generate; -1 = until end of text or the "
                                                           "context is full (wins over max_tokens)")
    stop: Stop = None
    stream: bool = False
    cache_prompt: bool = Field(True, description="reuse the KV caches' common prefix with the prompt; false: "
                                                 "process the whole prompt again")
    n_keep: int = Field(0, ge=-1, description="a prompt too long for the context keeps its first n_keep tokens "
                                              "and loses a middle part (llama-server's truncation; -1: as many as "
                                              "fit); 0 = a too-long prompt is refused")
    n_discard: int = Field(0, ge=0, description="with --context-shift, the tokens a text that fills the context "
                                                "drops after its first n_keep (0 = half of the rest)")
    id_slot: int = Field(-1, ge=-1, description="the slot to run in (-np/--parallel slots; -1 = the first free one)")
    return_tokens: bool = Field(False, description="add the generated token ids (tokens)")
    timings_per_token: bool = Field(False, description="streaming: put timings in every chunk")
    return_progress: bool = Field(False, description="streaming: before the first token, a prompt_progress report "
                                                     "per batch of the prompt (total, cache, processed, time_ms)")


GenerationBody = _Generation  # what every generation endpoint's body is


class _Completion(_Generation):
    """llama-server's ``POST /completion``."""

    prompt: str | list[Any] | dict[str, Any] = Field(description="a string, token ids, ids mixed with strings, "
                                                     "{prompt_string}, or a list of such prompts (one answer each)")
    response_fields: list[str] | None = Field(None, description="answer only these fields of the result "
                                                                "(\"a/b\": field b of a)")
    max_tokens: int | None = Field(None, ge=-1, description="llama-server's alias of n_predict")
    n_probs: int = Field(0, ge=0, le=MAX_N_PROBS, description="the target's top-n log-probabilities with "
                                                              "every generated token, streamed per token")
    post_sampling_probs: bool = Field(False, description="n_probs as probabilities after the sampler chain "
                                                         "(prob, top_probs)")


class _OpenAI(_Generation):
    model: str | None = Field(None, description="accepted; the served pair answers whatever the name")
    response_format: dict[str, Any] | None = Field(None, description="{type: text | json_object | json_schema}: "
                                                   "the answer follows it (docs/structured-output.md)")
    max_tokens: int | None = Field(None, ge=-1, description="tokens to generate; unset or -1 = until end of text "
                                                            "or the context is full")
    stream_options: dict[str, Any] | None = Field(None, description="include_usage: usage in one more chunk, with "
                                                                   "no choices (else in the last chunk)")
    n: int = Field(1, ge=1, le=16, description="choices, generated one after another (answered whole)")
    user: str | None = None
    verbose: bool | None = Field(None, description="add __verbose: /completion's answer, the prompt as the model "
                                                   "read it included (default: the server's --verbose)")


class _TextCompletion(_OpenAI):
    prompt: str | list[int]
    logprobs: int | None = Field(None, ge=0, le=MAX_N_PROBS, description="the target's top-n log-probabilities "
                                                                         "per token (OpenAI's legacy shape)")


class _ChatCompletion(_OpenAI):
    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = Field(None, ge=-1, description="the newer name of max_tokens")
    logprobs: bool = Field(False, description="the target's log-probability of every generated token")
    top_logprobs: int | None = Field(None, ge=0, le=MAX_N_PROBS, description="and its n most likely tokens")
    chat_template_kwargs: dict[str, Any] | None = Field(None, description="extra variables for the chat template")
    reasoning_effort: str | None = Field(None, description="passed to the chat template (templates that read it "
                                                           "use it); none: enable_thinking false")
    tools: list[Any] | None = Field(None, description="OpenAI's tools: functions the answer may call "
                                                      "(docs/structured-output.md)")
    tool_choice: str | dict[str, Any] | None = Field(None, description="auto, none, required, or "
                                                     "{type: function, function: {name}}")
    parallel_tool_calls: bool | None = Field(None, description="let the answer make several calls (default false)")
    reasoning_format: str | None = Field(None, description="auto | deepseek: <think> goes to reasoning_content; "
                                                           "none: it stays in the content (default: the server's)")
    add_generation_prompt: bool = Field(True, description="/apply-template: end the prompt with the opening of the "
                                                          "assistant's turn")
    continue_final_message: bool = Field(False, description="continue the last (assistant's) message: with "
                                         "add_generation_prompt false; a final assistant message is continued anyway")


CompletionRequest = _body("CompletionRequest", _Completion)
TextCompletionRequest = _body("TextCompletionRequest", _TextCompletion)
ChatCompletionRequest = _body("ChatCompletionRequest", _ChatCompletion)


class TokenizeRequest(_Body):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_Body):
    tokens: list[int]


def logit_bias(raw: dict[str, Any] | list[Any] | None, tokenize: Callable[[str], list[int]]) -> tuple[tuple[int, float], ...] | None:
    """llama-server's and OpenAI's logit_bias as (token, bias) pairs. Shapes: OpenAI's
    ``{"15043": 1.5}`` (llama-server also takes text keys there: ``{"Hello": -1}``);
    llama-server's ``[[15043, 1.5], ["Hello", -1], [2, false]]`` (a string biases each of its
    tokens; false bans the token). Values are numbers, false, or "-inf"."""
    if raw is None:
        return None
    items = list(raw.items()) if isinstance(raw, dict) else raw
    out: list[tuple[int, float]] = []
    for item in items:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise FlyError(f"logit_bias entries must be [token, bias] pairs, got {item!r}")
        token, bias = item
        if bias is False or bias in ("-inf", "-Infinity"):
            bias = -math.inf
        elif isinstance(bias, bool) or not isinstance(bias, (int, float)):
            raise FlyError(f"logit_bias: the bias of {token!r} must be a number or false, got {bias!r}")
        if isinstance(raw, dict) and token.strip().lstrip("-").isdigit():  # OpenAI: ids written as strings
            ids = [int(token)]
        elif isinstance(token, str):  # llama-server: text, each of its tokens biased
            ids = tokenize(token)
        elif isinstance(token, int) and not isinstance(token, bool):
            ids = [token]
        else:
            raise FlyError(f"logit_bias: a token must be an id or a string, got {token!r}")
        out += [(t, float(bias)) for t in ids]
    return tuple(out)


def settings_dict(*settings: Any) -> dict[str, Any]:
    """Settings dataclasses as one JSON-safe dict (infinity as "inf", as requests accept it)."""
    out: dict[str, Any] = {}
    for s in settings:
        for name, value in dataclasses.asdict(s).items():
            if name == "logit_bias":
                value = [[t, "-inf" if math.isinf(b) else b] for t, b in value]
            out[name] = "inf" if isinstance(value, float) and math.isinf(value) else value
    return out
