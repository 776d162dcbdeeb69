"""Chat messages -> prompt text: the GGUF's Jinja chat template, or a plain fallback.

A model's ``tokenizer.chat_template`` is rendered the way llama.cpp ``--jinja`` and Hugging
Face transformers render it: a sandboxed, immutable Jinja environment with ``messages``,
``add_generation_prompt``, ``bos_token``, ``eos_token``, ``raise_exception`` and
``strftime_now`` (and, as llama.cpp adds them, today's ``date_string`` and ``datetime``), and a
``tojson`` filter that writes plain JSON.

Models without a template (base models such as the bundled story model) get ``PLAIN``::

    <system prompt>            (only when there is one, followed by a blank line)
    User: <message>
    Assistant: <message>
    ...
    Assistant:

which base models continue naturally; generation stops at ``"\\nUser:"``. For instruct models
whose GGUF lacks a template (or to override it), the common families are built in as well:
``chatml``, ``llama-3``, ``mistral-instruct``, ``gemma`` and ``phi-3`` (names match with or
without the dash: ``llama3``, ``phi3``). As llama.cpp's built-in templates do, they leave the
BOS token to the tokenizer; Mistral and Gemma have no system role, so a system prompt opens
the first user turn.

Multi-turn KV reuse depends on one property of a format: the prompt rendered for a
conversation is a prefix of the prompt rendered for the same conversation with the answer
and a new user turn appended (so both models' caches keep everything up to the new turn).
Both built-in formats have it; so do the templates of common instruct models.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from fly_cpp.basics.errors import FlyError

ROLES = ("system", "user", "assistant", "tool")

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

PLAIN = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] + '\n\n' }}"
    "{% elif message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\n' }}"
    "{% else %}{{ 'Assistant: ' + message['content'] + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)

LLAMA_3 = (
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# Mistral and Gemma know no system role: a system prompt opens the first user turn
_SYSTEM_FIRST = (
    "{% set ns = namespace(system='') %}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set ns.system = messages[0]['content'] + '\n\n' %}{% set messages = messages[1:] %}"
    "{% endif %}"
)

MISTRAL_INSTRUCT = _SYSTEM_FIRST + (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + (ns.system if loop.first else '') + message['content'] + ' [/INST]' }}"
    "{% else %}{{ message['content'] + eos_token }}"
    "{% endif %}"
    "{% endfor %}"
)

GEMMA = _SYSTEM_FIRST + (
    "{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + (ns.system if loop.first else '') + message['content'] | trim"
    " + '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

PHI_3 = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

COMMAND_R = (
    "{% set turn = {'system': 'SYSTEM', 'user': 'USER', 'assistant': 'CHATBOT'} %}"
    "{% for message in messages %}{% if message['role'] in turn %}"
    "{{ '<|START_OF_TURN_TOKEN|><|' + turn[message['role']] + '_TOKEN|>' + message['content'] | trim"
    " + '<|END_OF_TURN_TOKEN|>' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}{% endif %}"
)

BUILTIN: dict[str, tuple[str, tuple[str, ...]]] = {  # name -> (template, stop strings)
    "plain": (PLAIN, ("\nUser:",)),
    "chatml": (CHATML, ("<|im_end|>",)),
    "llama-3": (LLAMA_3, ("<|eot_id|>",)),
    "mistral-instruct": (MISTRAL_INSTRUCT, ("[INST]",)),
    "gemma": (GEMMA, ("<end_of_turn>",)),
    "phi-3": (PHI_3, ("<|end|>",)),
    "command-r": (COMMAND_R, ("<|END_OF_TURN_TOKEN|>",)),
}


def _key(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


_BY_KEY = {_key(name): name for name in BUILTIN}


def is_builtin(name: str) -> bool:
    """Whether ``name`` names a built-in format (``llama3`` and ``Llama-3`` name ``llama-3``)."""
    return _key(name) in _BY_KEY


class _Undefined(jinja2.Undefined):
    """An undefined variable joined to text with ``+`` reads as empty text, as llama.cpp's Jinja
    reads it (templates written for a caller that fills more variables, e.g. firefunction-v2's
    ``functions``); any other use still fails."""

    def __add__(self, other: Any) -> Any:
        return other if isinstance(other, str) else self._fail_with_undefined_error()

    __radd__ = __add__


class _TemplateError(Exception):
    """What ``raise_exception`` in a template raises (turned into FlyError by ``render``)."""


def _raise_exception(message: str) -> None:
    raise _TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _GenerationTag(jinja2.ext.Extension):
    """Hugging Face's ``{% generation %}...{% endgeneration %}`` marks training targets; render its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


