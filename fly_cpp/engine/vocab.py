"""Can this draft speak for this target? llama.cpp's rules for draft/target vocabularies."""

from __future__ import annotations

from typing import Protocol

from fly_cpp.basics.errors import FlyError

MAX_SIZE_DIFFERENCE = 128  # vocab sizes may differ by at most this many tokens
CHECK_START_ID = 5  # token texts are compared from this id up to the smaller vocab size


class VocabInfo(Protocol):
    name: str
    vocab_type: str
    n_vocab: int
    bos: int
    eos: int
    add_bos: bool
    add_eos: bool

    def token_text(self, token: int) -> bytes: ...


def check_compatible(target: VocabInfo, draft: VocabInfo) -> None:
    """Raise FlyError naming the first difference that makes ``draft`` unusable for ``target``."""

    def differ(what: str, t: object, d: object) -> FlyError:
        return FlyError(
            f"draft {draft.name} cannot draft for target {target.name}: {what} differs "
            f"(target {t}, draft {d})"
        )

    for what, attr in (("vocabulary type", "vocab_type"), ("BOS token id", "bos"), ("EOS token id", "eos"),
                       ("add-BOS flag", "add_bos"), ("add-EOS flag", "add_eos")):
        if getattr(target, attr) != getattr(draft, attr):
            raise differ(what, getattr(target, attr), getattr(draft, attr))
    if abs(target.n_vocab - draft.n_vocab) > MAX_SIZE_DIFFERENCE:
        raise differ(f"vocabulary size (by more than {MAX_SIZE_DIFFERENCE})", target.n_vocab, draft.n_vocab)
    for token in range(CHECK_START_ID, min(target.n_vocab, draft.n_vocab)):
        t, d = target.token_text(token), draft.token_text(token)
        if t != d:
            raise differ(f"text of token {token}", repr(t.decode("utf-8", "replace")), repr(d.decode("utf-8", "replace")))
