"""Drafters: who proposes the next tokens. Each owns its own state (and KV cache).

The seam, shaped as llama.cpp's ``common_speculative``: ``begin(prompt)`` once per generation,
``draft(committed, limit, need) -> Draft`` every round (at most ``limit`` greedy guesses that
continue ``committed``, the prompt plus every token emitted so far), and ``accept(report)``
once the target has judged them. ``candidate(committed)`` is the draft model's own token after
``committed`` (None without one): FLy's rule asks for it where no draft reached (``fly_cpp.rounds.loop``).

A draft may be shorter than ``limit``, even empty: it stops after an end-of-generation token,
when the draft model is unsure (``p_min``), or when the n-gram drafter finds no match. ``need``
tokens are owed, though: an open deferred window is completed only by the draft model's own
continuation, so the first ``need`` tokens come from the draft model whatever its confidence
(fewer only at the end of the text or of ``limit``).

Data flows one way: a drafter never calls up into whoever decides how far to draft; the pair's
own drafter (``fly_cpp.drafters.drafter``) drives its model one ``Stepper.step`` at a time, as its
pacer plans.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from fly_cpp.config import SpecSettings
from fly_cpp.kauto.pacer import Pacer


@dataclass(frozen=True)
class DraftRules:
    """How a generation's drafters draft, resolved once from its settings (``of``): n-gram lookup
    on (``ngram``), over matches of up to ``ngram_max`` tokens continued by up to ``ngram_tokens``;
    a model's token kept while its top probability is at least ``p_min`` (llama.cpp's rule); and
    whether the round's accept rule ``loosens`` (it asks the draft model for its token wherever the
    target was unsure, drafting or not); ``tree``: a fixed k's rounds draft a tree whose branch
    drafts that many tokens after its fork (``fly_cpp.drafters.tree``; 0: a chain)."""

    ngram: bool
    ngram_max: int
    ngram_tokens: int
    p_min: float
    loosens: bool
    tree: int = 0

    @classmethod
    def of(cls, spec: SpecSettings, tree: bool = False) -> DraftRules:
        """``tree``: whether this generation's rounds can verify a tree (``spec.draft_tree`` is then drafted)."""
        return cls(spec.ngram, spec.ngram_max, spec.ngram_tokens, spec.p_min, spec.policy().loosens,
                   spec.draft_tree if tree else 0)


@dataclass(frozen=True)
class Branch:
    """A tree's second continuation (``Draft.branch``): ``tokens``, whose first stands where the
    chain's token ``fork`` stands (the draft's runner-up there), the rest the draft's own after it."""

    fork: int
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Draft:
    """One round's proposal. ``confidences``: the draft model's top probability at each token
    (None for an n-gram guess no model step checked). ``by_model``: every token is the draft
    model's own greedy choice where it stands, which is what FLy may keep on a mismatch.
    ``alone``: with no tokens, the rounds (this one included) the drafter has decided to leave
    to the target alone without being asked again (k auto's rest, ``Pacer.rest``): the loop may
    decode them as one run (``fly_cpp.rounds.runs``) and report them together (``Report.rounds``).
    ``steps``: (rows, seconds) of each draft-model decode, where the drafter was given a clock
    to time them by; not part of what a draft is (equality). ``branch``: a tree's second
    continuation of ``tokens[:branch.fork]`` (``fly_cpp.drafters.tree``), verified in the same target
    decode (None: a chain)."""

    tokens: list[int] = field(default_factory=list)
    confidences: list[float | None] = field(default_factory=list)
    by_model: bool = False
    alone: int = 0
    steps: tuple[tuple[int, float], ...] = field(default=(), compare=False)
    branch: Branch | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    def cut(self, n: int) -> Draft:
        """The first ``n`` tokens (a branch that forks past them goes)."""
        branch = self.branch if self.branch is not None and self.branch.fork < n else None
        return Draft(self.tokens[:n], self.confidences[:n], self.by_model, steps=self.steps, branch=branch)


