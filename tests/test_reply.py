"""Splitting a chat answer into reasoning_content, content and tool_calls (fly_cpp.api.reply),
whole and as streamed deltas."""

from __future__ import annotations

import json

import pytest

from fly_cpp.api.reply import Options, Splitter, split
from fly_cpp.api.tool_formats import detect

TOOLS = Options(calls=detect("<tool_call>"), names=("pet",))
CALL = '<tool_call>\n{"name": "pet", "arguments": {"kind": "cat"}}\n</tool_call>'


def test_plain_text_is_content_without_leading_whitespace():
    got = split("  Hello there ", Options())
    assert (got.content, got.reasoning, got.calls) == ("Hello there ", None, [])
    assert got.message() == {"role": "assistant", "content": "Hello there "}


def test_think_block_goes_to_reasoning_content():
    got = split("<think>\nLet me see.\n</think>\n\nIt is 4.", Options())
    assert (got.reasoning, got.content) == ("Let me see.", "It is 4.")
    assert split("<think>\nLet me see.\n</think>It is 4.", Options(reasoning=False)).content.startswith("<think>")
    # the prompt opened the block; an answer cut inside it is all reasoning
    assert split("Hmm.</think>Four.", Options(think_open=True)).reasoning == "Hmm."
    assert split("<think>still thinking", Options()).content == ""


def test_tool_calls_are_parsed_and_content_is_null():
    got = split(CALL + "\n" + CALL.replace("cat", "dog"), TOOLS)
    assert got.content == "" and [json.loads(c["function"]["arguments"]) for c in got.calls] == [
        {"kind": "cat"}, {"kind": "dog"}]
    msg = got.message()
    assert msg["content"] is None and msg["tool_calls"][0]["type"] == "function"
    assert msg["tool_calls"][0]["id"].startswith("call_") and msg["tool_calls"][0]["function"]["name"] == "pet"
    assert split("Sure. " + CALL, TOOLS).content == "Sure."
    assert split(CALL, Options()).calls == []  # tool_choice none: nothing parsed
    assert split("<tool_call>not json</tool_call>", TOOLS).content == "<tool_call>not json</tool_call>"


@pytest.mark.parametrize("text,opts", [
    ("Hello there, friend.", Options()),
    ("  <think>a < b?\n</think>\n\nYes: " + CALL, TOOLS),
    ("Let me call it.\n\n" + CALL + "\n" + CALL, TOOLS),
    ("I think <tool the answer", TOOLS),
    ("Why.</think>Because.", Options(think_open=True)),
    ("<thin>no tag", Options()),
])
def test_streamed_deltas_join_to_the_whole_split(text, opts):
    for size in (1, 3, 7):
        s = Splitter(opts)
        reasoning = content = ""
        for i in range(0, len(text), size):
            delta = s.feed(text[i:i + size])
            reasoning += delta.get("reasoning_content", "")
            content += delta.get("content", "")
        last, whole = s.finish()
        reasoning += last.get("reasoning_content", "")
        content += last.get("content", "")
        want = split(text, opts)
        assert (reasoning, content) == (want.reasoning or "", want.content)
        assert [c["function"] for c in whole.calls] == [c["function"] for c in want.calls]
