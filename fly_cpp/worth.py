"""k auto's one objective: tokens per second, priced by the measured costs (``fly_cpp.costs``).

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

from fly_cpp.costs import Costs

# FLy loosens under k auto where an ask reads less than this share of what a target decode reads,
# and where the target's weights are at least LOOSE_MIN_BYTES (the runs that measured both:
# ``loosening_pays``)
ASK_SHARE = 0.1
LOOSE_MIN_BYTES = 256 << 20  # below it a decode costs its overheads and arithmetic: the fast pair, ``loosening_pays``
# slots draft together under k auto only where the priced rate beats drafting nothing by this much: on the
# F16 Qwen pair (2-core CPU) rounds drafted together ran 0.84-0.94x drafting nothing at -np 2 and -np 4
# (a cache per slot or one) where the cost curves priced them at 0.93-1.2x (the draft's batched steps cost
# 1.2-1.4x their calibrated price beside the target, and a round kept in step waits: docs/slots.md)
TOGETHER_MARGIN = 1.5


def loosening_pays(ask_share: float, target_bytes: int) -> bool:
    """Whether FLy's loose acceptance can pay under k auto. To keep the text independent of
    where rounds end, FLy asks the draft model for its token wherever the target was unsure and
    no draft reached (``fly_cpp.loop``), each ask a draft step beside a plain decode, and every
    window it opens is drafted and verified to its end. That pays where a draft step is cheap
    beside a decode and extra verified rows are nearly free, as on a target whose decode is
    reading its weights. ``ask_share``: the draft model's weights over the target's, in bytes
    (what a decode reads), or the share of the target one step of its MTP head touches.

    It does not pay where a draft step costs a large share of a decode: a quantized copy of the
    target, a draft as large as it, and a small draft beside a target quantized as hard (the
    0.5B Q4_K_M Qwen2.5-Coder draft is 0.44 of its 1.5B Q4_K_M target's bytes, its vocabulary's
    output matrix a large part of both, and a step cost 0.63 of a target decode on a 2-core
    CPU: fly with loosening ran 0.71x the target alone there, spd 1.01x). Nor beside that
    pair's F16 target, where the draft is 0.16 of the bytes and a step 0.19 of a decode: the
    windows kept 1.5% of the tokens loosely and cost more, since each one is drafted and verified
    to its end whatever k auto would plan (2026-11-27, 2 threads: spd ran 1.12x fly per prompt
    cold, 20 prompts of 64 tokens, 1.23x on the Spec-Bench half; 1.06x warm, 18 prompts of 128
    tokens). Nor on a target under
    ``LOOSE_MIN_BYTES`` of weights, whose decode costs its overheads and its arithmetic
    (cache-resident on a CPU, launch-bound on a GPU): every step costs about as much as any
    other and every verified row its full share (the kit's 30 MB `fast` pair: fly 0.69x the
    target with loosening, spd's speed without). fly then keeps exact matches only (its text is
    spd's). Decided from the models alone, never from timings, so the same request gives the
    same text on any machine."""
    return ask_share < ASK_SHARE and target_bytes >= LOOSE_MIN_BYTES


def head_params(n_params: int, n_vocab: int, n_embd: int, n_layer: int, n_nextn: int) -> int:
    """About how many of a model's parameters one step of its MTP head touches: its own
    layers (an average layer each) and the output matrix it shares with the trunk. On a large
    model a few percent of the whole; on a tiny one with a large vocabulary nearly all of it
    (the output matrix is most of such a model), where an ask costs as much as a decode."""
    output = n_vocab * n_embd
    per_layer = max(n_params - 2 * output, 0) / max(n_layer, 1)
    return int(output + n_nextn * per_layer)


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
    """Tokens per second of a plain target decode (host time included), now."""
    return 1.0 / (costs.host + costs.target(1))


def together(costs: Costs, accept: float, slots: int, h_max: int) -> int:
    """The draft length h <= h_max for ``slots`` sequences whose rounds draft together
    (``fly_cpp.batchloop.Rounds``): each step one draft decode for all of them (the first also
    catching up one token each), then one target decode of every slot's h+1 rows, against a
    target decode of one row each. Here a drafted row costs what it adds to a batch that other
    slots' real rows already pay for. 0 unless the best h beats that by ``TOGETHER_MARGIN``."""
    plain = slots / (slots * costs.host + costs.target(slots))
    top, top_h = plain * TOGETHER_MARGIN, 0
    for h, expected in enumerate(kept(itertools.repeat(accept, h_max)), start=1):
        seconds = (slots * costs.host + costs.draft(2 * slots) + (h - 1) * costs.draft(slots)
                   + costs.target(slots * (h + 1)))
        if slots * expected / seconds > top:
            top, top_h = slots * expected / seconds, h
    return top_h


def best(costs: Costs, accept: float, h_max: int, first: float, step: float,
         lead: Sequence[float] = (), depths: Sequence[float] = ()) -> tuple[float, int]:
    """(tokens per second, h) of the best draft length h <= h_max for a round whose first draft
    step costs ``first`` seconds and later ones ``step``, each token kept with probability
    ``accept`` given the earlier ones were (or ``depths[i]`` for the i-th drafted token, where
    given). ``lead``: tokens the first step yields before its own (an n-gram guess it checks),
    each kept with its own probability. A batch after one-row decodes also pays for switching
    kinds, there and back (``Costs.entering``), and a recurrent state for going back after a
    rejection (``Costs.rollback``)."""
    host, target, entering = costs.host, costs.target, costs.entering()
    top, top_h = alone(costs), 0
    own = itertools.chain(depths, itertools.repeat(accept))
    accepts = itertools.chain(lead[:h_max], itertools.islice(own, max(h_max - len(lead), 0)))
    for h, expected in enumerate(kept(accepts), start=1):
        steps = max(h - len(lead) - 1, 0)
        rate = expected / (host + entering + first + steps * step + target(h + 1) + costs.rollback(h, accept))
        if rate > top:
            top, top_h = rate, h
    return top, top_h


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
