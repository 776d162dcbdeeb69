"""The Python API samples as llama-cpp-python's ``Llama`` does: its completions at 0.8 (llama.cpp's
chain), its chat completions at 0.2, unless the instance or the call says otherwise. Real
contexts on the bundled pair."""

from __future__ import annotations

from typing import Any

import pytest

from fly_cpp import Fly
from fly_cpp.engine.generation import Generation


def _temperatures(llm: Fly, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    seen: list[float] = []
    generate = llm.engine.generate

    def spy(*args: Any, **kwargs: Any) -> Generation:
        seen.append(kwargs["sampling"].temperature)
        return generate(*args, **kwargs)

    monkeypatch.setattr(llm.engine, "generate", spy)
    return seen


def test_completions_and_chat_completions_default_as_llama_cpp_python(monkeypatch: pytest.MonkeyPatch) -> None:
    messages = [{"role": "user", "content": "Tell me a story"}]
    with Fly() as llm:
        seen = _temperatures(llm, monkeypatch)
        llm.create_completion("Once upon a time", max_tokens=4)
        llm.create_chat_completion(messages, max_tokens=4)
        llm.create_chat_completion(messages, max_tokens=4, temperature=0.7)
        assert seen == [0.8, 0.2, 0.7]
        texts = {llm.create_completion("Once upon a time", max_tokens=32)["choices"][0]["text"] for _ in range(4)}
        assert len(texts) > 1  # a fresh seed each call
        a, b = (llm.create_completion("Once upon a time", max_tokens=24, seed=4)["choices"][0]["text"] for _ in range(2))
        assert a == b
    with Fly(temperature=0) as llm:  # the instance's setting holds for both shapes
        seen = _temperatures(llm, monkeypatch)
        llm.create_chat_completion(messages, max_tokens=4)
        llm.create_completion("Once upon a time", max_tokens=4)
        assert seen == [0.0, 0.0]
