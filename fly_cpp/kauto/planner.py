"""k auto's planner: one pure function, ``plan(draw, costs, limits) -> Plan``.

Each round it picks the plan with the most expected tokens per second (``fly_cpp.kauto.worth``) at
the costs (``fly_cpp.kauto.costs``) and at one draw from what k auto believes (``fly_cpp.kauto.belief``:
Thompson sampling). Exploration is nothing but that draw: where the evidence is thin or old,
the drawn acceptance (or price) is often far enough from its mean to change the plan, and where
it is ample and fresh it seldom is. The plans:

- ``target``: a plain target decode, no draft call at all, and ``rest`` more rounds after it
  left unplanned where no draw could change the plan before then;
- ``ngram``: an n-gram guess verified alone (no draft decode);
- ``draft``: drafting with the draft model step by step while a step pays at the mean (or one
  probing step, where the draft's confidence in its first token tells enough);
- ``explore``: drafting step by step, up to the length the draw (not the mean) says pays, every
  drafted token verified (what it teaches is the point);
- ``steady``: a GPU's rounds of one length a generation (``Limits.width``): there a decode
  costs more whenever the batch's shape changes, so the length is a constraint of the plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fly_cpp.kauto import worth
from fly_cpp.kauto.belief import AGE, UNCHECKED_SPREAD, Draw, above
from fly_cpp.kauto.costs import Costs
from fly_cpp.kauto.evidence import BINS

# the resolution of acceptance in pricing a rest (not a tuning): four steps a confidence bin
GRID = 4 * BINS
# the longest rest planned at once: ten spans of the evidence's memory, past which a draw is the
# prior's (a generation's own end, the loop's budget, usually comes first)
REST_MAX = round(10 / (1 - AGE))
# the rounds a rest's chances are computed over, nearest first, each span's a prefix of the next's
# (the same numbers: a planned round on the bundled pair spent 0.5 ms on 1,000 rounds' of them)
_SPANS = tuple(sorted({min(64, REST_MAX), min(256, REST_MAX), REST_MAX}))


@dataclass(frozen=True)
class Limits:
    """What bounds this round: the tokens it may draft, the draft model (if any) and the tokens
    it must catch up on, the n-gram guess found (and the match it continues), the steady length."""

    limit: int
    has_draft: bool = False
    lag: int = 0
    guess: int = 0
    matched: int = 0
    width: int = 0
    shared: bool = False  # the round's decodes are shared with other sequences' (no price of its own is learned)
    rested: bool = False  # a rest just ended: this is the round its sampled length said a draw would draft in


@dataclass(frozen=True)
class Plan:
    kind: str  # target | ngram | draft | explore | steady
    n: int = 0
    rest: int = 0  # a target plan: rounds after this one left to the target alone, unplanned
    then: bool = False  # after the rest, a round that tries drafting (its length was sampled as the wait for one)


TARGET = Plan("target")


def plan(draw: Draw, costs: Costs, lim: Limits) -> Plan:
    """This round's plan at the draw's acceptance and prices."""
    limit = lim.limit
    if limit <= 0:
        return TARGET
    if lim.width > 0:
        return Plan("steady", min(lim.width, limit))
    # the target alone, at the drawn one-row price (under load no decode prices it: its learned one)
    alone = worth.alone(costs) * (1.0 if lim.shared else draw.alone_factor)
    c = draw.correction  # what speculating rounds realized
    guesses_may_pay = worth.best(costs, draw.surest, limit, 0.0, 0.0, floor=alone)[1] > 0
    g_rate, g = worth.best(costs, draw.guess, min(lim.guess, limit), 0.0, 0.0, floor=alone / c) \
        if guesses_may_pay and lim.guess else (0.0, 0)
    if lim.has_draft:
        first, step = costs.draft(lim.lag + 1) * draw.draft_factor, costs.draft(1) * draw.draft_factor
        mean_rate, mean_h = worth.best(costs, draw.mean, limit, first, step, floor=alone / c)
        if g:  # the draft's first step checks the guess (``fly_cpp.drafters.drafter``), and drafting goes on past it
            chained = worth.best(costs, draw.mean, limit, costs.draft(lim.lag + 1 + g) * draw.draft_factor, step,
                                 [draw.guess] * g, floor=alone / c)
            mean_rate, mean_h = max((mean_rate, mean_h), chained)
        # what the draft lags by is a debt of the rounds decoded alone, paid whenever it drafts
        # again, not a price of drafting: priced into a try, it grew with every round alone until
        # no try could pay (test_pacing: a text that turned predictable again was decoded alone)
        drawn_rate, h = worth.best(costs, draw.accept, limit, step, step, floor=alone / c)
        if g and g_rate >= max(mean_rate, drawn_rate) and g_rate * c > alone:
            return Plan("ngram", g)
        if mean_h:
            return Plan("draft", limit)
        if draw.firsts_seen and worth.probe(costs, max(draw.pace, alone) / c, draw.firsts, draw.by_bin, limit, first, step):
            return Plan("draft", limit)
        if h or lim.rested:
            # under an unchecked draft price a try also checks it: its first step catches up cold,
            # the warm steps after it price the curve (``Costs.observe_draft``)
            return Plan("explore", max(h, 1, costs.draft_checks_left() + 1 if draw.spread else 0))
    elif g and g_rate * c > alone:
        return Plan("ngram", g)
    if guesses_may_pay:  # guesses are looked up every round: no rest
        return TARGET
    rest, then = _rest(draw, costs, lim)
    return Plan("target", rest=rest, then=then)


def _rest(draw: Draw, costs: Costs, lim: Limits) -> tuple[int, bool]:
    """Rounds after this one that are left to the target alone unplanned: as many as fresh draws
    would go on planning the target alone, sampled at once (``Draw.u``), and whether the round
    after them drafts (its draw ended the rest). Each round without a draft ages the draft's
    evidence (``Draw.aged``), so a draw that tries one comes with a chance that grows round by
    round; what could not pay even if always right never does (REST_MAX). The n-gram guesses end
    no rest here: its rounds teach them, and a rest ends once they would pay (``Pacer.taught``)."""
    if lim.shared or draw.spread >= UNCHECKED_SPREAD:  # an unchecked draft price is drawn anew every round
        return 0, False
    if not lim.has_draft:
        return REST_MAX, False
    alone, step = worth.alone(costs), costs.draft(1)  # the learned prices: the rest's rounds draw their own
    if worth.best(costs, draw.mean, lim.limit, step, step, floor=alone / draw.correction)[1]:
        return 0, False  # a draw of the prices chose the target alone: it is tried, then plans resume
    # drafting's own rate by acceptance (GRID steps, nondecreasing; once floored at the target alone's,
    # when any correction over 1 made every acceptance pay: rests of 0 and 1-token tries, 0.23x the
    # target alone under serve): a round tries it where its rate x the correction beats the target alone
    rates = worth.tops(costs, [i / GRID for i in range(GRID + 1)], lim.limit, step, step)
    for most in _SPANS:  # the nearest rounds first: a rest usually ends long before REST_MAX
        mean, sd, correction = draw.aged(most)
        pays = np.searchsorted(rates, alone / correction * (1 + 1e-9), side="right")  # the first acceptance that pays
        chance = np.where(pays <= GRID, above(pays / GRID, mean, sd), 0.0)
        below = np.flatnonzero(np.cumprod(1 - chance) < draw.u)  # every draw up to round r plans the target alone
        if len(below):
            return int(below[0]), True
    return REST_MAX, False