@dataclass(frozen=True)
class ChatFormat:
    """A compiled chat template. ``stop``: strings that end an answer (besides end-of-generation
    tokens, which always do). ``name``: where the template came from, for messages."""

    template: str
    bos_token: str = ""
    eos_token: str = ""
    stop: tuple[str, ...] = ()
    name: str = "custom"

    def __post_init__(self) -> None:
        env = ImmutableSandboxedEnvironment(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True,
                                            undefined=_Undefined, extensions=[_GenerationTag, jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals.update(raise_exception=_raise_exception, strftime_now=lambda f: datetime.now().strftime(f))
        try:
            compiled = env.from_string(self.template)
        except jinja2.TemplateSyntaxError as e:
            raise FlyError(f"chat template ({self.name}) is not valid Jinja: {e.message} (line {e.lineno})") from None
        object.__setattr__(self, "_compiled", compiled)

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
               **extra: Any) -> str:
        """The prompt text for ``messages`` (checked with :func:`check_messages`)."""
        messages = check_messages(messages)
        now = datetime.now()  # llama.cpp's extra context: templates of the Llama 3.x family read it
        extra = {"date_string": now.strftime("%d %b %Y"), "datetime": now.strftime("%b %d %Y"), **extra}
        try:
            return self._compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,  # type: ignore[attr-defined]
                                         bos_token=self.bos_token, eos_token=self.eos_token, **extra)
        except _TemplateError as e:
            raise FlyError(f"chat template ({self.name}) refused the messages: {e}") from None
        except jinja2.TemplateError as e:
            raise FlyError(f"chat template ({self.name}) failed: {e}") from None


def builtin(name: str, *, bos_token: str = "", eos_token: str = "") -> ChatFormat:
    """One of the built-in formats (``BUILTIN``)."""
    if not is_builtin(name):
        raise FlyError(f"unknown chat format {name!r}; built-in formats: {', '.join(BUILTIN)}")
    name = _BY_KEY[_key(name)]
    template, stop = BUILTIN[name]
    return ChatFormat(template, bos_token, eos_token, stop, name)


def resolve(chat_format: str | None, gguf_template: str | None, *, bos_token: str = "",
            eos_token: str = "") -> ChatFormat:
    """Pick the format: ``chat_format`` (a built-in name or Jinja text) when given, else the
    GGUF's template, else ``plain``."""
    if chat_format is not None and is_builtin(chat_format):
        return builtin(chat_format, bos_token=bos_token, eos_token=eos_token)
    if chat_format is not None:
        if "{" not in chat_format:
            raise FlyError(f"unknown chat format {chat_format!r}: give a built-in name "
                           f"({', '.join(BUILTIN)}) or a Jinja template")
        return ChatFormat(chat_format, bos_token, eos_token, (), "custom")
    if gguf_template:
        return ChatFormat(gguf_template, bos_token, eos_token, (), "tokenizer.chat_template")
    return builtin("plain", bos_token=bos_token, eos_token=eos_token)


def continued(messages: Any) -> str | None:
    """The text a conversation ending with an assistant's message (a prefill, without tool calls)
    goes on from, as llama-server continues it: its text parts joined by blank lines; None when
    the conversation ends otherwise. Two assistant messages at the end are refused."""
    if not isinstance(messages, (list, tuple)) or len(messages) < 2:
        return None
    last, before = messages[-1], messages[-2]
    if not isinstance(last, Mapping) or last.get("role") != "assistant" or last.get("tool_calls"):
        return None
    if isinstance(before, Mapping) and before.get("role") == "assistant":
        raise FlyError("two assistant messages at the end of the conversation: the last one is the answer's "
                       "beginning, the one before it has nowhere to go")
    content = last.get("content")
    if isinstance(content, list):
        check_messages([last])
        return "\n\n".join(str(p.get("text", "")) for p in content)
    return check_messages([last])[0]["content"]


def check_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Validate OpenAI-style messages; content given as a list of text parts is joined, a line
    each."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError(f"messages must be a list of {{'role': ..., 'content': ...}} dicts, got {type(messages).__name__}")
    if not messages:
        raise FlyError("messages is empty")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise TypeError(f"messages[{i}] must be a dict with 'role' and 'content', got {type(m).__name__}")
        role, content = m.get("role"), m.get("content")
        if content is None and role == "assistant" and m.get("tool_calls"):
            content = ""  # OpenAI's null content beside tool calls
        if role not in ROLES:
            raise FlyError(f"messages[{i}]: role must be one of {', '.join(ROLES)}, got {role!r}")
        if isinstance(content, list):
            if any(not isinstance(p, Mapping) or p.get("type") != "text" for p in content):
                raise FlyError(f"messages[{i}]: only text content parts are supported")
            content = "\n".join(str(p.get("text", "")) for p in content)  # as llama.cpp joins them
        if not isinstance(content, str):
            raise FlyError(f"messages[{i}]: content must be a string, got {type(content).__name__}")
        out.append({**m, "role": role, "content": content})
    return out
