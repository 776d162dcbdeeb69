"""Chat formats: built-in templates, GGUF templates rendered like llama.cpp --jinja, message
checks (no model needed)."""

from __future__ import annotations

import pytest

from fly_cpp.chat_format import ChatFormat, builtin, check_messages, resolve
from fly_cpp.errors import FlyError

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]


def test_builtins():
    assert builtin("chatml").render(CHAT[1:2]) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    plain = builtin("plain")
    assert plain.render(CHAT) == "Be brief.\n\nUser: Hi\nAssistant: Hello.\nUser: Bye\nAssistant:"
    assert plain.stop == ("\nUser:",) and builtin("chatml").stop == ("<|im_end|>",)
    with pytest.raises(FlyError, match="unknown chat format"):
        builtin("llama9")


def test_resolve_prefers_the_argument_then_the_gguf_template():
    gguf = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert resolve(None, gguf, bos_token="<s>").render(CHAT[1:2]) == "<s>Hi"
    assert resolve("chatml", gguf).name == "chatml"
    assert resolve(None, None).name == "plain"
    assert resolve("{{ messages | length }}", gguf).render(CHAT) == "4"
    with pytest.raises(FlyError, match="unknown chat format"):
        resolve("no-such-format", gguf)


def test_prefix_property_for_multi_turn_cache_reuse():
    for fmt in (builtin("plain"), builtin("chatml")):
        first = fmt.render(CHAT[:2], add_generation_prompt=True)
        assert fmt.render(CHAT, add_generation_prompt=True).startswith(first)


def test_template_helpers_and_errors():
    fmt = ChatFormat("{{ messages | tojson }}{% generation %}x{% endgeneration %}")
    assert fmt.render([{"role": "user", "content": "é"}]) == '[{"role": "user", "content": "é"}]x'
    with pytest.raises(FlyError, match="refused the messages: no"):
        ChatFormat("{{ raise_exception('no') }}").render(CHAT)
    with pytest.raises(FlyError, match="not valid Jinja"):
        ChatFormat("{% for %}")


def test_check_messages():
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert check_messages(parts)[0]["content"] == "ab"
    with pytest.raises(FlyError, match="messages is empty"):
        check_messages([])
    with pytest.raises(FlyError, match="role must be one of"):
        check_messages([{"role": "robot", "content": "x"}])
    with pytest.raises(FlyError, match="only text content parts"):
        check_messages([{"role": "user", "content": [{"type": "image_url"}]}])
    with pytest.raises(TypeError, match="messages must be a list"):
        check_messages("hi")  # type: ignore[arg-type]
