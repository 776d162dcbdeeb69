"""The draft model's context one decode at a time (``DraftModel.step``), a
``fly_cpp.drafters.steps.Stepper``, with its native run of a fixed k's steps (``DraftModel.run``);
the pair's drafter (``fly_cpp.drafters.drafter``) drafts with it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fly_cpp.backend import native, rows
from fly_cpp.backend.cache import common_prefix
from fly_cpp.backend.context import Context
from fly_cpp.backend.sampling import NO_BIAS, LogitBias, Sampler
from fly_cpp.drafters.seam import DraftRules
from fly_cpp.drafters.steps import Stepped


class DraftModel:
    """The draft model's context, one decode at a time. Its cache keeps the loop's invariant on
    its own tokens: after a step it holds everything drafted but the last token. ``path``: the
    text it last drafted along, each token past the common prefix its own greedy choice, so
    that its token after any prefix of that path is known without a decode. A step checks an
    n-gram guess in the same decode (``checks_guesses``)."""

    checks_guesses = True
    forks = True  # a tree's branch: its runner-up, drafted on from its cache cut back to the fork
    end = None  # its cache has the target's room: no bound of its own

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
             confident: bool = False, ranked: bool = False) -> Stepped:
        """Decode the catch-up, ``history[-1]`` and an n-gram ``guess`` in one batch; the cache
        then keeps ``history`` and the agreed part of the guess. ``confident``: also read the
        draft's top probability at the rows that matter; ``ranked``: also its runner-up after the
        agreed guess (``Stepped.second``)."""
        batch = [*catchup, history[-1], *guess]
        logits = raw = self.ctx.decode(batch, logits=len(guess) + 1)
        drawn = self.draws.drafts(logits[:, : self.n_vocab], history, guess) if self.draws is not None else None
        if self.bias:
            logits = self.bias.apply(logits[:, : self.n_vocab])
        best = rows.argmax(logits[:, : self.n_vocab]) if drawn is None else drawn  # (len(guess)+1,)
        agree = 0
        while agree < len(guess) and guess[agree] == best[agree]:
            agree += 1
        sure = [float(p) for p in rows.top_probability(logits[: agree + 1])] if confident else []
        second = self._runner_up(raw[agree, : self.n_vocab], logits[agree, : self.n_vocab],
                                 [*history, *guess[:agree]], int(best[agree])) if ranked else None
        self.ctx.truncate(len(history) + agree)  # invariant: the cache holds the new history but its last token
        if not (self._own <= len(history) <= len(self.path) and common_prefix(self.path, history) == len(history)):
            self._own = len(history)  # a new path, not the continuation of the last one
        self.path = [*history, *guess[:agree], int(best[agree])]
        return Stepped(best, agree, sure, len(batch), second)

    def _runner_up(self, raw: np.ndarray, biased: np.ndarray, history: Sequence[int], token: int) -> tuple[int, float] | None:
        """The draft's second choice after ``history`` (its first: ``token``) and how far its score
        lies under the first (``Sampler.ranked`` where it draws; the logits where it takes its
        argmax); None: no second."""
        if self.draws is not None:
            _, second, gap = self.draws.ranked(raw, history)
            return None if second < 0 else (second, gap)
        row = np.array(biased, dtype=np.float32)
        top = float(row[token])
        row[token] = -np.inf
        second = int(np.argmax(row))
        return (second, top - float(row[second])) if np.isfinite(row[second]) else None

    def run(self, committed: Sequence[int], limit: int, need: int, drafting: DraftRules,
            confident: bool, checks: int | None = None) -> tuple[list[int], list[float]] | None:
        """A fixed k's steps (``PairDrafter.own``) inside the native library, after ``start``: the same
        tokens and confidences, without returning to Python per step (``drafting``: the drafters'
        rules; ``checks``: the most n-gram guess tokens a step checks, None: ``drafting.ngram_tokens``).
        Sampled drafts are drawn there as ``step`` draws them (the target's chain and shared noise).
        None where the library cannot run them (no library, a logit bias, penalties or a bias on the
        sampled draws, a context it cannot drive, a longer n-gram than it looks up, no room in the
        cache); the caller then steps in Python."""
        n, draws = len(committed), self.draws
        if (not self.ctx.drafts_natively or self.bias or (draws is not None and draws.adjusts)
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
        if draws is not None:
            d = draws.settings
            rules.drawing(d.temperature, d.top_k, d.top_p, d.min_p, draws.seed)
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