@dataclass(frozen=True)
class Report:
    """How a round went, for the drafter that drafted it.

    ``verified``: drafted tokens the target checked (0 when the draft was dropped, ``n_min``);
    ``kept``: of those, the ones it kept (0 when the round refuted an open window);
    ``committed``: the whole text after the round; ``decoded_rows``: rows the target decoded
    (``verified + 1``, more in a padded batch); seconds: drafting, the target's decode, the
    whole round. ``rounds``: more than 1 for a run of the rounds a draft left to the target
    alone (``Draft.alone``), one token each: then ``target_seconds`` is all their decodes."""

    draft: Draft
    verified: int
    kept: int
    committed: Sequence[int]
    draft_seconds: float
    target_seconds: float
    round_seconds: float
    decoded_rows: int
    rounds: int = 1

    @property
    def emitted(self) -> int:
        """Tokens the round committed: the kept drafts and the target's own token (one per
        round of a run)."""
        return self.kept + self.rounds


class Drafter(Protocol):
    pacer: Pacer | None  # the k auto controller that paces its rounds (None: not paced)

    def begin(self, prompt: Sequence[int]) -> None: ...

    def draft(self, committed: Sequence[int], limit: int, need: int = 0) -> Draft: ...

    def candidate(self, committed: Sequence[int]) -> int | None: ...

    def accept(self, report: Report) -> None: ...

    def shift(self, keep: int, drop: int) -> None:
        """A context shift (``fly_cpp.rounds.shift``) dropped ``drop`` positions after the first
        ``keep``: a drafter with a cache moves it as the target's moved; one without finds the
        shifted text by common prefix on its next draft."""


class _Plain:
    """Any object with ``draft(committed, limit)`` returning a list of tokens (or a ``Draft``),
    as a whole drafter: it offers no candidates, learns nothing from a round and follows no
    context shift (it finds the shifted text by common prefix on its next draft); nothing
    paces it."""

    pacer = None

    def __init__(self, inner: object) -> None:
        self.inner = inner

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def draft(self, committed: Sequence[int], limit: int, need: int = 0) -> Draft:
        found = self.inner.draft(committed, limit)  # type: ignore[attr-defined]
        return found if isinstance(found, Draft) else Draft(list(found), [None] * len(found))

    def candidate(self, committed: Sequence[int]) -> int | None:
        return None

    def accept(self, report: Report) -> None:
        pass

    def shift(self, keep: int, drop: int) -> None:
        pass


class _Whole:
    """A caller's full drafter missing the seam's optional parts: one that follows no context
    shift itself finds the shifted text by common prefix on its next draft; one without a pacer
    is paced by none."""

    def __init__(self, inner: Drafter) -> None:
        self.inner = inner
        self.begin, self.draft, self.candidate, self.accept = inner.begin, inner.draft, inner.candidate, inner.accept
        self.pacer: Pacer | None = getattr(inner, "pacer", None)
        follow = getattr(inner, "shift", None)
        if callable(follow):
            self.shift = follow

    def shift(self, keep: int, drop: int) -> None:
        pass


def as_drafter(drafter: object) -> Drafter:
    """A caller's ``drafter`` as the whole seam: a full ``Drafter`` as it is (completed where it
    lacks ``shift`` or ``pacer``), and the simplest custom one, an object with ``draft(committed,
    limit) -> list[int]``, wrapped. The one place a drafter's shape is read off the object: the
    caller's, at the API's edge."""
    if all(callable(getattr(drafter, name, None)) for name in ("begin", "draft", "candidate", "accept")):
        full: Drafter = drafter  # type: ignore[assignment]
        return full if callable(getattr(drafter, "shift", None)) and hasattr(drafter, "pacer") else _Whole(full)
    if not callable(getattr(drafter, "draft", None)):
        raise TypeError(f"a drafter needs a draft(committed, limit) method, got {type(drafter).__name__}")
    return _Plain(drafter)
