"""The pair's own drafter (``PairDrafter``): n-gram lookup chained with a model that drafts one
decode at a time (a ``fly_cpp.drafters.steps.Stepper``: the draft model or the target's MTP
head), as llama.cpp chains its drafters, drafting a fixed k or what k auto's pacer
(``fly_cpp.kauto.pacer``) plans each round.

Paced, it drives the stepper one step at a time, asking the pacer after each step whether one
more is worth its measured cost, and leaves out trailing tokens not worth verifying. It tells the
pacer how each round went (``accept``), with what the round wrote: the token trimming left out
and an n-gram guess it looked up but did not verify are judged by it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from time import perf_counter, thread_time

from fly_cpp.backend.sampling import NO_BIAS, LogitBias
from fly_cpp.drafters import ngram
from fly_cpp.drafters.seam import Draft, DraftRules, Report
from fly_cpp.drafters.steps import Pace, Rules, Stepped, Stepper, draft_steps
from fly_cpp.drafters.tree import draft_tree
from fly_cpp.kauto.pacer import DRAFTS, Pacer


class PairDrafter:
    """Drafts with ``stepper`` (None: n-gram lookup alone) under ``rules``: a fixed k where
    ``pacer`` is None, else what the pacer plans each round.

    A fixed k chains lookup and the stepper: a stepper that checks guesses (the draft model)
    checks an n-gram guess in the same decode as its own next token, so that one draft decode can
    yield several tokens (``checks``: the most guess tokens one step checks; None:
    ``rules.ngram_tokens``; 0: none. On a CPU a Q4_K_M draft's two-row decode costs 2.4x its
    one-row decode, so there checks cost more than the agreed tokens save, and k auto's
    controller prices them, ``Control.drafter``; an agreed guess token is the draft's own, so
    they never change which tokens are drafted); before one that cannot (the MTP head: each of
    its rows needs the state the row before produced), a guess found is the round's draft. The
    stepper's tokens stop after an end-of-generation token, or where its top probability falls
    under ``p_min`` (llama.cpp's rule) once ``need`` tokens are drafted. Its choices, and the
    guesses, see the generation's logit bias (the stepper's; ``bias`` for lookup alone).

    One per generation; a pacer carries over from one to the next. ``now``: the clock paced draft
    steps are timed by (a replay's simulated one); ``cpu``: the one planning is timed by (this
    thread's CPU time: a server's other threads hold the interpreter at times, and a plan timed by
    the wall clock then cost a stall that was not its own, ~2 ms, priced into every drafting round
    after it)."""

    def __init__(self, stepper: Stepper | None, rules: DraftRules, checks: int | None = None, pacer: Pacer | None = None,
                 bias: LogitBias = NO_BIAS, now: Callable[[], float] = perf_counter,
                 cpu: Callable[[], float] = thread_time) -> None:
        self.stepper, self.rules, self.pacer, self.now, self.cpu = stepper, rules, pacer, now, cpu
        self.bias = stepper.bias if stepper is not None else bias
        self.checks = rules.ngram_tokens if checks is None else checks
        self.index = ngram.Index(rules.ngram_max)
        self.kind = "target"  # this round's plan (paced)
        self.last_kind = "target"  # the last round's plan, once it is over
        self.confidences: list[float | None] = []
        # this round's planning and lookup, where it is what a planned round costs more than a rest's
        # round: a plan that drafted nothing and priced no rest (None: not this round)
        self._planning: float | None = None
        # a round's draft, where it starts and the token trimming left out with its confidence:
        # whether the target then wrote that token is told by the round's committed tokens
        self._unverified: tuple[int, list[int], int, float] | None = None
        self._guessed: tuple[int, list[int], int] | None = None  # an n-gram guess the round did not verify, where, its match
        if pacer is not None:
            pacer.begin()

    # -- the seam ----------------------------------------------------------------------------

    def begin(self, prompt: Sequence[int]) -> None:
        """The stepper's cache brought to the prompt before the rounds, unless k auto is resting
        (the target alone decodes until its rest ends, and it goes on into this text) and
        verification is exact: the draft then catches up in the first round that drafts. Where
        no round drafts, that prefill was work for nothing, and it evicted the target's weights
        from the CPU's caches for the first decodes (the kit's ``fast`` pair, a 29 MB target
        beside a 32 MB L3: k auto resting throughout ran 0.974x the target alone with the
        prefill, 0.998x without). A loosening rule asks the draft model for its token wherever
        the target was unsure, drafting or not, so there the draft needs the prompt anyway
        (caught up inside the first ask it cost the Q4_K_M pair a third of its speed)."""
        if self.stepper is None:
            return
        pacer = self.pacer
        if pacer is None or self.rules.loosens or pacer.rest <= 0:
            self.stepper.prefill(prompt)

    def draft(self, committed: Sequence[int], limit: int, need: int = 0) -> Draft:
        return self.fixed(committed, limit, need) if self.pacer is None else self._planned(committed, limit, need)

    def candidate(self, committed: Sequence[int]) -> int | None:
        return self.stepper.candidate(committed) if self.stepper is not None else None

    def shift(self, keep: int, drop: int) -> None:
        """A context shift moved the text: what was left to learn by position is dropped."""
        self._unverified = self._guessed = None
        if self.stepper is not None:
            self.stepper.shift(keep, drop)

    def accept(self, report: Report) -> None:
        if self.pacer is not None:
            self._learn(self.pacer, report)

    # -- a fixed k ---------------------------------------------------------------------------

    def fixed(self, committed: Sequence[int], limit: int, need: int = 0) -> Draft:
        """A fixed k's draft of up to ``limit`` tokens: a tree where the rules draft one
        (``fly_cpp.drafters.tree``), else a guess found first where the stepper cannot check one
        (an open window, ``need``, is completed by the stepper's own tokens), else the stepper's own."""
        if limit <= 0:
            return Draft()
        stepper = self.stepper
        if stepper is not None and self.rules.tree and need == 0 and limit > self.rules.tree + 1:
            return draft_tree(stepper, committed, limit, self.rules.tree)
        if self.rules.ngram and (stepper is None or (need == 0 and not stepper.checks_guesses)):
            found = self.bias.cut(self.index.match(committed, min(self.rules.ngram_tokens, limit))[1])
            if found or stepper is None:
                return Draft(found, [None] * len(found))
        return self.own(committed, limit, need)

    def own(self, committed: Sequence[int], limit: int, need: int = 0, confident: bool = False,
            checks: int | None = None, clock: Callable[[], float] | None = None) -> Draft:
        """Up to ``limit`` of the stepper's own tokens after ``committed`` (in one native run where
        it can, ``DraftModel.run``; the guesses it checks are its own choices too). ``confident``:
        also keep its confidence in each; ``checks``: the most guess tokens a step checks this time
        (None: the drafter's own); ``clock``: step in Python and time each decode by it
        (``Draft.steps``), the same tokens."""
        stepper, rules = self.stepper, self.rules
        if limit <= 0 or stepper is None:
            return Draft()
        checks = self.checks if checks is None else checks
        catchup = stepper.start(committed)
        confident = confident or rules.p_min > 0
        ran = None if clock is not None else stepper.run(committed, limit, need, rules, confident, checks)
        steps: list[tuple[int, float]] = []
        if ran is not None:
            out, confidences = ran
        else:  # stepped in Python (the native run's reference): the plain pace, its guesses as found
            pace = Pace((lambda history, room: self.index.match(history, room)[1]) if rules.ngram else None, checks)
            out, confidences, steps = draft_steps(stepper, committed, Rules(limit, need, rules.p_min, confident, stepper.end),
                                                  pace, clock, catchup)
        out = out[:limit]
        padded: list[float | None] = [*confidences, *[None] * (len(out) - len(confidences))]
        return Draft(out, padded[: len(out)], by_model=True, steps=tuple(steps))

    # -- k auto ------------------------------------------------------------------------------

    def _planned(self, committed: Sequence[int], limit: int, need: int) -> Draft:
        """What the pacer plans for this round, drafted."""
        pacer, stepper = self.pacer, self.stepper
        assert pacer is not None
        guess: list[int] = []
        matched = 0  # the length of the n-gram match the guess continues

        def lookup() -> tuple[int, int]:
            nonlocal matched
            matched, found = self.index.match(committed, min(self.rules.ngram_tokens, limit))
            guess.extend(found)
            return len(found), matched

        pacer.costs.at(len(committed))  # what this round's decodes cost depends on the context they attend over
        t0 = self.cpu()  # (the costs are loaded on first use, above: not a plan's work)
        has_model, use_ngram = stepper is not None, self.rules.ngram
        self.kind, n = pacer.plan(limit, lambda: stepper.lag(committed) if stepper is not None else 0,
                                  lookup if use_ngram else lambda: (0, 0), has_model)
        if need > 0 and has_model and self.kind not in DRAFTS:
            self.kind, n = "draft", limit  # an open window is completed by the draft model, whatever pays
        if self.kind == "steady":
            n = max(n, min(need, limit))
        if self.kind != "ngram" and guess:
            self._guessed = (len(committed), guess, matched)
        if pacer.planned and pacer.rest == 0 and self.kind not in DRAFTS:  # a rest's price is its rounds'
            self._planning = self.cpu() - t0
        if self.kind == "ngram":
            out = self.bias.cut(guess[:n])  # not past a token the logit bias bans
            self.confidences = [None] * len(out)
            return Draft(out, list(self.confidences))
        if self.kind in DRAFTS and stepper is not None:
            if self.kind in ("draft", "explore"):
                # an exploration under an unchecked draft price drafts all it was planned: its warm steps check it
                unchecked = self.kind == "explore" and not pacer.costs.draft_checked
                found = self._paced(pacer, stepper, committed, n, n if unchecked else need)
            else:  # the stepper's own tokens (one native run where it can), checking the guess tokens that pay, as ``_paced``
                checks = pacer.guess_length(self.rules.ngram_tokens, stepper.lag(committed))
                costs, alone = pacer.costs, pacer.sharing == 1  # a shared step's cost is not its own
                timed = alone and not costs.draft_checked  # its timed steps check a cached draft curve
                found = self.own(committed, n, need, confident=True, checks=checks, clock=self.now if timed else None)
                for rows, seconds in found.steps:
                    costs.observe_draft(rows, seconds)
                pacer.probed(found.confidences[0] if found.confidences else None)
            self.confidences = list(found.confidences)
            return found
        return Draft(alone=1 + pacer.rest if self.kind == "target" else 0)

    def _paced(self, pacer: Pacer, stepper: Stepper, committed: Sequence[int], limit: int, need: int) -> Draft:
        """The stepper's tokens, step by step while one more is worth its cost (and while ``need``
        are owed); then the prefix worth verifying."""
        rules = self.rules
        pace = _Paced(pacer, self.index if rules.ngram else None, rules.ngram_tokens, need)
        out, confidences, _ = draft_steps(stepper, committed, Rules(limit, need, rules.p_min, True, stepper.end), pace,
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

    def _learn(self, pacer: Pacer, report: Report) -> None:
        """A round: its target decode teaches the costs by the rows decoded (more than verified
        where the batch was padded, ``fly_cpp.rounds.shape``; not under load), and the drafts verified
        teach acceptance. A run of the rounds left to the target alone (``Report.rounds``)
        takes them from the pacer's rest and teaches the cost of a one-row decode and the host
        time of a round as that many rounds of its means would (at its middle depth): were the
        rounds planned in between the only ones to teach host time, theirs (a verification, the
        pacer's bookkeeping) would price the target alone as a Python round, not a run's token,
        and drafting would look cheaper next to it than it is."""
        costs, warm, rounds = pacer.costs, False, report.rounds
        committed = report.committed
        written = committed if rounds == 1 else committed[: len(committed) - rounds + 1]  # the planned round's text
        if rounds > 1:
            pacer.ran(rounds - 1)
            costs.at(len(written) - 1 + rounds // 2)
        if pacer.sharing == 1:  # a shared decode's timings are the others' too: nothing to learn from them
            warm = costs.observe_target(report.decoded_rows, report.target_seconds / rounds, rounds)
            costs.drafted(self.kind in DRAFTS and self.stepper is not None)
            costs.observe_host((report.round_seconds - report.draft_seconds - report.target_seconds) / rounds, rounds)
            if rounds == 1 and self._planning is not None:
                # what every planned round costs more than a rest's (the bundled pair: ~0.3 ms beside a 0.3 ms decode)
                costs.observe_planning(self._planning)
        verified = self.confidences[: report.verified]  # a draft may have been dropped (n_min)
        pacer.observe(self.kind, verified, report.kept, report.emitted, report.round_seconds, warm, rounds)
        self._learn_left_out(pacer, written)
        self._learn_guess(pacer, written)
        if self.rules.ngram:
            self._learn_rest(pacer, committed, len(committed) - rounds + int(pacer.planned))
        self.last_kind, self.kind, self.confidences = self.kind, "target", []  # a round not drafted decodes alone
        self._planning = None

    def _learn_left_out(self, pacer: Pacer, committed: Sequence[int]) -> None:
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
            pacer.model.observe([confidence], int(committed[end] == token))

    def _learn_guess(self, pacer: Pacer, committed: Sequence[int]) -> None:
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
        pacer.evidence.guess_written(guess, committed[start:start + len(guess)], matched)

    def _learn_rest(self, pacer: Pacer, committed: Sequence[int], start: int) -> None:
        """The rounds of a rest looked nothing up: the guess the index held at each of their
        positions is judged by the token written there, as a planned round's lookup is, and the
        rest ends where the guesses have come to pay (``Pacer.taught``). Were they not, a rest
        would teach the guesses nothing, and only rests cut short to look one up would (the
        bundled pair through ``serve -np 1``: 0.94x its target alone)."""
        if start >= len(committed):  # a planned round's tokens: its lookup, or its verification, judged them
            return
        found = self.index.walk(committed, start)
        if found:
            pacer.evidence.guesses.judged(found)
            pacer.taught()


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
