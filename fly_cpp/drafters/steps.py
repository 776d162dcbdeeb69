"""The one draft step loop (``draft_steps``): a model that drafts one decode at a time (a
``Stepper``: the draft model, ``fly_cpp.drafters.draft_model.DraftModel``, or the target's MTP
head, ``fly_cpp.drafters.mtp.MtpHead``) stepped until the round's rules (``Rules``) or the
drafter's pace (``Pace``) say stop. A fixed k steps with the plain pace (n-gram guesses checked
as they are found); under k auto the drafter (``fly_cpp.drafters.drafter``) paces each step by
what one more is worth. The native draft run (``DraftModel.run``) is the fixed rule's fast path:
the same tokens without returning to Python per step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from fly_cpp.basics.errors import FlyError

if TYPE_CHECKING:
    from fly_cpp.backend.sampling import LogitBias
    from fly_cpp.drafters.seam import DraftRules


@dataclass(frozen=True)
class Stepped:
    """One decode of a stepper: ``best`` (guess + 1,) its token after each prefix of the n-gram
    guess it checked, ``agree`` how many guess tokens it agreed with, ``sure`` its top
    probability at rows 0..agree (empty unless asked), ``rows`` decoded, ``second`` its
    runner-up after the agreed guess and how many nats its score lies under ``token``'s (asked
    for by a tree, ``fly_cpp.drafters.tree``; None: not asked, or no second token)."""

    best: np.ndarray | list[int]
    agree: int
    sure: list[float]
    rows: int
    second: tuple[int, float] | None = None

    @property
    def token(self) -> int:
        """The stepper's own token after the agreed part of the guess."""
        return int(self.best[self.agree])


class Stepper(Protocol):
    """A model that drafts one decode at a time, with what the drafter (``fly_cpp.drafters.drafter``)
    asks of it besides its steps."""

    n_batch: int
    checks_guesses: bool  # a step can check an n-gram guess in the same decode
    forks: bool  # it tells its runner-up (``step``'s ``ranked``) and drafts at any position: a tree's branch
    bias: LogitBias  # the generation's logit bias, which its choices see

    @property
    def end(self) -> int | None:
        """The longest the text may grow while it drafts (None: no bound but the round's limit)."""

    def start(self, committed: Sequence[int]) -> list[int]:
        """A round after ``committed``: the tokens its first step catches up on."""

    def step(self, catchup: Sequence[int], history: Sequence[int], guess: Sequence[int],
             confident: bool = False, ranked: bool = False) -> Stepped:
        """Decode the catch-up, ``history[-1]`` and ``guess``: the token after ``history``
        (``ranked``: and its runner-up, ``Stepped.second``, where the stepper can tell it)."""

    def run(self, committed: Sequence[int], limit: int, need: int, drafting: DraftRules, confident: bool,
            checks: int | None = None) -> tuple[list[int], list[float]] | None:
        """A fixed k's steps in one native call, after ``start`` (None: it cannot; step instead)."""

    def is_eog(self, token: int) -> bool: ...

    def lag(self, committed: Sequence[int]) -> int:
        """Tokens its cache must catch up on before drafting after ``committed``."""

    def prefill(self, prompt: Sequence[int]) -> None:
        """Its cache brought to ``prompt`` before the rounds (where it keeps one of its own)."""

    def candidate(self, committed: Sequence[int]) -> int | None:
        """Its own token after ``committed`` (FLy's rule asks for it where no draft reached)."""

    def shift(self, keep: int, drop: int) -> None:
        """Follow a context shift (``fly_cpp.rounds.shift``) that dropped ``drop`` positions after ``keep``."""


@dataclass(frozen=True)
class Rules:
    """How far a round's steps go: ``limit`` tokens at most, ``need`` of them owed (an open
    window's), a token kept only while the stepper's top probability is at least ``p_min``
    (llama.cpp's rule; 0: always) once ``need`` are drafted; ``confident``: keep each token's
    top probability; ``end``: the longest the text may grow (None: no bound but ``limit``)."""

    limit: int
    need: int = 0
    p_min: float = 0.0
    confident: bool = False
    end: int | None = None


class Pace:
    """What a drafter adds to the steps: the n-gram guess a step checks (``guess``), what it learns
    of each step (``stepped``) and whether one more step is worth its cost (``more``). This plain
    one, a fixed k's: a guess found over ``room`` (at most ``checks``) tokens, every step taken."""

    def __init__(self, lookup: Callable[[Sequence[int], int], list[int]] | None = None, checks: int = 0) -> None:
        self.lookup, self.checks = lookup, checks

    def guess(self, history: Sequence[int], room: int, lag: int) -> list[int]:
        room = min(room, self.checks)
        return self.lookup(history, room) if self.lookup is not None and room > 0 else []

    def stepped(self, s: Stepped, guess: Sequence[int], seconds: float) -> None:
        pass

    def more(self, out: Sequence[int], new: Sequence[int], s: Stepped) -> bool:
        return True


PLAIN = Pace()


def draft_steps(stepper: Stepper, committed: Sequence[int], rules: Rules, pace: Pace = PLAIN,
                clock: Callable[[], float] | None = None, catchup: list[int] | None = None,
                ) -> tuple[list[int], list[float], list[tuple[int, float]]]:
    """The tokens drafted after ``committed``, their top probabilities (where ``rules`` keep
    them) and (rows, seconds) of each step (timed by ``clock``, the guess's lookup included; none
    without one). ``catchup``: what ``stepper.start`` returned, where the caller started it. A
    step keeps the guess tokens it agreed with and its own token after them (unless ``p_min``
    says otherwise); the steps stop at the limit, after an end-of-generation token, where the
    stepper lost confidence (it kept nothing of its own) or where the pace says so."""
    catchup = stepper.start(committed) if catchup is None else catchup
    out: list[int] = []
    confidences: list[float] = []
    steps: list[tuple[int, float]] = []
    history = list(committed)
    while len(out) < rules.limit and (rules.end is None or len(history) <= rules.end):
        t0 = clock() if clock is not None else 0.0
        room = min(rules.limit - len(out) - 1, stepper.n_batch - 1)  # guess + last token fit one batch
        guess = pace.guess(history, room, len(catchup)) if stepper.checks_guesses and room > 0 else []
        try:
            s = stepper.step(catchup, history, guess, rules.confident)
        except FlyError:  # a head whose target has not decoded that far (the loop's invariant rules it out)
            break
        seconds = clock() - t0 if clock is not None else 0.0
        if clock is not None:
            steps.append((s.rows, seconds))
        pace.stepped(s, guess, seconds)
        catchup = []
        new = list(guess[: s.agree])
        if rules.p_min <= 0 or len(out) + len(new) < rules.need or s.sure[s.agree] >= rules.p_min:
            new.append(s.token)
        out += new
        history += new
        confidences += s.sure[: len(new)]
        if cut_at_end(out, new, stepper.is_eog) or len(new) == s.agree:  # end of text, or the stepper lost confidence
            break
        if not pace.more(out, new, s):
            break
    return out, confidences, steps


def cut_at_end(out: list[int], new: Sequence[int], is_eog: Callable[[int], bool]) -> bool:
    """Cut ``out`` (whose last ``len(new)`` tokens a step just added) after the first
    end-of-generation token among ``new``; whether there was one."""
    ends = [i for i, t in enumerate(new) if is_eog(t)]
    if ends:
        del out[len(out) - len(new) + ends[0] + 1:]
    return bool(ends)
