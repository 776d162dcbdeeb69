"""Grammars: llama.cpp's grammar sampler over a vocabulary (``Grammar``), JSON schemas turned into
GBNF, and the grammar a request's settings ask for (``gbnf``).
"""

from __future__ import annotations

import copy
import ctypes
import json
import os
import sys
import tempfile
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from fly_cpp.backend.lib import clear_log, last_log_error, ll
from fly_cpp.basics.errors import FlyError

if TYPE_CHECKING:
    from fly_cpp.backend.model import Model


def _grammar_init(model: Model, gbnf: str, root: str) -> tuple[Any, str]:
    """llama.cpp's grammar sampler, and what its parser wrote: the parser tells why a grammar
    is wrong on stderr, not through the log, so stderr is caught while it runs."""
    clear_log()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            ptr = ll.llama_sampler_init_grammar(model.vocab, gbnf.encode(), root.encode())
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        caught.seek(0)
        return ptr, caught.read().decode("utf-8", errors="replace")


class Grammar:
    """One state of llama.cpp's grammar sampler over ``model``'s vocabulary (GBNF text, its
    ``root`` rule). ``mask`` sets the logits of the tokens the grammar forbids next to -inf,
    ``allows`` asks about one token, ``accept`` advances, ``copy`` forks the state (rollback
    keeps one copy per position: ``fly_cpp.rounds.constrain``)."""

    def __init__(self, model: Model, gbnf: str, root: str = "root", *, _ptr: Any = None,
                 _cells: np.ndarray | None = None) -> None:
        self.model, self.ptr = model, None
        if _ptr is None:
            _ptr, said = _grammar_init(model, gbnf, root)
            if not _ptr:
                reason = next((ln.split("parsing grammar:", 1)[1].strip() for ln in said.splitlines()
                               if "parsing grammar:" in ln), "") or last_log_error()
                raise FlyError("invalid grammar" + (f": {reason}" if reason else ""))
        self.ptr = _ptr
        # (n_vocab,) llama_token_data records (id, logit, p), shared by a state and its forks
        # (one generation's, used by one thread): a copy per position must not copy the vocabulary
        if _cells is None:
            _cells = np.zeros(model.n_vocab, dtype=[("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
            _cells["id"] = np.arange(model.n_vocab, dtype=np.int32)
        self._cells = _cells
        self._one = np.zeros(1, dtype=_cells.dtype)

    def _apply(self, cells: np.ndarray) -> None:
        arr = ll.llama_token_data_array(cells.ctypes.data_as(ctypes.POINTER(ll.llama_token_data)), cells.shape[0],
                                        -1, False)
        ll.llama_sampler_apply(self.ptr, ctypes.byref(arr))

    def mask(self, row: np.ndarray) -> None:
        """Set the forbidden tokens' logits in ``row`` ((n_vocab,) float32, may be a view of
        llama.cpp's buffer) to -inf, in place."""
        cells = self._cells  # the grammar sampler only writes logits: the ids stay in place
        cells["logit"] = 0.0
        self._apply(cells)
        row[cells["logit"][: row.shape[0]] == -np.inf] = -np.inf

    def allows(self, token: int) -> bool:
        """Whether the grammar lets ``token`` come next."""
        if not 0 <= token < self.model.n_vocab:
            return False
        self._one["id"], self._one["logit"] = token, 0.0
        self._apply(self._one)
        return bool(self._one["logit"][0] != -np.inf)

    def accept(self, token: int) -> None:
        """Advance past ``token``, which must be allowed (llama.cpp aborts on one it forbids)."""
        ll.llama_sampler_accept(self.ptr, token)

    def copy(self) -> Grammar:
        return Grammar(self.model, "", _ptr=ll.llama_sampler_clone(self.ptr), _cells=self._cells)

    def close(self) -> None:
        if self.ptr:
            ll.llama_sampler_free(self.ptr)
            self.ptr = None

    def __del__(self) -> None:
        self.close()


# one character of a JSON string: any but the quote, the backslash and U+0000..U+001F, or an escape
JSON_CHAR = r'[^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])'


def json_schema_grammar(schema: str) -> str:
    """GBNF for a JSON schema (text), by llama-cpp-python's converter, with two of its gaps
    closed: integer bounds (``int_bounds``), which it ignores, are enforced, and a string's
    characters exclude the control characters JSON forbids raw (its ``char`` rule let a newline
    into a string, and the answer then failed to parse). FlyError on a bad schema."""
    try:
        parsed = json.loads(schema)
    except ValueError as e:
        raise FlyError(f"invalid JSON schema: {e}") from None
    return json_schema_rules({"": parsed})


def json_schema_rules(schemas: Mapping[str, Any]) -> str:
    """GBNF rules for several parsed JSON schemas at once, each under its own rule name (""
    names ``root``), the rules they share written once (see ``json_schema_grammar``)."""
    from llama_cpp import llama_grammar

    from fly_cpp.basics import int_bounds

    class Converter(llama_grammar.SchemaConverter):
        def visit(self, schema: Any, name: str) -> str:
            if isinstance(schema, dict) and schema.get("type") == "integer" and \
                    any(k in schema for k in int_bounds.KEYWORDS):
                rule = name + "-" if name in llama_grammar.RESERVED_NAMES else name or "root"
                return self._add_rule(rule, int_bounds.integer_range(*int_bounds.bounds(schema)) + " space")
            return super().visit(schema, name)

    try:
        converter = Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
        for name, schema in schemas.items():
            converter.visit(converter.resolve_refs(copy.deepcopy(schema), "stdin"), name)  # it resolves in place
        if "char" in converter._rules:
            converter._rules["char"] = JSON_CHAR
        return converter.format_grammar()
    except FlyError:
        raise
    except Exception as e:  # the converter raises whatever its parsing hits
        raise FlyError(f"invalid JSON schema: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def gbnf(settings: Any) -> str:
    """The GBNF of a SamplingSettings' ``grammar`` or ``json_schema`` ("{}": any JSON object)."""
    if settings.grammar:
        return str(settings.grammar)
    if settings.json_schema.strip() in ("{}", "object", '{"type": "object"}', '{"type":"object"}'):
        from llama_cpp.llama_grammar import JSON_GBNF

        return JSON_GBNF
    return json_schema_grammar(settings.json_schema)
