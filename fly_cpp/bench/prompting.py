"""Turning a dataset prompt into the exact text and tokens every mode (and the peer) receives.

The chat template of the target GGUF (``tokenizer.chat_template``) is applied when there is
one, with a single user message (after the ``system`` message, when one is given) and the
generation prompt. The resulting text is what the
peer binaries are given too: they tokenize with special tokens parsed and BOS added by the
vocabulary's own rule, so we tokenize the same way, and drop a BOS the template wrote itself
when the vocabulary adds one anyway (otherwise BOS would appear twice).

Prompts too long for the context are cut (by tokens, keeping their start) before templating
so that ``max_tokens`` plus one round of drafts still fit; the record says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fly_cpp.api.chat_format import ChatFormat
from fly_cpp.basics.errors import FlyError
from fly_cpp.engine.engine import Engine


@dataclass(frozen=True)
class Rendered:
    text: str  # what the peer binaries get (with -f)
    tokens: list[int]  # what Engine.generate gets
    truncated: bool
    templated: bool


class PromptRenderer:
    """Renders dataset prompts for one engine; ``template=False`` uses the raw text."""

    def __init__(self, engine: Engine, *, template: bool = True, reserve: int = 0, system: str | None = None) -> None:
        self.engine = engine
        info = engine.info()
        gguf_template = info.chat_template if template else None
        if system is not None and gguf_template is None:
            raise FlyError("--system needs a chat template: the target GGUF has none"
                           if template else "--system needs the chat template: drop --no-template")
        self.system = system
        self.bos = info.bos_text
        self.template = (ChatFormat(gguf_template, self.bos, info.eos_text, (), "tokenizer.chat_template")
                         if gguf_template else None)
        self.add_bos = info.add_bos
        self.budget = engine.n_ctx - reserve  # tokens the rendered prompt may take

    def _wrap(self, content: str) -> str:
        if self.template is None:
            return content
        messages = [{"role": "system", "content": self.system}] if self.system is not None else []
        text = self.template.render([*messages, {"role": "user", "content": content}], add_generation_prompt=True)
        if self.add_bos and self.bos and text.startswith(self.bos):
            text = text[len(self.bos):]
        return text

    def _tokens(self, text: str) -> list[int]:
        return self.engine.tokenize(text, add_special=True, parse_special=self.template is not None)

    def render(self, content: str) -> Rendered:
        text = self._wrap(content)
        tokens = self._tokens(text)
        truncated = False
        if len(tokens) > self.budget:
            overhead = len(tokens) - len(self.engine.tokenize(content, add_special=False))
            keep = self.budget - overhead - 1
            if keep < 1:
                raise FlyError(f"the context (n_ctx={self.engine.n_ctx}) is too small for any prompt "
                               "with this --max-tokens and k")
            body = self.engine.tokenize(content, add_special=False)
            while True:
                head = self.engine.detokenize(body[:keep])
                if head.startswith(" ") and not content.startswith(" "):
                    head = head[1:]  # the space SentencePiece put in front when tokenizing
                text = self._wrap(head)
                tokens = self._tokens(text)
                if len(tokens) <= self.budget or keep == 1:  # detokenize/tokenize may not round-trip
                    break
                keep = max(1, keep - max(1, len(tokens) - self.budget))
            truncated = True
        return Rendered(text, tokens, truncated, self.template is not None)


def describe(r: Rendered) -> dict[str, Any]:
    return {"n_prompt": len(r.tokens), "truncated": r.truncated, "templated": r.templated}
