"""Context shift (llama-server's ``--context-shift``): a generation that fills the context keeps
its first tokens, drops about half of the rest and goes on, instead of ending there.

When the target's cache holds n_ctx - 1 tokens (the committed text fills the context), the
first ``keep`` positions stay, the next ``discard`` ones (0: half of what follows ``keep``) are
dropped from the target's cache, the draft's and the committed text alike, and what followed
them moves down to fill the gap (``backend.cache.Cache.shift``). The loop's invariant holds after
(``target.tokens == committed[:-1]``), and the parts that follow the generated text by position
(sampler draws, grammar state, code fences: ``Verifier.rebase``) count on from where they were.
A shift happens only between rounds with no cross-round window open, so no rollback ever
reaches back past it. KV caches only: a recurrent state cannot be moved.
"""

from __future__ import annotations

from fly_cpp.backend.batch import Seq
from fly_cpp.backend.context import Context
from fly_cpp.drafters.seam import Drafter
from fly_cpp.rounds.request import Shift
from fly_cpp.rounds.step import Stats
from fly_cpp.rounds.verify import Verifier


def shift(how: Shift, committed: list[int], target: Context | Seq, drafter: Drafter | None,
          verify: Verifier, stats: Stats) -> bool:
    """Shift the context of a generation whose text fills it; False when nothing can be
    dropped (the text then ends there)."""
    keep, drop = how.span(target.n_ctx, len(target.tokens))
    if drop <= 0:
        return False
    verify.rebase(committed, drop)
    target.shift(keep, drop)
    del committed[keep:keep + drop]
    if drafter is not None:
        drafter.shift(keep, drop)
    stats.shifted()
    return True
