"""A chat answer's text split the way OpenAI clients read it: ``reasoning_content`` (a reasoning
model's ``<think>...</think>``), ``content``, and ``tool_calls`` (written in the template's
format: ``fly_cpp.api.tool_formats``), whole (``split``) or as the text grows (``Splitter``, for
streamed deltas).

How a reasoning block is found, as llama-server's ``--reasoning-format deepseek`` finds it: the
answer starts with ``<think>`` (after whitespace), or the prompt already opened it
(``think_open``: the template's generation prompt ends with ``<think>``); the block ends at
``</think>``. An answer cut inside it is all reasoning. Text that starts a call but is none
(a ``<tool_call>`` block whose body is not a JSON object with a string ``name``) stays in the
content.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fly_cpp.api.tool_formats import Format, partial_tail

THINK, END_THINK = "<think>", "</think>"


@dataclass(frozen=True)
class Options:
    """``reasoning``: split ``<think>`` blocks off (llama-server's deepseek format; False: its
    ``none``); ``calls``: parse tool calls written in this format; ``names``: the functions
    given; ``think_open``: the prompt opened the block."""

    reasoning: bool = True
    calls: Format | None = None
    names: tuple[str, ...] = ()
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


def split(text: str, opts: Options) -> Reply:
    """The whole answer, split."""
    reasoning, rest, _ = _think(text, opts)
    calls: list[dict[str, Any]] = []
    if opts.calls is not None:
        rest, calls = opts.calls.split(rest, opts.names)
    content = rest.strip() if calls or reasoning is not None else rest.lstrip()
    return Reply(content, reasoning, calls)


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
            body = body[: len(body) - partial_tail(body, END_THINK)]
            return body.strip(), ""
        content = rest if reasoning is None else rest.lstrip()
        if self.opts.calls is not None:
            content = content[: self.opts.calls.held(content, self.opts.names)]
        if self.opts.calls is not None or reasoning is not None:  # split() strips both ends then
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
