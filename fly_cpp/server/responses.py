"""OpenAI's Responses API: ``POST /v1/responses`` (``stream: true`` as its named SSE events) and
``POST /v1/responses/input_tokens``; with them ``POST /chat/completions/input_tokens``.

A thin adapter, as llama-server's: ``input`` (a string, or a list of items: messages,
``function_call``, ``function_call_output``, ``reasoning``) and ``instructions`` become a chat
body's messages, ``max_output_tokens`` its ``max_tokens``, the other fields pass as they are;
the chat endpoint's path generates, and OpenAI's chat shape (``fly_cpp.api.oai``) is turned into a
``response`` with ``output`` items. Streams carry ``timings`` on their last event (and on every
delta with ``timings_per_token``); ``return_progress`` adds a ``response.in_progress`` event
with a ``prompt_progress`` report (``total``, ``cache``, ``processed``, ``time_ms``) per batch
of the prompt, as the chat stream reports them.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from fly_cpp.api import oai
from fly_cpp.basics.errors import FlyError
from fly_cpp.engine.generation import Generation
from fly_cpp.server import sse
from fly_cpp.server.compat import Compat
from fly_cpp.server.fields import ChatCompletionRequest
from fly_cpp.server.oai import answer, chat_body, chat_generation, prompt_tokens
from fly_cpp.server.prepare import Defaults
from fly_cpp.server.runs import Runs
from fly_cpp.server.served import Served
from fly_cpp.server.timings import timings

Chunk = dict[str, Any]
ROLES = {"developer": "system"}  # the Responses role -> the chat template's


def router(served: Served, runs: Runs, compat: Compat, n_predict: int = -1,
           defaults: Defaults = Defaults()) -> APIRouter:
    r = APIRouter()

    @r.post("/v1/responses")
    @r.post("/responses")
    async def responses(body: dict[str, Any], request: Request) -> Response:
        progress = body.get("return_progress") is True
        chat = chat_body(to_chat({k: v for k, v in body.items() if k != "return_progress"}))
        fly, prepared = await chat_generation(served, compat, chat, "/v1/responses", n_predict, defaults)
        gen, reading = prepared.gen, prepared.reading
        ids = Ids()
        top = oai.head("chat.completion", fly.model)
        return await answer(runs, request, gen, chat.stream,
                            lambda: oai.chat_chunks(gen, top, opts=reading, progress=progress),
                            lambda: response(oai.chat_completion(gen, top, opts=reading), gen, ids, fly.model),
                            lambda items: _events(items, gen, ids, fly.model, chat.timings_per_token),
                            after_error=b"")

    async def count(chat: Any, where: str) -> dict[str, Any]:
        return {"object": "response.input_tokens",
                "input_tokens": await prompt_tokens(served, compat, chat, where, defaults)}

    @r.post("/v1/responses/input_tokens")
    @r.post("/responses/input_tokens")
    async def responses_input_tokens(body: dict[str, Any]) -> dict[str, Any]:
        return await count(chat_body(to_chat(body)), "/v1/responses/input_tokens")

    @r.post("/v1/chat/completions/input_tokens")
    @r.post("/chat/completions/input_tokens")
    async def chat_input_tokens(body: ChatCompletionRequest) -> dict[str, Any]:  # type: ignore[valid-type]
        return await count(body, "/chat/completions/input_tokens")

    return r


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses body as an OpenAI chat body (llama-server's conversion)."""
    if "input" not in body:
        raise FlyError("'input' is required")
    if body.get("previous_response_id"):
        raise FlyError("previous_response_id is not supported: nothing is stored, send the whole conversation")
    chat = {k: v for k, v in body.items() if k not in ("input", "instructions", "max_output_tokens", "tools")}
    messages: list[dict[str, Any]] = []
    if "instructions" in body:
        messages.append({"role": "system", "content": body["instructions"]})
    given = body["input"]
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        for item in given:
            _item(item, messages)
    else:
        raise FlyError("'input' must be a string or a list of items")
    chat["messages"] = messages
    if isinstance(body.get("tools"), list):
        chat["tools"] = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
                         for t in body["tools"] if isinstance(t, dict) and t.get("type") == "function"]
    if "max_output_tokens" in body:
        chat["max_tokens"] = body["max_output_tokens"]
    return chat


