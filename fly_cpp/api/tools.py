"""OpenAI tool calling: ``tools`` and ``tool_choice`` checked, rendered through the chat template,
and turned into the grammar the answer obeys while it writes a call.

The template gets the tools as its ``tools`` variable; the call format is the one its source
uses (``fly_cpp.api.tool_formats``: Hermes ``<tool_call>``, Llama 3.x, Mistral ``[TOOL_CALLS]``).
What constrains the answer (``fly_cpp.rounds.constrain``, in every mode):

- ``required`` or a named function: a grammar that forces one call (several with
  ``parallel_tool_calls`` where the format allows them) from the start of the answer (after the
  reasoning block the prompt opened, if it did), its name one of the functions and its
  arguments valid against that function's ``parameters`` schema (llama-cpp-python's
  JSON-schema converter);
- ``auto``: the same grammar, lazy: free text until the answer writes the word a call starts
  with (``<tool_call>``, ``[TOOL_CALLS]``, ``{"name": "``), then the call
  (``SamplingSettings.grammar_trigger``);
- ``none``: no tools in the prompt, no grammar, no parsing.

Templates in no format fly-cpp knows are refused when tools are given.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fly_cpp.api.reply import END_THINK, THINK
from fly_cpp.api.tool_formats import KNOWN, Format, detect, lit
from fly_cpp.backend.grammar import json_schema_rules
from fly_cpp.basics.errors import FlyError

CHOICES = ("auto", "none", "required")
REASONING_FORMATS = ("auto", "deepseek", "none")


@dataclass(frozen=True)
class Tools:
    """``tools``: the OpenAI tool objects (what the template renders); ``choice``: auto, none,
    required, or ``function`` (then ``name`` is the one to call); ``parallel``: several calls."""

    tools: tuple[dict[str, Any], ...]
    choice: str = "auto"
    name: str | None = None
    parallel: bool = False

    @property
    def active(self) -> bool:
        return bool(self.tools) and self.choice != "none"


def check(tools: Any, tool_choice: Any = None, parallel_tool_calls: Any = None) -> Tools | None:
    """OpenAI's fields as ``Tools`` (None: no tools); FlyError naming what is wrong."""
    if tools is None or tools == []:
        if tool_choice not in (None, "none", "auto"):
            raise FlyError(f"tool_choice {tool_choice!r} needs tools")
        return None
    if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)):
        raise FlyError("tools must be a list of {\"type\": \"function\", \"function\": {...}} objects")
    names = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(tool, Mapping) or tool.get("type") != "function" or not isinstance(fn, Mapping):
            raise FlyError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")
        if not isinstance(fn.get("name"), str) or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", fn["name"]):
            raise FlyError(f"tools[{i}].function.name must be 1 to 64 letters, digits, _ . or -")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], Mapping):
            raise FlyError(f"tools[{i}].function.parameters must be a JSON schema object")
        names.append(fn["name"])
    if len(set(names)) != len(names):
        raise FlyError("tools: two functions share a name")
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise FlyError("parallel_tool_calls must be true or false")
    choice, name = _choice(tool_choice, names)
    return Tools(tuple(dict(t) for t in tools), choice, name, bool(parallel_tool_calls))


def _choice(raw: Any, names: list[str]) -> tuple[str, str | None]:
    if raw is None:
        return "auto", None
    if isinstance(raw, str):
        if raw not in CHOICES:
            raise FlyError(f"tool_choice must be auto, none, required or a function, got {raw!r}")
        return raw, None
    fn = raw.get("function") if isinstance(raw, Mapping) else None
    if not isinstance(raw, Mapping) or raw.get("type") != "function" or not isinstance(fn, Mapping):
        raise FlyError("tool_choice must be auto, none, required or {\"type\": \"function\", \"function\": {\"name\": ...}}")
    if fn.get("name") not in names:
        raise FlyError(f"tool_choice names {fn.get('name')!r}, which is not among the tools")
    return "function", str(fn["name"])


def check_template(template: str, where: str) -> Format:
    """The tool-call format of a chat template; FlyError when it has none fly-cpp knows."""
    found = detect(template)
    if found is None:
        raise FlyError(f"the chat template ({where}) has no tool-call format fly-cpp knows ({KNOWN}); "
                       f"give one that has (--chat-template-file)")
    return found


