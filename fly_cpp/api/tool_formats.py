"""The tool-call formats fly-cpp knows, one entry each: the marks that identify a chat template
as using it, the text a call is written in (the grammar's rules after the word every call starts
with, which is also the lazy grammar's trigger), and how calls are read back from an answer.

=============  ==========================  =========================================================
format         template source has         a call, as the model writes it
=============  ==========================  =========================================================
hermes         ``<tool_call>``             ``<tool_call>{"name": N, "arguments": {..}}</tool_call>``
                                           (Qwen2.5/3.x, Hermes; several blocks for parallel calls)
llama-3        the ``ipython`` header      ``{"name": N, "parameters": {..}}``, optionally after
                                           ``<|python_tag|>`` (Llama 3.1/3.2/3.3; one call a turn)
mistral-nemo   ``[TOOL_CALLS]``            ``[TOOL_CALLS][{"name": N, "arguments": {..}, "id": I}, ..]``
mistral        ``[TOOL_CALLS]``, ``[ARGS]``  ``[TOOL_CALLS]N[CALL_ID]I[ARGS]{..}`` per call
                                           (Mistral Small 3.2; ``[CALL_ID]I`` only where the
                                           template has it: Devstral, Ministral write none)
=============  ==========================  =========================================================

Mistral's call ids are 9 letters and digits (its templates refuse others). Whatever the format,
an answer that is nothing but a fenced ```json call to one of the given functions (as
Qwen2.5-Coder writes one under ``auto``) is read as that call.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import string
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# (name, arguments: an object or JSON text, the id the model wrote or None)
Found = tuple[str, Any, "str | None"]

_ID_CHARS = string.ascii_letters + string.digits
_FENCE = re.compile(r"\s*```json\s*(\{.*\})\s*```\s*", re.S)
_FENCE_OPEN = "```json"


def lit(text: str) -> str:
    """``text`` as a GBNF literal."""
    return json.dumps(text)


def _json_at(text: str, at: int) -> tuple[Any, int] | None:
    """The JSON value at ``text[at:]`` (after whitespace) and where it ends; None: none there."""
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    try:
        return json.JSONDecoder().raw_decode(text, at)
    except ValueError:
        return None


def _found(obj: Any, args_keys: tuple[str, ...] = ("arguments", "parameters")) -> Found | None:
    """A call object ``{"name": N, "arguments" | "parameters": {..}(, "id": I)}`` (None: not one)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = next((obj[k] for k in args_keys if k in obj), {})
    if not isinstance(args, (dict, str)):
        return None
    ident = obj.get("id")
    return obj["name"], args, ident if isinstance(ident, str) else None


