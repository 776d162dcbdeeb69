"""Chat formats: built-in templates, GGUF templates rendered like llama.cpp --jinja, message
checks (no model needed)."""

from __future__ import annotations

import pytest

from fly_cpp.api.chat_format import BUILTIN, ChatFormat, builtin, check_messages, continued, is_builtin, resolve
from fly_cpp.basics.errors import FlyError

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


def test_family_builtins_render_as_their_models_expect():
    assert builtin("llama-3").render(CHAT[:2]) == (
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    assert builtin("mistral-instruct", eos_token="</s>").render(CHAT) == (
        "[INST] Be brief.\n\nHi [/INST]Hello.</s>[INST] Bye [/INST]")  # no system role: it opens the first turn
    assert builtin("gemma").render(CHAT[1:2]) == "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    assert builtin("gemma").render(CHAT[:2]).startswith("<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>")
    assert builtin("phi-3").render(CHAT[:2]) == "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n"
    assert builtin("llama-3").stop == ("<|eot_id|>",) and builtin("gemma").stop == ("<end_of_turn>",)
    assert builtin("phi-3").stop == ("<|end|>",)
    assert builtin("command-r").render(CHAT[:2]) == (  # llama.cpp's --chat-template command-r
        "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>Be brief.<|END_OF_TURN_TOKEN|>"
        "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")
    # the names as llama.cpp and llama-cpp-python users spell them
    assert builtin("llama3").name == "llama-3" and builtin("Phi3").name == "phi-3" and is_builtin("mistral_instruct")
    assert resolve("gemma", "{{ 'the GGUF template' }}").name == "gemma"  # a chosen format beats the GGUF's


def test_prefix_property_for_multi_turn_cache_reuse():
    for fmt in (builtin(name, bos_token="<s>", eos_token="</s>") for name in BUILTIN):
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
    assert check_messages(parts)[0]["content"] == "a\nb"  # a line each, as llama-server joins them
    with pytest.raises(FlyError, match="messages is empty"):
        check_messages([])
    with pytest.raises(FlyError, match="role must be one of"):
        check_messages([{"role": "robot", "content": "x"}])
    with pytest.raises(FlyError, match="only text content parts"):
        check_messages([{"role": "user", "content": [{"type": "image_url"}]}])
    with pytest.raises(TypeError, match="messages must be a list"):
        check_messages("hi")  # type: ignore[arg-type]


def test_todays_date_as_llama_cpp_gives_it():
    from datetime import datetime

    fmt = ChatFormat("{{ date_string }}|{{ datetime }}")
    today = datetime.now()
    assert fmt.render([{"role": "user", "content": "x"}]) == f"{today:%d %b %Y}|{today:%b %d %Y}"
    assert fmt.render([{"role": "user", "content": "x"}], date_string="1 Jan 2025").startswith("1 Jan 2025|")


def test_a_final_assistant_message_is_continued():
    assert continued(CHAT) is None and continued(CHAT[:1]) is None
    assert continued(CHAT[:3]) == "Hello."
    parts = {"role": "assistant", "content": [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]}
    assert continued([CHAT[1], parts]) == "Wh\n\nill"  # as llama-server joins a continued message's parts
    assert continued([CHAT[1], {"role": "assistant", "content": None, "tool_calls": [{}]}]) is None
    with pytest.raises(FlyError, match="two assistant messages"):
        continued([*CHAT[:3], {"role": "assistant", "content": "again"}])


def test_an_undefined_variable_joined_to_text_is_empty_text():
    # llama.cpp's Jinja: firefunction-v2's template adds a ``functions`` variable only its caller fills
    fmt = ChatFormat("{{ 'Tools:' + functions + '.' }}{{ functions ~ '!' }}", "", "", (), "custom")
    assert fmt.render(CHAT[1:2]) == "Tools:.!"
    with pytest.raises(FlyError, match="failed"):
        ChatFormat("{{ functions.name + 1 }}", "", "", (), "custom").render(CHAT[1:2])
