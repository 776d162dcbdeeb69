"""The shapes a ``/completion`` prompt may take, as llama-server reads them.

One prompt: a string; a list of token ids; a list mixing ids and strings (each string
tokenized in place, the first with BOS); an object ``{"prompt_string": ...}`` (llama-server's
multimodal shape; ``multimodal_data`` is refused: text only). Several prompts: a list of those
(strings, token lists, objects) that holds no bare id; each gets an answer of its own.
"""

from __future__ import annotations

from typing import Any

from fly_cpp.api.fly import Fly
from fly_cpp.basics.errors import FlyError

SHAPES = ("a prompt must be a string, a list of token ids, a list mixing ids and strings, or an object with "
          "prompt_string")


def _is_id(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def split(prompt: Any) -> list[Any]:
    """The prompts a request's ``prompt`` holds (one, or several)."""
    if isinstance(prompt, list) and prompt and not any(_is_id(x) for x in prompt):
        return list(prompt)
    return [prompt]


def tokens(fly: Fly, prompt: Any) -> list[int]:
    """One prompt's tokens (a string gets the model's BOS, as ``Fly.tokenize`` adds it)."""
    if isinstance(prompt, str):
        return fly.tokenize(prompt)
    if isinstance(prompt, dict):
        if prompt.get("multimodal_data"):
            raise FlyError("multimodal_data: this server takes text only")
        if "prompt_string" not in prompt:
            raise FlyError(SHAPES)
        return tokens(fly, prompt["prompt_string"])
    if not isinstance(prompt, list) or not all(_is_id(x) or isinstance(x, str) for x in prompt):
        raise FlyError(SHAPES)
    out: list[int] = []
    for i, part in enumerate(prompt):
        if isinstance(part, str):
            out += fly.tokenize(part) if i == 0 else fly.tokenize(part, add_special=False, parse_special=True)
        else:
            out.append(part)
    return out