@dataclass(frozen=True)
class Format:
    """One tool-call format. ``marks``: texts a template's source must all hold to use it;
    ``trigger``: the text every call starts with; ``starts``: the texts a call may start with
    in an answer (where reading looks, and what streaming holds back); ``preserved``: the
    special tokens a call is written with (they must reach the text to be read);
    ``parallel``: the template renders several calls in one message; ``short_ids``: Mistral's
    9-character ids."""

    name: str
    marks: tuple[str, ...]
    trigger: str
    starts: tuple[str, ...]
    preserved: tuple[str, ...] = ()
    parallel: bool = True
    short_ids: bool = False

    def rest(self, calls: Sequence[tuple[str, str]], parallel: bool) -> str:
        """The GBNF after ``trigger``: one call (or several when ``parallel``) to one of
        ``calls`` ((function name, the rule its arguments obey))."""
        raise NotImplementedError

    def read(self, text: str, at: int) -> tuple[list[Found], int] | None:
        """The calls written at ``text[at:]`` (it begins with one of ``starts``) and where they
        end; None: no call there."""
        raise NotImplementedError

    # -- shared by every format ----------------------------------------------------------

    def split(self, text: str, names: Sequence[str]) -> tuple[str, list[dict[str, Any]]]:
        """``text`` without its calls, and the calls as OpenAI ``tool_calls`` entries."""
        kept, found, at = [], [], 0
        while (start := self._next_start(text, at)) >= 0:
            got = self.read(text, start)
            if got is None:
                kept.append(text[at:start + 1])
                at = start + 1
                continue
            calls, end = got
            kept.append(text[at:start])
            found.extend(calls)
            at = end
        rest = "".join(kept) + text[at:]
        if not found and (m := _FENCE.fullmatch(rest)):
            fenced = _json_at(m.group(1), 0)
            call = _found(fenced[0]) if fenced else None
            if call is not None and call[0] in names:
                return "", [self.openai(call)]
        return rest, [self.openai(c) for c in found]

    def held(self, content: str, names: Sequence[str]) -> int:
        """How much of a growing answer's ``content`` can be sent: all of it but a call (or the
        start of one) that may be being written."""
        if names and _may_fence(content):
            return 0
        cut = self._next_start(content, 0)
        if cut >= 0:
            return cut
        tail = max((partial_tail(content, s) for s in self.starts), default=0)
        return len(content) - tail

    def _next_start(self, text: str, at: int) -> int:
        hits = [i for s in self.starts if (i := text.find(s, at)) >= 0]
        return min(hits, default=-1)

    def openai(self, call: Found) -> dict[str, Any]:
        name, args, ident = call
        if self.short_ids:
            ident = ident if ident and _short(ident) else "".join(secrets.choice(_ID_CHARS) for _ in range(9))
        else:
            ident = f"call_{uuid.uuid4().hex[:24]}"
        text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        return {"id": ident, "type": "function", "function": {"name": name, "arguments": text}}

    def message_id(self, ident: Any) -> Any:
        """A call id as the template needs it: Mistral's refuse any but 9 letters and digits, so
        another id (a conversation begun elsewhere) is mapped to one, the same each time."""
        if not self.short_ids or not isinstance(ident, str) or _short(ident):
            return ident
        digest = hashlib.sha256(ident.encode()).digest()
        return "".join(_ID_CHARS[b % len(_ID_CHARS)] for b in digest[:9])


def _short(ident: str) -> bool:
    return len(ident) == 9 and ident.isascii() and ident.isalnum()


def _may_fence(content: str) -> bool:
    s = content.lstrip()
    return s.startswith(_FENCE_OPEN) or (bool(s) and _FENCE_OPEN.startswith(s))


def partial_tail(text: str, word: str) -> int:
    """The length of the longest end of ``text`` that begins ``word`` (held back while streaming)."""
    for n in range(min(len(word) - 1, len(text)), 0, -1):
        if word.startswith(text[-n:]):
            return n
    return 0


def _object(name: str, args_key: str, args_rule: str, extra: str = "") -> str:
    """A call object in GBNF: ``{"name": N, "<args_key>": <args_rule><extra>}`` (``extra``: GBNF)."""
    head = '{"name": "' + name + '", "' + args_key + '": '
    return f"{lit(head)} {args_rule} {extra} {lit('}')}"


def _alternatives(parts: Sequence[str]) -> str:
    return "(" + " | ".join(parts) + ")"


CALL, END_CALL = "<tool_call>", "</tool_call>"
_HERMES_BODY = re.compile(re.escape(CALL) + r"\s*(.*?)\s*" + re.escape(END_CALL), re.S)


class Hermes(Format):
    def rest(self, calls: Sequence[tuple[str, str]], parallel: bool) -> str:
        block = f'tc-ws {_alternatives([_object(n, "arguments", r) for n, r in calls])} tc-ws {lit(END_CALL)}'
        return f"{block} (tc-ws {lit(CALL)} {block})*" if parallel else block

    def read(self, text: str, at: int) -> tuple[list[Found], int] | None:
        m = _HERMES_BODY.match(text, at)
        if not m:
            return None
        try:
            call = _found(json.loads(m.group(1)))
        except ValueError:
            return None
        return ([call], m.end()) if call else None


PYTHON_TAG = "<|python_tag|>"
_LLAMA_ARGS = '", "parameters": '


