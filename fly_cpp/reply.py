"""A chat answer's text split the way OpenAI clients read it: ``reasoning_content`` (a reasoning
model's ``<think>...</think>``), ``content``, and ``tool_calls`` (Hermes-style
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, as Qwen2.5/3.x templates
ask for them), whole (``split``) or as the text grows (``Splitter``, for streamed deltas).

How a reasoning block is found, as llama-server's ``--reasoning-format deepseek`` finds it: the
answer starts with ``<think>`` (after whitespace), or the prompt already opened it
(``think_open``: the template's generation prompt ends with ``<think>``); the block ends at
``</think>``. An answer cut inside it is all reasoning. A ``<tool_call>`` block whose body is not
a JSON object with a string ``name`` stays in the content.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

THINK, END_THINK = "<think>", "</think>"
CALL, END_CALL = "<tool_call>", "</tool_call>"
_CALL_RE = re.compile(re.escape(CALL) + r"\s*(.*?)\s*" + re.escape(END_CALL), re.S)


@dataclass(frozen=True)
class Options:
    """``reasoning``: split ``<think>`` blocks off (llama-server's deepseek format; False: its
    ``none``); ``tools``: parse tool calls; ``think_open``: the prompt opened the block."""

    reasoning: bool = True
    tools: bool = False
    think_open: bool = False


@dataclass
class Reply:
    content: str
    reasoning: str | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)

    def message(self) -> dict[str, Any]:
        """The assistant message of a ``chat.completion`` (content null beside tool calls)."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content or (None if self.calls else "")}
        if self.reasoning:  # as llama-server: an empty block adds nothing
            out["reasoning_content"] = self.reasoning
        if self.calls:
            out["tool_calls"] = self.calls
        return out


def _think(text: str, opts: Options) -> tuple[str | None, str, bool]:
    """(reasoning, the rest, whether the reasoning block is closed)."""
    if not opts.reasoning:
        return None, text, True
    body = text
    if not opts.think_open:
        stripped = text.lstrip()
        if not stripped.startswith(THINK):
            return None, text, True
        body = stripped[len(THINK):]
    end = body.find(END_THINK)
    if end < 0:
        return body.strip(), "", False
    return body[:end].strip(), body[end + len(END_THINK):], True


def call(body: str) -> dict[str, Any] | None:
    """One ``<tool_call>`` body as an OpenAI tool call (None: not a call)."""
    try:
        got = json.loads(body)
    except ValueError:
        return None
    if not isinstance(got, dict) or not isinstance(got.get("name"), str):
        return None
    args = got.get("arguments", got.get("parameters", {}))
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": got["name"], "arguments": text}}


def split(text: str, opts: Options) -> Reply:
    """The whole answer, split."""
    reasoning, rest, _ = _think(text, opts)
    calls: list[dict[str, Any]] = []
    if opts.tools:
        kept = []
        at = 0
        for m in _CALL_RE.finditer(rest):
            if (found := call(m.group(1))) is None:
                continue
            calls.append(found)
            kept.append(rest[at:m.start()])
            at = m.end()
        rest = "".join(kept) + rest[at:]
    content = rest.strip() if calls or reasoning is not None else rest.lstrip()
    return Reply(content, reasoning, calls)


def _partial_tail(text: str, word: str) -> int:
    """The length of the longest end of ``text`` that begins ``word`` (held back while streaming)."""
    for n in range(min(len(word) - 1, len(text)), 0, -1):
        if word.startswith(text[-n:]):
            return n
    return 0


class Splitter:
    """The deltas of a growing answer: ``feed(piece)`` gives the new ``reasoning_content`` and
    ``content`` text that can no longer change; ``finish()`` the rest and the tool calls.
    Joined, the deltas are ``split(text)``'s fields."""

    def __init__(self, opts: Options) -> None:
        self.opts, self.text = opts, ""
        self.sent_reasoning = self.sent_content = ""

    def _stable(self) -> tuple[str, str]:
        text = self.text
        if self.opts.reasoning and not self.opts.think_open:
            s = text.lstrip()
            if len(s) < len(THINK) and THINK.startswith(s):
                return "", ""  # may yet open a reasoning block
        reasoning, rest, closed = _think(text, self.opts)
        if not closed:
            assert reasoning is not None
            body = text.lstrip()[len(THINK):] if not self.opts.think_open else text
            body = body[: len(body) - _partial_tail(body, END_THINK)]
            return body.strip(), ""
        content = rest if reasoning is None else rest.lstrip()
        if self.opts.tools:
            at = content.find(CALL)
            content = content[:at] if at >= 0 else content[: len(content) - _partial_tail(content, CALL)]
        if self.opts.tools or reasoning is not None:  # split() strips both ends then
            content = content.rstrip()
        return reasoning or "", content.lstrip()

    def feed(self, piece: str) -> dict[str, str]:
        self.text += piece
        reasoning, content = self._stable()
        return self._delta(reasoning, content)

    def _delta(self, reasoning: str, content: str) -> dict[str, str]:
        out = {}
        if reasoning.startswith(self.sent_reasoning) and len(reasoning) > len(self.sent_reasoning):
            out["reasoning_content"] = reasoning[len(self.sent_reasoning):]
            self.sent_reasoning = reasoning
        if content.startswith(self.sent_content) and len(content) > len(self.sent_content):
            out["content"] = content[len(self.sent_content):]
            self.sent_content = content
        return out

    def finish(self) -> tuple[dict[str, str], Reply]:
        """The last text deltas, and the whole reply (its ``calls`` are sent as deltas)."""
        reply = split(self.text, self.opts)
        return self._delta(reply.reasoning or "", reply.content), reply


def call_deltas(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool calls as ``delta.tool_calls`` entries (each whole, with its ``index``)."""
    return [{"index": i, **c} for i, c in enumerate(calls)]