def _item(item: Any, out: list[dict[str, Any]]) -> None:
    if not isinstance(item, dict):
        raise FlyError("input items must be objects")
    kind, role = item.get("type"), item.get("role")
    after_assistant = bool(out) and out[-1]["role"] == "assistant"
    if kind == "function_call":
        call = {"id": item.get("call_id", ""), "type": "function",
                "function": {"name": item.get("name", ""), "arguments": item.get("arguments", "")}}
        if after_assistant:
            out[-1].setdefault("tool_calls", []).append(call)
        else:
            out.append({"role": "assistant", "content": "", "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output", "")
        out.append({"role": "tool", "tool_call_id": item.get("call_id", ""),
                    "content": output if isinstance(output, str) else _text(output)})
    elif kind == "reasoning":
        text = _text(item.get("content") or [])
        if after_assistant:
            out[-1]["reasoning_content"] = text
        else:
            out.append({"role": "assistant", "content": "", "reasoning_content": text})
    elif role in ("user", "system", "developer", "assistant"):
        content = item.get("content", "")
        text = content if isinstance(content, str) else _text(content)
        if role == "assistant" and after_assistant:
            out[-1]["content"] = str(out[-1].get("content") or "") + text
        else:
            out.append({"role": ROLES.get(role, role), "content": text})
    else:
        raise FlyError(f"cannot tell what this input item is: {json.dumps(item)[:80]}")


def _text(parts: Any) -> str:
    if not isinstance(parts, list):
        raise FlyError("content must be a string or a list of parts")
    for p in parts:
        if not isinstance(p, dict) or p.get("type") not in ("input_text", "output_text", "text", "reasoning_text"):
            raise FlyError(f"content parts must be text, got {p!r:.80}")
    return "".join(str(p.get("text", "")) for p in parts)


# -- answers ----------------------------------------------------------------------------------

class Ids:
    """The ids of one response and of its output items."""

    def __init__(self) -> None:
        self.response, self.message, self.reasoning = (f"{p}_{uuid.uuid4().hex}" for p in ("resp", "msg", "rs"))


def _usage(gen: Generation) -> dict[str, Any]:
    n_prompt, n_out = len(gen.request.prompt), len(gen.tokens)
    return {"input_tokens": n_prompt, "output_tokens": n_out, "total_tokens": n_prompt + n_out,
            "input_tokens_details": {"cached_tokens": gen.stats.n_cached}}


def _output(msg: dict[str, Any], ids: Ids) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if msg.get("reasoning_content"):
        out.append({"id": ids.reasoning, "type": "reasoning", "summary": [], "encrypted_content": "",
                    "content": [{"type": "reasoning_text", "text": msg["reasoning_content"]}]})
    calls = msg.get("tool_calls") or []
    if msg.get("content") or not calls:
        out.append({"id": ids.message, "type": "message", "role": "assistant", "status": "completed",
                    "content": [_part(msg.get("content") or "")]})
    for c in calls:
        out.append({"id": f"fc_{c.get('id', '')}", "type": "function_call", "status": "completed",
                    "call_id": c.get("id", ""), "name": c["function"].get("name", ""),
                    "arguments": c["function"].get("arguments", "")})
    return out


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def response(chat: Chunk, gen: Generation, ids: Ids, model: str) -> Chunk:
    """A finished chat completion as a ``response`` object."""
    now = int(time.time())
    return {"id": ids.response, "object": "response", "created_at": now, "completed_at": now, "status": "completed",
            "model": model, "output": _output(chat["choices"][0]["message"], ids), "usage": _usage(gen)}


class _Items:
    """OpenAI chat chunks -> Responses stream events."""

    def __init__(self, gen: Generation, ids: Ids, model: str) -> None:
        self.gen, self.ids, self.model = gen, ids, model
        self.created = False
        self.text = ""  # of the message item
        self.reasoning = ""
        self.calls: dict[int, dict[str, Any]] = {}

    def _state(self, status: str) -> dict[str, Any]:
        return {"id": self.ids.response, "object": "response", "status": status}

    def feed(self, chunk: Chunk) -> Iterator[dict[str, Any]]:
        delta = chunk["choices"][0].get("delta", {})
        if "prompt_progress" in chunk:  # a batch of the prompt (return_progress)
            yield from self._started(chunk["prompt_progress"])
            return
        if delta.get("role") and "usage" not in chunk:
            return  # before the prompt is processed
        if not self.created:
            yield from self._started(None)
        if delta.get("reasoning_content"):
            if not self.reasoning:
                yield {"type": "response.output_item.added", "item": {
                    "id": self.ids.reasoning, "type": "reasoning", "summary": [], "content": [],
                    "encrypted_content": "", "status": "in_progress"}}
            self.reasoning += delta["reasoning_content"]
            yield {"type": "response.reasoning_text.delta", "item_id": self.ids.reasoning,
                   "delta": delta["reasoning_content"]}
        if delta.get("content"):
            if not self.text:
                yield {"type": "response.output_item.added", "item": {
                    "id": self.ids.message, "type": "message", "role": "assistant", "status": "in_progress",
                    "content": []}}
                yield {"type": "response.content_part.added", "item_id": self.ids.message,
                       "part": {"type": "output_text", "text": ""}}
            self.text += delta["content"]
            yield {"type": "response.output_text.delta", "item_id": self.ids.message, "delta": delta["content"]}
        for call in delta.get("tool_calls") or []:
            yield from self._call(call)
        if "usage" in chunk:
            yield from self._end()

    def _started(self, progress: dict[str, Any] | None) -> Iterator[dict[str, Any]]:
        """``response.created`` once, and ``response.in_progress`` then and with each report of
        the prompt's progress, as llama-server sends them."""
        if self.created and progress is None:
            return
        if not self.created:
            self.created = True
            yield {"type": "response.created", "response": self._state("in_progress")}
        started = {"type": "response.in_progress", "response": self._state("in_progress")}
        yield started if progress is None else {**started, "prompt_progress": progress}

    def _call(self, call: dict[str, Any]) -> Iterator[dict[str, Any]]:
        fn = call.get("function", {})
        seen = self.calls.setdefault(call.get("index", 0), {"id": "", "function": {"name": "", "arguments": ""}})
        if call.get("id"):
            seen["id"] = call["id"]
            seen["function"]["name"] = fn.get("name", "")
            yield {"type": "response.output_item.added", "item": {
                "id": f"fc_{call['id']}", "type": "function_call", "status": "in_progress", "arguments": "",
                "call_id": call["id"], "name": fn.get("name", "")}}
        if fn.get("arguments"):
            seen["function"]["arguments"] += fn["arguments"]
            yield {"type": "response.function_call_arguments.delta", "item_id": f"fc_{seen['id']}",
                   "delta": fn["arguments"]}

    def _end(self) -> Iterator[dict[str, Any]]:
        msg = {"content": self.text, "reasoning_content": self.reasoning, "tool_calls": list(self.calls.values())}
        output = _output(msg, self.ids)
        for item in output:
            if item["type"] == "message":
                if not self.text:  # nothing was said: the message item still opens
                    yield {"type": "response.output_item.added", "item": {**item, "status": "in_progress",
                                                                          "content": []}}
                    yield {"type": "response.content_part.added", "item_id": self.ids.message,
                           "part": {"type": "output_text", "text": ""}}
                yield {"type": "response.output_text.done", "item_id": self.ids.message, "text": self.text}
                yield {"type": "response.content_part.done", "item_id": self.ids.message, "part": _part(self.text)}
            yield {"type": "response.output_item.done", "item": item}
        now = int(time.time())
        yield {"type": "response.completed", "response": {
            **self._state("completed"), "created_at": now, "model": self.model, "output": output,
            "usage": _usage(self.gen)}, "timings": timings(self.gen.stats)}


async def _events(items: AsyncIterator[Chunk], gen: Generation, ids: Ids, model: str,
                  every: bool) -> AsyncIterator[bytes]:
    state = _Items(gen, ids, model)
    async for chunk in items:
        events = list(state.feed(chunk))
        if every and events and "timings" not in events[-1]:
            events[-1] = {**events[-1], "timings": timings(gen.stats)}
        for event in events:
            yield sse.named(event)
