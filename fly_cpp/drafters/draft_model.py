"""The draft model as a drafter: its context one decode at a time (``DraftModel.step``), and
``ModelDrafter``, which drafts a fixed k with it (k auto's drafter, ``fly_cpp.drafters.paced``, drives
the same steps)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from fly_cpp.backend import native, rows
from fly_cpp.backend.cache import common_prefix
from fly_cpp.backend.context import Context
from fly_cpp.backend.sampling import NO_BIAS, LogitBias, Sampler
from fly_cpp.drafters import ngram
from fly_cpp.drafters.seam import Draft, DraftRules, Report
from fly_cpp.drafters.steps import Pace, Rules, Stepped, draft_steps


class DraftModel:
    """The draft model's context, one decode at a time. Its cache keeps the loop's invariant on
    its own tokens: after a step it holds everything drafted but the last token. ``path``: the
    text it last drafted along, each token past the common prefix its own greedy choice, so
    that its token after any prefix of that path is known without a decode. A step checks an
    n-gram guess in the same decode (``checks_guesses``)."""

    checks_guesses = True

    def __init__(self, ctx: Context, n_vocab: int, bias: LogitBias = NO_BIAS, draws: Sampler | None = None) -> None:
        """``draws``: the target's sampler, which the draft draws its tokens with (None: its argmax)."""
        self.ctx = ctx
        self.n_batch = ctx.n_batch
        self.n_vocab = n_vocab  # argmax only over ids the target knows
        self.bias = bias
        self.draws = draws
        self.path: list[int] = []
        self._own = 0  # path[_own:] are the model's own choices
        self._hist = np.zeros(0, dtype=np.int32)  # (capacity,) int32: the text of the last native run, then its drafts
        self._text: list[int] = []  # what _hist holds of the text

    def is_eog(self, token: int) -> bool:
        return self.ctx.model.is_eog(token)

    def lag(self, committed: Sequence[int]) -> int:
        """Tokens this cache must catch up on before drafting after ``committed``."""
        return len(committed) - 1 - common_prefix(self.ctx.tokens, committed[:-1])

    def prefill(self, prompt: Sequence[int]) -> None:
        """Bring the cache to ``prompt`` but its last token (reusing what it shares with it), with
        the target's prompt and before the rounds' clock starts, as llama.cpp's speculative
        decoding processes the draft's prompt: caught up in the first round instead, a 125-token
        prompt took 1.35 s of a 64-token cold answer on the F16 pair (15% of its decode time)."""
        self.ctx.sync(prompt)

    def start(self, committed: Sequence[int]) -> list[int]:
        """Cut the cache back to what it shares with ``committed`` (unconditionally: also drops
        anything a disturbed decode left behind); returns the catch-up, the tokens to decode
        with the first step so that the cache then holds ``committed[:-1]``."""
        keep = common_prefix(self.ctx.tokens, committed[:-1])
        self.ctx.truncate(keep)
        self.ctx.checkpoint(len(committed) - 1)  # the next round comes back here (a recurrent state needs a copy)
        return list(committed[keep:-1])

    def step(self, catchup: Sequence[int], history: Sequence[int], guess: Sequence[int],
             confident: bool = False) -> Stepped:
        """Decode the catch-up, ``history[-1]`` and an n-gram ``guess`` in one batch; the cache
        then keeps ``history`` and the agreed part of the guess. ``confident``: also read the
        draft's top probability at the rows that matter."""
        batch = [*catchup, history[-1], *guess]
        logits = self.ctx.decode(batch, logits=len(guess) + 1)
        drawn = self.draws.drafts(logits[:, : self.n_vocab], history, guess) if self.draws is not None else None
        if self.bias:
            logits = self.bias.apply(logits[:, : self.n_vocab])
        best = rows.argmax(logits[:, : self.n_vocab]) if drawn is None else drawn  # (len(guess)+1,)
        agree = 0
        while agree < len(guess) and guess[agree] == best[agree]:
            agree += 1
        sure = [float(p) for p in rows.top_probability(logits[: agree + 1])] if confident else []
        self.ctx.truncate(len(history) + agree)  # invariant: the cache holds the new history but its last token
        if not (self._own <= len(history) <= len(self.path) and common_prefix(self.path, history) == len(history)):
            self._own = len(history)  # a new path, not the continuation of the last one
        self.path = [*history, *guess[:agree], int(best[agree])]
        return Stepped(best, agree, sure, len(batch))

    def run(self, committed: Sequence[int], limit: int, need: int, drafting: DraftRules,
            confident: bool, checks: int | None = None) -> tuple[list[int], list[float]] | None:
        """``ModelDrafter.draft``'s steps inside the native library, after ``start``: the same
        tokens and confidences, without returning to Python per step (``checks``: the most
        n-gram guess tokens a step checks; None: ``drafting.ngram_tokens``; ``drafting``: the drafters' rules). None where the library
        cannot run them (no library, a logit bias, sampled drafts, a context it cannot drive, a
        longer n-gram than it looks up, no room in the cache); the caller then steps in Python."""
        n = len(committed)
        if (not self.ctx.drafts_natively or self.bias or self.draws is not None
                or (drafting.ngram and drafting.ngram_max > native.MAX_NGRAM) or n + limit - 1 > self.ctx.n_ctx):
            return None
        if len(self._hist) < n + limit:
            grown = np.zeros(max(2 * len(self._hist), n + limit, 1024), dtype=np.int32)
            grown[: len(self._text)] = self._hist[: len(self._text)]
            self._hist = grown
        keep = common_prefix(self._text, committed)
        self._hist[keep:n] = committed[keep:]
        self._text = list(committed)
        tokens = drafting.ngram_tokens if checks is None else checks
        rules = native.DraftRules(limit, need, drafting.p_min, confident, drafting.ngram_max if drafting.ngram and tokens else 0,
                                  tokens)
        if not (self._own <= n <= len(self.path) and common_prefix(self.path, committed) == n):
            self._own = n  # a new path, not the continuation of the last one (as ``step``)
        out, confidences, last = self.ctx.draft_run(self._hist, n, rules, self.n_vocab, text=committed)
        self.path = [*committed, *self.ctx.tokens[n:], last]
        return out, confidences

    def shift(self, keep: int, drop: int) -> None:
        """Follow a context shift (``fly_cpp.rounds.shift``): the cache drops the same positions and
        moves what follows them, where it holds them (else it keeps its first ``keep``); the
        path it drafted along is forgotten."""
        ctx = self.ctx
        if len(ctx.tokens) > keep + drop and ctx.can_shift:
            ctx.shift(keep, drop)
        else:
            ctx.truncate(min(len(ctx.tokens), keep))
        self.path, self._own, self._text = [], 0, []

    def candidate(self, committed: Sequence[int]) -> int:
        """The draft model's greedy token after ``committed``: read off the path it last drafted
        along when ``committed`` follows it, else one decode."""
        n = len(committed)
        if self._own <= n < len(self.path) and common_prefix(self.path, committed) == n:
            return self.path[n]
        return self.step(self.start(committed), committed, []).token