def reasoning(fmt: str | None) -> bool:
    """llama-server's ``reasoning_format``: auto and deepseek split ``<think>`` off, none keeps it."""
    if fmt is None:
        return True
    if fmt not in REASONING_FORMATS:
        raise FlyError(f"reasoning_format must be one of {', '.join(REASONING_FORMATS)}, got {fmt!r}")
    return fmt != "none"


def think_open(prompt: str) -> bool:
    """Whether the prompt ends inside a reasoning block the answer must close."""
    tail = prompt.rstrip()
    return tail.endswith(THINK)


def _functions(tools: Tools) -> list[Mapping[str, Any]]:
    fns = [t["function"] for t in tools.tools]
    return [f for f in fns if f["name"] == tools.name] if tools.choice == "function" else fns


def function_names(tools: Tools) -> tuple[str, ...]:
    return tuple(t["function"]["name"] for t in tools.tools)


def grammar(tools: Tools, opened: bool, fmt: Format) -> tuple[str, str]:
    """(GBNF, trigger) for the calls ``tools`` asks for, written in ``fmt``: a grammar that
    starts the answer (required, a named function; after the opened reasoning block when
    ``opened``), or one that starts after the word every call begins with (auto)."""
    fns = _functions(tools)
    args = {f"tc-args-{i}": f.get("parameters") or {"type": "object", "properties": {}} for i, f in enumerate(fns)}
    rest = fmt.rest([(f["name"], f"tc-args-{i}") for i, f in enumerate(fns)], tools.parallel and fmt.parallel)
    rules = f"{json_schema_rules(args)}\ntc-ws ::= [ \\n]{{0,2}}\n"
    if tools.choice == "auto":
        return f"root ::= {rest}\n{rules}", fmt.trigger
    think = f'[^<]* "{END_THINK}" tc-ws ' if opened else ""
    return f"root ::= {think}{lit(fmt.trigger)} {rest}\n{rules}", ""


def template_messages(messages: Any, fmt: Format | None = None) -> Any:
    """Messages as templates read them: an assistant's ``tool_calls`` with their ``arguments``
    as objects (OpenAI sends JSON text; templates write the object), content null as "", call
    ids as ``fmt`` needs them (anything but a list is left for ``chat_format.check_messages``
    to refuse)."""
    if not isinstance(messages, (list, tuple)):
        return messages
    out = []
    for m in messages:
        m = dict(m) if isinstance(m, Mapping) else m
        if isinstance(m, dict) and m.get("tool_calls"):
            if m.get("content") is None:
                m["content"] = ""
            m["tool_calls"] = [_call_for_template(c, fmt) for c in m["tool_calls"]]
        if isinstance(m, dict) and fmt is not None and "tool_call_id" in m:
            m["tool_call_id"] = fmt.message_id(m["tool_call_id"])
        out.append(m)
    return out


def _call_for_template(c: Any, fmt: Format | None) -> Any:
    if not isinstance(c, Mapping) or not isinstance(c.get("function"), Mapping):
        raise FlyError("an assistant message's tool_calls must be {\"type\": \"function\", \"function\": {...}}")
    fn = dict(c["function"])
    if isinstance(fn.get("arguments"), str):
        try:
            fn["arguments"] = json.loads(fn["arguments"])
        except ValueError:
            raise FlyError(f"tool call {fn.get('name')!r}: arguments are not JSON") from None
    out = {**c, "function": fn, "name": fn.get("name"), "arguments": fn.get("arguments")}
    if fmt is not None and "id" in c:
        out["id"] = fmt.message_id(c["id"])
    return out


def with_grammar(settings: dict[str, Any], tool_settings: dict[str, Any]) -> dict[str, Any]:
    """A request's settings with its tools' grammar; a request that constrains the answer both
    ways is refused (the two grammars cannot both hold)."""
    if not tool_settings:
        return settings
    if settings.get("grammar") or settings.get("json_schema"):
        raise FlyError("tools (unless tool_choice is none) and grammar, json_schema or response_format cannot be "
                       "combined: both constrain the answer")
    kept = (*(settings.get("preserved_tokens") or ()), *tool_settings.get("preserved_tokens", ()))
    return {**settings, **tool_settings, "preserved_tokens": tuple(dict.fromkeys(kept))}
