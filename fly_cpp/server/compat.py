"""Fields fly-cpp accepts without acting on them, and what happens to fields it does not know.

Apps written for llama-server or the OpenAI API send more than fly-cpp uses (llama.cpp's web
UI sends its whole sampler configuration on every request). Like llama-server, fly-cpp ignores
what it does not use instead of refusing the request: each such field name is logged once (a
warning naming the field and why), and ``/props`` lists them. ``--strict`` refuses them (HTTP
400 naming the field), for those who want to know. A field given its neutral value (the one
that changes nothing, e.g. ``mirostat: 0``) is not "ignored": it is simply honoured.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from fly_cpp.basics.errors import FlyError

log = logging.getLogger("fly_cpp.server")

ANY = object()  # a field with no effect whatever its value (it only tunes another, ignored one)


@dataclass(frozen=True)
class Rule:
    why: str
    neutral_values: tuple[Any, ...] | object | Callable[[Any], bool] = (None,)

    def neutral(self, value: Any) -> bool:
        """Whether ``value`` changes nothing (false is not 0 here)."""
        if self.neutral_values is ANY:
            return True
        if callable(self.neutral_values):
            return bool(self.neutral_values(value))
        return any(isinstance(value, bool) == isinstance(n, bool) and value == n
                   for n in self.neutral_values)  # type: ignore[union-attr]


def _same_chain(samplers: Any) -> bool:
    """A llama.cpp sampler order that runs fly-cpp's samplers (top-k, top-p, min-p, temperature)
    in fly-cpp's order; the others it names are ignored on their own fields."""
    if samplers is None:
        return True
    if isinstance(samplers, str):
        names = list(samplers)
        want = ["k", "p", "m", "t"]
    elif isinstance(samplers, list) and all(isinstance(n, str) for n in samplers):
        names = [n.replace("-", "_") for n in samplers]
        want = ["top_k", "top_p", "min_p", "temperature"]
    else:
        return False
    found = [n for n in names if n in want]
    return found == want


_SAMPLER = "a llama.cpp sampler fly-cpp does not implement (its chain: penalties, top-k, top-p, min-p, temperature)"
_TUNES = "tunes a sampler fly-cpp does not implement"

IGNORED: dict[str, Rule] = {
    # llama-server's samplers
    "typical_p": Rule(_SAMPLER, (None, 1, 1.0)),
    "mirostat": Rule(_SAMPLER, (None, 0)),
    "mirostat_tau": Rule(_TUNES, ANY),
    "mirostat_eta": Rule(_TUNES, ANY),
    "dynatemp_range": Rule(_SAMPLER, (None, 0, 0.0)),
    "dynatemp_exponent": Rule(_TUNES, ANY),
    "dry_multiplier": Rule(_SAMPLER, (None, 0, 0.0)),
    "dry_base": Rule(_TUNES, ANY),
    "dry_allowed_length": Rule(_TUNES, ANY),
    "dry_penalty_last_n": Rule(_TUNES, ANY),
    "dry_sequence_breakers": Rule(_TUNES, ANY),
    "xtc_probability": Rule(_SAMPLER, (None, 0, 0.0)),
    "xtc_threshold": Rule(_TUNES, ANY),
    "top_n_sigma": Rule(_SAMPLER, (None, -1, -1.0, 0, 0.0)),
    "tfs_z": Rule(_SAMPLER, (None, 1, 1.0)),
    "adaptive_target": Rule(_SAMPLER, (None, -1, -1.0)),
    "adaptive_decay": Rule(_TUNES, ANY),
    "min_keep": Rule("samplers keep at least one token", (None, 0, 1)),
    "penalize_nl": Rule("penalties apply to every token alike", ANY),
    "samplers": Rule("fly-cpp's sampler chain has a fixed order (penalties, top-k, top-p, min-p, temperature)",
                     _same_chain),
    # OpenAI's legacy function calling (tools, tool_choice, grammar, json_schema and response_format
    # are enforced: docs/structured-output.md)
    "functions": Rule("the legacy functions API: send tools", (None, [])),
    "function_call": Rule("the legacy functions API: send tool_choice", (None, "none", "auto")),
    # llama-server's slots, extras and multimodal inputs
    "post_sampling_probs": Rule("probabilities are the target's raw distribution here (/completion gives them "
                                "after the sampler chain)", (None, False)),
    "t_max_predict_ms": Rule("no time limit on generation (use n_predict)", (None, 0)),
    "t_max_prompt_ms": Rule("no time limit on prompt processing", (None, 0, -1)),
    "n_indent": Rule("no indentation stop", (None, 0)),
    "n_cmpl": Rule("one completion per request", (None, 1)),
    "api_key": Rule("the key goes in the Authorization header", ANY),
    "slot_id": Rule("fly-cpp has one slot (llama-server's older name of id_slot)", (None, -1, 0)),
    "lora": Rule("no LoRA adapters", (None, [])),
    "image_data": Rule("text only: no multimodal input", (None, [])),
    "multimodal_data": Rule("text only: no multimodal input", (None, [])),
    "input_extra": Rule("no infill", (None, [])),
    "response_fields": Rule("the whole response is sent (/completion honours it)", (None, [])),
    # OpenAI's
    "echo": Rule("the prompt is not repeated in the answer", (None, False)),
    "best_of": Rule("one candidate per request", (None, 1)),
    "suffix": Rule("no insertion (infill)", (None, "")),
    "metadata": Rule("nothing is stored", ANY),
    "store": Rule("nothing is stored", (None, False)),
    "service_tier": Rule("one tier", ANY),
    "modalities": Rule("text only", (None, ["text"])),
    "audio": Rule("text only", (None,)),
    "prediction": Rule("no predicted outputs (drafting already speculates)", (None,)),
    "web_search_options": Rule("no web search", (None,)),
    "verbosity": Rule("no verbosity control", ANY),
    "prompt_cache_key": Rule("prompt caching is automatic (cache_prompt)", ANY),
    "safety_identifier": Rule("accepted for compatibility", ANY),
}

# those samplers as generation settings report them (llama-server lists every sampler): switched off
OFF: dict[str, Any] = {"typical_p": 1.0, "mirostat": 0, "dynatemp_range": 0.0, "dry_multiplier": 0.0,
                       "xtc_probability": 0.0, "top_n_sigma": -1.0, "adaptive_target": -1.0, "adaptive_decay": 0.9}


class HasUnused(Protocol):
    """A request body as this module reads it (the models in ``fields`` are such bodies)."""

    def unused(self) -> dict[str, Any]: ...

class Compat:
    """What one app does with unused fields: refuse them (``strict``) or log each name once."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self._lock = threading.Lock()
        self.seen: dict[str, str] = {}  # name -> why it was ignored, in order of first sight

    def check(self, body: HasUnused, where: str) -> None:
        unused = body.unused()
        if not unused:
            return
        if self.strict:
            name = next(iter(unused))
            rule = IGNORED.get(name)
            what = f"field {name!r} is not supported: {rule.why}" if rule is not None else f"unknown field {name!r}"
            raise FlyError(f"{what} (the server runs with --strict)")
        with self._lock:
            new = [n for n in unused if n not in self.seen]
            for name in new:
                rule = IGNORED.get(name)
                self.seen[name] = rule.why if rule is not None else "unknown field"
        for name in new:
            log.warning("ignoring request field %r (first seen on %s): %s", name, where, self.seen[name])