class ModelDrafter:
    """Greedy drafting with a draft model, up to the round's limit (a fixed k), optionally
    multi-level: an n-gram guess is first checked by the draft model in one forward pass (exact
    match, plus the draft's own next token), so one draft forward pass can yield several draft
    tokens. The tokens its cache lags behind (the catch-up) go into the same decode as the first
    draft step. It stops after an end-of-generation token, or where the draft's top probability
    falls under ``p_min`` (llama.cpp's rule) once ``need`` tokens are drafted. The draft's
    choices see the generation's logit bias, as the target's do.

    ``checks``: the most guess tokens one step checks (None: ``rules.ngram_tokens``; 0: none).
    A step over more rows is not always nearly free: on a CPU a Q4_K_M draft's two-row decode
    costs 2.4x its one-row decode, so there the checks cost more than the agreed tokens save
    (k auto's controller prices them for a fixed k, ``Control.base_drafter``). They never change which tokens
    are drafted: an agreed guess token is the draft's own greedy token."""

    pacer = None  # a fixed k's (k auto paces it from outside: ``fly_cpp.drafters.paced``)

    def __init__(self, draft_model: DraftModel, rules: DraftRules, checks: int | None = None) -> None:
        self.draft_model = draft_model
        self.rules = rules
        self.checks = rules.ngram_tokens if checks is None else checks
        self.index = ngram.Index(rules.ngram_max)

    @property
    def bias(self) -> LogitBias:
        return self.draft_model.bias

    @property
    def model(self) -> ModelDrafter:
        """The drafter whose model k auto drives step by step: this one."""
        return self

    def begin(self, prompt: Sequence[int]) -> None:
        self.draft_model.prefill(prompt)

    def lag(self, committed: Sequence[int]) -> int:
        return self.draft_model.lag(committed)

    def draft(self, committed: Sequence[int], limit: int, need: int = 0, confident: bool = False,
              checks: int | None = None, clock: Callable[[], float] | None = None) -> Draft:
        """Up to ``limit`` tokens; ``confident``: also keep the draft's confidence in each;
        ``checks``: the most guess tokens a step checks this time (None: the drafter's own);
        ``clock``: step in Python and time each decode by it (``Draft.steps``), the same tokens."""
        if limit <= 0:
            return Draft()
        drafting, model = self.rules, self.draft_model
        checks = self.checks if checks is None else checks
        catchup = model.start(committed)
        want_confidence = confident or drafting.p_min > 0
        ran = None if clock is not None else model.run(committed, limit, need, drafting, want_confidence, checks)
        steps: list[tuple[int, float]] = []
        if ran is not None:
            out, confidences = ran
        else:  # stepped in Python (the native run's reference): the plain pace, its guesses as found
            pace = Pace((lambda history, room: self.index.match(history, room)[1]) if drafting.ngram else None, checks)
            rules = Rules(limit, need, drafting.p_min, want_confidence)
            out, confidences, steps = draft_steps(model, committed, rules, pace, clock, catchup)
        out = out[:limit]
        return Draft(out, (confidences or [None] * len(out))[: len(out)], by_model=True, steps=tuple(steps))

    def own(self, committed: Sequence[int], limit: int, need: int = 0, confident: bool = False,
            checks: int | None = None, clock: Callable[[], float] | None = None) -> Draft:
        """The model's own draft (``draft``: the guesses it checks are its own choices too)."""
        return self.draft(committed, limit, need, confident, checks, clock)

    def candidate(self, committed: Sequence[int]) -> int:
        return self.draft_model.candidate(committed)

    def shift(self, keep: int, drop: int) -> None:
        self.draft_model.shift(keep, drop)

    def accept(self, report: Report) -> None:
        pass
