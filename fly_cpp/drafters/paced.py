"""k auto's drafter: what the pacer (``fly_cpp.kauto.pacer``) plans each round, drafted.

With the draft model, or the target's own MTP head (``fly_cpp.drafters.mtp.MtpHead``, the same
shape), it drives the model one ``step`` at a time, asking the pacer after each step whether
one more is worth its measured cost, and leaves out trailing tokens not worth verifying. It tells the pacer how each round went (``accept``), with what the round wrote: the
token trimming left out and an n-gram guess it looked up but did not verify are judged by it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from time import perf_counter, thread_time

from fly_cpp.drafters import ngram
from fly_cpp.drafters.seam import BaseDrafter, Draft, ModelDrafting, Report
from fly_cpp.drafters.steps import Pace, Rules, Stepped, draft_steps
from fly_cpp.kauto.pacer import DRAFTS, Pacer


class PacedDrafter:
    """Drafts what the pacer plans each round, with the draft model or the MTP head (when there
    is one) or n-gram lookup, and tells the pacer how each round went (``accept``). Drafting with the draft
    model it drives the model one step at a time (``DraftModel.step``), asking the pacer after
    each step whether one more is worth its cost, and leaves out trailing tokens not worth
    verifying."""

    def __init__(self, inner: BaseDrafter, pacer: Pacer, ngram_max: int, ngram_tokens: int,
                 use_ngram: bool, now: Callable[[], float] = perf_counter,
                 cpu: Callable[[], float] = thread_time) -> None:
        """One per generation; the pacer carries over from one to the next. ``now``: the clock
        draft steps are timed by (a replay's simulated one); ``cpu``: the one planning is timed by
        (this thread's CPU time: a server's other threads hold the interpreter at times, and a
        plan timed by the wall clock then cost a stall that was not its own, ~2 ms, priced into
        every drafting round after it)."""
        self.inner, self.pacer, self.now, self.cpu = inner, pacer, now, cpu
        # this round's planning and lookup, where it is what a planned round costs more than a rest's
        # round: a plan that drafted nothing and priced no rest (None: not this round)
        self._planning: float | None = None
        pacer.begin()
        self.model = inner.model
        self.ngram_tokens, self.use_ngram = ngram_tokens, use_ngram
        index = inner.index  # the drafter's own, over the same text: indexed once
        self.index = index if index.max_n == ngram_max else ngram.Index(ngram_max)
        self.kind = "target"  # this round's plan
        self.last_kind = "target"  # the last round's plan, once it is over
        self.confidences: list[float | None] = []
        # a round's draft, where it starts and the token trimming left out with its confidence:
        # whether the target then wrote that token is told by the round's committed tokens
        self._unverified: tuple[int, list[int], int, float] | None = None
        self._guessed: tuple[int, list[int], int] | None = None  # an n-gram guess the round did not verify, where, its match

    def begin(self, prompt: Sequence[int]) -> None:
        """The draft model's cache brought to the prompt before the rounds, unless drafting
        has lost to the target alone over a long run on this pair and verification is exact:
        the rounds then rest, and the draft catches up in the first one that drafts. Where no
        round drafts, that prefill was work for nothing, and it evicted the target's weights
        from the CPU's caches for the first decodes (the kit's ``fast`` pair, a 29 MB target
        beside a 32 MB L3: k auto resting throughout ran 0.974x the target alone with the
        prefill, 0.998x without). A loosening rule asks the draft model for its token wherever
        the target was unsure, drafting or not, so there the draft needs the prompt anyway
        (caught up inside the first ask it cost the Q4_K_M pair a third of its speed)."""
        loosens = self.model is not None and self.model.rules.loosens
        if loosens or not (self.pacer.lost_long() or self.pacer.rest > 0):  # a rest goes on into this text
            self.inner.begin(prompt)

    def candidate(self, committed: Sequence[int]) -> int | None:
        return self.inner.candidate(committed)

    def shift(self, keep: int, drop: int) -> None:
        """A context shift moved the text: what was left to learn by position is dropped."""
        self._unverified = self._guessed = None
        self.inner.shift(keep, drop)

    def draft(self, committed: Sequence[int], limit: int, need: int = 0) -> Draft:
        guess: list[int] = []
        matched = 0  # the length of the n-gram match the guess continues

        def lookup() -> tuple[int, int]:
            nonlocal matched
            matched, found = self.index.match(committed, min(self.ngram_tokens, limit))
            guess.extend(found)
            return len(found), matched

        model = self.model
        self.pacer.costs.at(len(committed))  # what this round's decodes cost depends on the context they attend over
        t0 = self.cpu()  # (the costs are loaded on first use, above: not a plan's work)
        self.kind, n = self.pacer.plan(limit, lambda: model.lag(committed) if model is not None else 0,
                                       lookup if self.use_ngram else lambda: (0, 0), model is not None, self.use_ngram)
        if need > 0 and model is not None and self.kind not in DRAFTS:
            self.kind, n = "draft", limit  # an open window is completed by the draft model, whatever pays
        if self.kind == "steady":
            n = max(n, min(need, limit))
        if self.kind != "ngram" and guess:
            self._guessed = (len(committed), guess, matched)
        if self.pacer.planned and self.pacer.rest == 0 and self.kind not in DRAFTS:  # a rest's price is its rounds'
            self._planning = self.cpu() - t0
        if self.kind == "ngram":
            out = self.inner.bias.cut(guess[:n])  # not past a token the logit bias bans
            self.confidences = [None] * len(out)
            return Draft(out, list(self.confidences))
        if self.kind in DRAFTS and model is not None:
            if self.kind in ("draft", "explore"):
                found = self._paced(model, committed, n, need)
            else:  # the draft's own tokens (in one native run where it can), checking the guess tokens that pay as ``_paced`` does
                checks = self.pacer.guess_length(model.rules.ngram_tokens, model.lag(committed))
                costs, alone = self.pacer.costs, self.pacer.sharing == 1  # a shared step's cost is not its own
                timed = alone and not costs.draft_checked  # its timed steps check a cached draft curve
                found = model.own(committed, n, need, confident=True, checks=checks, clock=self.now if timed else None)
                for rows, seconds in found.steps:
                    costs.observe_draft(rows, seconds)
                self.pacer.probed(found.confidences[0] if found.confidences else None)
            self.confidences = list(found.confidences)
            return found
        return Draft(alone=1 + self.pacer.rest if self.kind == "target" else 0)

    def _paced(self, drafter: ModelDrafting, committed: Sequence[int], limit: int, need: int) -> Draft:
        """The draft model's tokens, step by step while one more is worth its cost (and while
        ``need`` are owed); then the prefix worth verifying."""
        pacer, drafting = self.pacer, drafter.rules
        pace = _Paced(pacer, drafter.index if drafting.ngram else None, drafting.ngram_tokens, need)
        out, confidences, _ = draft_steps(drafter.draft_model, committed, Rules(limit, need, drafting.p_min, True), pace,
                                          self.now)
        chances = pace.chances
        out = out[:limit]
        pacer.probed(confidences[0] if confidences else None)
        while len(chances) < len(out):  # tokens after the last decision (end of text, limit)
            q = confidences[len(chances)] if len(chances) < len(confidences) else None
            chances.append((chances[-1] if chances else 1.0) * pacer.model(q))
        n = max(pacer.trim(chances[: len(out)]), min(need, len(out)), pacer.verifies(len(out)))
        if n < len(out) and n < len(confidences):
            self._unverified = (len(committed), out[:n], out[n], confidences[n])
        return Draft(out[:n], list(confidences[:n]), by_model=True)

    def _learn_guess(self, committed: Sequence[int]) -> None:
        """An n-gram guess the round looked up but did not verify is judged by the tokens
        it wrote, as the target would have judged it: without this, guesses that a few
        misses made not worth verifying would never be tried again (with no draft model, n-gram
        lookup, the only speculation there, would stay off for the rest of the engine's life).
        With a draft model too: the draft checks the guesses it drafts from (``guess_checked``),
        but a guess verified alone, with no draft step, pays where drafting does not (a
        compute-bound target). Weighed by one mean over all guesses this evidence made lone
        guesses win rounds the drafts would have won (replay: 1.68x -> 1.64x the target on the
        F16 pair); by the length of the match they continue (``Guesses``) it does not."""
        if self._guessed is None:
            return
        start, guess, matched = self._guessed
        self._guessed = None
        self.pacer.evidence.guess_written(guess, committed[start:start + len(guess)], matched)

    def _learn_left_out(self, committed: Sequence[int]) -> None:
        """A token left out of the round's batch is evidence too: when every drafted token
        before it was kept, the token the target wrote in its place says whether it would have
        been kept (exactly). Without this, the confidences whose tokens always get trimmed would
        keep their prior forever, right or wrong, and the drafts would stay short."""
        if self._unverified is None:
            return
        start, verified, token, confidence = self._unverified
        self._unverified = None
        end = start + len(verified)
        if len(committed) > end and list(committed[start:end]) == verified:
            self.pacer.model.observe([confidence], int(committed[end] == token))

    def accept(self, report: Report) -> None:
        """A round: its target decode teaches the costs by the rows decoded (more than verified
        where the batch was padded, ``fly_cpp.rounds.shape``; not under load), and the drafts verified
        teach acceptance. A run of the rounds left to the target alone (``Report.rounds``)
        takes them from the pacer's rest and teaches the cost of a one-row decode and the host
        time of a round as that many rounds of its means would (at its middle depth): were the
        rounds planned in between the only ones to teach host time, theirs (a verification, the
        pacer's bookkeeping) would price the target alone as a Python round, not a run's token,
        and drafting would look cheaper next to it than it is."""
        costs, warm, rounds = self.pacer.costs, False, report.rounds
        committed = report.committed
        written = committed if rounds == 1 else committed[: len(committed) - rounds + 1]  # the planned round's text
        if rounds > 1:
            self.pacer.ran(rounds - 1)
            costs.at(len(written) - 1 + rounds // 2)
        if self.pacer.sharing == 1:  # a shared decode's timings are the others' too: nothing to learn from them
            warm = costs.observe_target(report.decoded_rows, report.target_seconds / rounds, rounds)
            costs.drafted(self.kind in DRAFTS and self.model is not None)
            costs.observe_host((report.round_seconds - report.draft_seconds - report.target_seconds) / rounds, rounds)
            if rounds == 1 and self._planning is not None:
                # what every planned round costs more than a rest's (the bundled pair: ~0.3 ms beside a 0.3 ms decode)
                costs.observe_planning(self._planning)
        verified = self.confidences[: report.verified]  # a draft may have been dropped (n_min)
        self.pacer.observe(self.kind, verified, report.kept, report.emitted, report.round_seconds, warm, rounds)
        self._learn_left_out(written)
        self._learn_guess(written)
        self.last_kind, self.kind, self.confidences = self.kind, "target", []  # a round not drafted decodes alone
        self._planning = None


class _Paced(Pace):
    """k auto's pace of the draft steps: a guess checked only as far as it pays (``Pacer.guess_length``),
    each step's price and each checked guess learned, and one more step taken only while it is
    worth its cost at the chance that every token so far is kept (``Pacer.more``)."""

    def __init__(self, pacer: Pacer, index: ngram.Index | None, most: int, need: int) -> None:
        super().__init__()
        self.pacer, self.index, self.most, self.need = pacer, index, most, need
        self.found: list[int] = []  # this step's guess as looked up, before it was cut to what pays
        self.chances: list[float] = []  # the chance that drafted tokens 0..i are all kept

    def guess(self, history: Sequence[int], room: int, lag: int) -> list[int]:
        room = min(room, self.most)
        self.found = self.index.match(history, room)[1] if self.index is not None and room > 0 else []
        return self.found[: self.pacer.guess_length(len(self.found), lag)] if self.found else []

    def stepped(self, s: Stepped, guess: Sequence[int], seconds: float) -> None:
        pacer = self.pacer
        if self.found:
            pacer.evidence.guess_checked(self.found, len(guess), s.agree, s.token)
        self.found = []
        if pacer.sharing == 1:  # a draft step's cost, with its host work (a shared one's is not its own)
            pacer.costs.observe_draft(s.rows, seconds)

    def more(self, out: Sequence[int], new: Sequence[int], s: Stepped) -> bool:
        pacer, chances = self.pacer, self.chances
        for q in s.sure[: len(new)]:
            chances.append((chances[-1] if chances else 1.0) * pacer.model(q))
        # the next tokens are likely as predictable as the last one was
        return len(out) < self.need or pacer.more(chances, pacer.model(s.sure[len(new) - 1] if s.sure else None))
