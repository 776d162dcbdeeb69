"""k auto's one objective: tokens per second, priced by the measured costs (``fly_cpp.kauto.costs``).

A round that drafts h tokens, each kept with probability a given that the earlier ones were,
emits 1 + a + a^2 + ... + a^h tokens in expected value, and costs the draft steps plus one
target decode of h+1 rows (and host work, and the switch to a batch after one-row decodes).

- Planning a round compares whole plans by their **rate**: expected tokens / expected seconds
  (``best``), the target alone being the plan to beat.
- Deciding inside a round (one more draft step? verify how many?) values the rest of the round
  at the **pace** the rounds keep: expected tokens - pace x seconds (``value``). That is the
  rate's linearisation at the pace: a step raises the rate exactly when it adds more tokens than
  the pace would make in its time. The same function values a probe (``probe``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from fly_cpp.kauto.costs import CHECK_TOLERANCE, Costs

# FLy's loosening under k auto with a draft model is priced (``loosening``) and kept only where its
# rate beats exact matching's by this much: a gain a calibration's timing noise cannot make up
LOOSE_MARGIN = 1.03


def kept(accepts: Iterable[float], expected: float = 1.0, chance: float = 1.0) -> Iterator[float]:
    """The expected tokens a round emits as its draft grows by one token at a time, the i-th
    new one kept with probability ``accepts[i]`` given the earlier ones were: ``expected``
    before it (the target's own token: 1), ``chance`` that every earlier one is kept. The one
    scan every price below makes (1 + a + a^2 + ... for a steady a)."""
    for accept in accepts:
        chance *= accept
        expected += chance
        yield expected


def alone(costs: Costs) -> float:
    """Tokens per second of a plain target decode (host time included), now: as a rest decodes
    it, unplanned (``Costs.planning`` is what a planned round costs more)."""
    return 1.0 / (costs.host + costs.target(1))


def slower_note(tokens_per_second: float, mean_drafted: float, mean_accepted: float, costs: Costs,
                auto: bool) -> str | None:
    """One line when a generation ran slower than the target alone would here (measured costs),
    saying why (draft cost and verification cost against one target decode) and what to try;
    None when it did not."""
    rate = alone(costs)
    single = 1.0 / rate
    if tokens_per_second <= 0 or tokens_per_second >= 0.95 * rate or mean_drafted <= 0:
        return None
    rows = max(int(round(mean_drafted)) + 1, 2)
    advice = ("k auto was still exploring whether drafting pays on this text" if auto else
              "try --k auto (it drafts only where that pays)") + ", or --mode target"
    return (f"{tokens_per_second:.1f} tok/s is slower than the target alone would be here (~{rate:.1f} tok/s): "
            f"a drafted token costs {costs.draft(1) / single:.2f} of a target decode and verifying {rows} rows "
            f"costs {costs.target(rows) / costs.target(1):.1f} decodes, for {mean_accepted:.2f} tokens per round; "
            f"{advice}")


def together(costs: Costs, accept: float, slots: int, h_max: int) -> int:
    """The draft length h <= h_max for ``slots`` sequences whose rounds draft together
    (``fly_cpp.engine.batchloop.Rounds``): each step one draft decode for all of them (the first also
    catching up one token each), then one target decode of every slot's h+1 rows, against a
    target decode of one row each. Here a drafted row costs what it adds to a batch that other
    slots' real rows already pay for. 0 unless the best h beats that by the tolerance of a price
    (``costs.CHECK_TOLERANCE``): on the F16 Qwen pair (2-core CPU) rounds drafted together ran
    0.84-0.94x drafting nothing at -np 2 and -np 4 (a cache per slot or one) where the cost curves
    priced them at 0.93-1.2x (the draft's batched steps cost 1.2-1.4x their calibrated price beside
    the target, and a round kept in step waits: docs/slots.md)."""
    plain = slots / (slots * costs.host + costs.target(slots))
    top, top_h = plain * CHECK_TOLERANCE, 0
    for h, expected in enumerate(kept(itertools.repeat(accept, h_max)), start=1):
        seconds = (slots * costs.host + costs.draft(2 * slots) + (h - 1) * costs.draft(slots)
                   + costs.target(slots * (h + 1)))
        if slots * expected / seconds > top:
            top, top_h = slots * expected / seconds, h
    return top_h


def best(costs: Costs, accept: float, h_max: int, first: float, step: float,
         lead: Sequence[float] = (), depths: Sequence[float] = (), floor: float | None = None) -> tuple[float, int]:
    """(tokens per second, h) of the best draft length h <= h_max for a round whose first draft
    step costs ``first`` seconds and later ones ``step``, each token kept with probability
    ``accept`` given the earlier ones were (or ``depths[i]`` for the i-th drafted token, where
    given). ``lead``: tokens the first step yields before its own (an n-gram guess it checks),
    each kept with its own probability. A batch after one-row decodes also pays for switching
    kinds, there and back (``Costs.entering``), and a recurrent state for going back after a
    rejection (``Costs.rollback``). ``floor``: the rate to beat (the target alone's by default)."""
    top, top_h = alone(costs) if floor is None else floor, 0
    own = itertools.chain(depths, itertools.repeat(accept))
    accepts = itertools.chain(lead[:h_max], itertools.islice(own, max(h_max - len(lead), 0)))
    for h, rate in rates(costs, accepts, first, step, len(lead), accept):
        if rate > top:
            top, top_h = rate, h
    return top, top_h


def tops(costs: Costs, accepts: Sequence[float], h_max: int, first: float, step: float) -> np.ndarray:
    """Drafting's best rate at each of ``accepts`` (a steady acceptance each), at once: the prices
    of h = 1 .. h_max found once, the tokens expected of each by acceptance as one array (the same
    sums in the same order as ``rates``: the same numbers to the digit). Unlike ``best``'s, not
    floored at the target alone's rate: the caller weighs it against a floor of its own."""
    a = np.asarray(accepts, dtype=np.float64)
    if h_max <= 0:
        return np.zeros(len(a))
    fixed = _fixed(costs)
    chances = np.cumprod(np.repeat(a[:, None], h_max, axis=1), axis=1)
    expected = np.cumsum(np.concatenate([np.ones((len(a), 1)), chances], axis=1), axis=1)[:, 1:]
    prices = np.array([[_seconds(costs, fixed, first, step, 0, h, accept) for h in range(1, h_max + 1)]
                       for accept in (a if costs.rollbacks is not None else a[:1])])
    return (expected / prices).max(axis=1)


def rates(costs: Costs, accepts: Iterable[float], first: float, step: float, lead: int,
          accept: float) -> Iterator[tuple[int, float]]:
    """(h, tokens per second) of a round drafting h = 1, 2, ... tokens, the i-th kept with
    probability ``accepts[i]`` given the earlier ones were: the first draft step costs ``first``
    (yielding the ``lead`` tokens before its own), later ones ``step``, and one target decode of
    h+1 rows verifies them (``best`` has the whole price)."""
    fixed = _fixed(costs)
    for h, expected in enumerate(kept(accepts), start=1):
        yield h, expected / _seconds(costs, fixed, first, step, lead, h, accept)


def _fixed(costs: Costs) -> float:
    """What any planned round costs beside its decodes: host time, planning, the switch to a batch."""
    return costs.host + costs.planning + costs.entering()


def _seconds(costs: Costs, fixed: float, first: float, step: float, lead: int, h: int, accept: float) -> float:
    """Seconds of a round drafting h tokens (``rates``): ``fixed``, the draft steps (the first
    yielding ``lead`` tokens before its own), the target's decode of h+1 rows, the rollback."""
    return fixed + first + max(h - lead - 1, 0) * step + costs.target(h + 1) + costs.rollback(h, accept)


def loosening(costs: Costs, exact: float, loose: float, unsure: float, window: int,
              h_max: int) -> tuple[float, float]:
    """(exact, loose): tokens per second of the best rounds that match exactly, each drafted
    token kept with probability ``exact``, and of the best rounds under FLy's loosening, kept
    with ``loose``, priced as k auto prices a plan (``best``). Loosened rounds draft at least
    ``window`` tokens: every window FLy opens is drafted and verified to its end, so a shorter
    round pays for the rest of its window in the next one (on a CPU, where k auto drafts 3-5
    tokens beside the F16 Qwen target, fly loosened ran 0.89x spd cold); where long rounds pay
    anyway the window costs nothing more. Each loosened round also asks the draft model for its
    token where the target is unsure after it (a share ``unsure`` of positions): a draft step."""
    first, step = costs.draft(2), costs.draft(1)
    loosened = rates(costs, itertools.repeat(loose, h_max), first + unsure * step, step, 0, loose)  # an ask a round
    loose_rate = max((rate for h, rate in loosened if h >= min(window, h_max)), default=0.0)
    return best(costs, exact, h_max, first, step)[0], loose_rate


def value(costs: Costs, pace: float, chances: Sequence[float]) -> tuple[float, int]:
    """(value, n) of verifying the best prefix of a draft (``chances[i]``: the chance that its
    tokens 0..i are all kept); drafting is paid already."""
    top, top_n = -pace * costs.target(1), 0
    for n, expected in enumerate(itertools.accumulate(chances), start=1):  # the chances are the products already
        v = expected - pace * costs.target(n + 1)
        if v > top:
            top, top_n = v, n
    return top, top_n


def more(costs: Costs, pace: float, chances: Sequence[float], accept: float, k_max: int) -> bool:
    """After drafting ``len(chances)`` tokens: would drafting h more (each kept with ``accept``)
    be worth more than stopping now and verifying the best prefix?"""
    drafted, step = len(chances), costs.draft(1)
    stop = value(costs, pace, chances)[0]
    further = kept(itertools.repeat(accept, max(k_max - drafted, 0)), sum(chances), chances[-1] if chances else 1.0)
    for h, expected in enumerate(further, start=1):
        if expected - pace * (h * step + costs.target(drafted + 1 + h)) > stop:
            return True
    return False


def probe(costs: Costs, pace: float, firsts: Sequence[float], accept_of_bin: Sequence[float], limit: int,
          first: float, step: float) -> bool:
    """Is one draft step worth its cost for what its token's confidence tells? After it the round
    goes on drafting (each token then as likely kept as that one) or decodes plainly, whichever
    is worth more at the pace; ``firsts``, the confidences of the first drafted tokens lately
    (counts by bin), weigh the outcomes."""
    host, target = costs.host, costs.target
    plain = 1.0 - pace * (host + target(1))
    worth = 0.0
    for b, weight in enumerate(firsts):
        if weight <= 0:
            continue
        top = plain
        for h, expected in enumerate(kept(itertools.repeat(accept_of_bin[b], limit)), start=1):
            top = max(top, expected - pace * (host + (h - 1) * step + target(h + 1)))
        worth += weight * top
    return worth / sum(firsts) - pace * first > plain


def guess_length(costs: Costs, agree: float, available: int, catchup: int) -> int:
    """How many tokens of an n-gram guess the draft model should check in its next step (each
    agreed with ``agree``): a step over 1 + g rows costs more than a plain one and pays only if
    the draft agrees with enough of the guess (its own next token comes either way)."""
    top, top_g = 1.0 / costs.draft(catchup + 1), 0
    for g, expected in enumerate(kept(itertools.repeat(agree, available)), start=1):
        rate = expected / costs.draft(catchup + 1 + g)
        if rate > top:
            top, top_g = rate, g
    return top_g