class Llama3(Format):
    def rest(self, calls: Sequence[tuple[str, str]], parallel: bool) -> str:
        # the trigger has written '{"name": "'
        return _alternatives([f"{lit(n + _LLAMA_ARGS)} {r} {lit('}')}" for n, r in calls])

    def read(self, text: str, at: int) -> tuple[list[Found], int] | None:
        if text.startswith(PYTHON_TAG, at):
            at += len(PYTHON_TAG)
        got = _json_at(text, at)
        call = _found(got[0], ("parameters", "arguments")) if got else None
        return ([call], got[1]) if call and got else None


_ID_RULE = "[a-zA-Z0-9]{9}"
_NEMO_ID = ', "id": "'


class MistralNemo(Format):
    def rest(self, calls: Sequence[tuple[str, str]], parallel: bool) -> str:
        ident = f"{lit(_NEMO_ID)} {_ID_RULE} {lit(chr(34))}"
        one = _alternatives([_object(n, "arguments", r, ident) for n, r in calls])
        return f'"[" {one} ("," " " {one})* "]"' if parallel else f'"[" {one} "]"'

    def read(self, text: str, at: int) -> tuple[list[Found], int] | None:
        got = _json_at(text, at + len(self.trigger))
        if not got or not isinstance(got[0], list) or not got[0]:
            return None
        calls = [_found(c, ("arguments",)) for c in got[0]]
        return ([c for c in calls if c], got[1]) if all(calls) else None


_MISTRAL_HEAD = re.compile(r"\[TOOL_CALLS\]\s*([A-Za-z0-9_.\-]{1,64})(?:\[CALL_ID\]([A-Za-z0-9]+))?\[ARGS\]")


@dataclass(frozen=True)
class Mistral(Format):
    """``call_ids``: each call names its id (``[CALL_ID]``), as Mistral Small 3.2 writes them."""

    call_ids: bool = False

    def rest(self, calls: Sequence[tuple[str, str]], parallel: bool) -> str:
        ident = f'"[CALL_ID]" {_ID_RULE} ' if self.call_ids else ""
        one = _alternatives([f'{lit(n)} {ident}"[ARGS]" {r}' for n, r in calls])
        return f'{one} ("[TOOL_CALLS]" {one})*' if parallel else one

    def read(self, text: str, at: int) -> tuple[list[Found], int] | None:
        m = _MISTRAL_HEAD.match(text, at)
        got = _json_at(text, m.end()) if m else None
        if not m or not got or not isinstance(got[0], dict):
            return None
        return [(m.group(1), got[0], m.group(2))], got[1]


_MISTRAL_TOKENS = ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")
# in the order they are tried: the first whose marks a template holds is its format
FORMATS: tuple[Format, ...] = (
    Mistral("mistral-small", _MISTRAL_TOKENS, "[TOOL_CALLS]", ("[TOOL_CALLS]",), _MISTRAL_TOKENS,
            short_ids=True, call_ids=True),
    Mistral("mistral", _MISTRAL_TOKENS[:2], "[TOOL_CALLS]", ("[TOOL_CALLS]",), _MISTRAL_TOKENS, short_ids=True),
    MistralNemo("mistral-nemo", _MISTRAL_TOKENS[:1], "[TOOL_CALLS]", ("[TOOL_CALLS]",), _MISTRAL_TOKENS[:1],
                short_ids=True),
    Hermes("hermes", (CALL,), CALL, (CALL,), (CALL, END_CALL)),
    Llama3("llama-3", ("<|start_header_id|>ipython<|end_header_id|>",), '{"name": "', (PYTHON_TAG, '{"name"'),
           (PYTHON_TAG,), parallel=False),
)


def detect(template: str) -> Format | None:
    """The tool-call format a chat template's source uses (None: none fly-cpp knows)."""
    return next((f for f in FORMATS if all(m in template for m in f.marks)), None)


KNOWN = "Hermes <tool_call> (Qwen2.5/3.x), Llama 3.x (ipython), Mistral [TOOL_CALLS]"
