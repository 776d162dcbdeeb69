"""A fixed k's tree (``draft_tree``): a chain with one branch, where the draft was torn between two
tokens, verified in the same target decode (``fly_cpp.backend.context.Context.decode_tree``).

A chain of k tokens keeps nothing past its first token that is not the target's. Under the shared
draw the target's token is, after the draft's own draw, most often the draft's runner-up: the
token with the second-highest noised score (on warm40 at T 0.8, rank 2 at 0.071 of positions,
rank 1 at 0.869). Where the two scores lie within ``FORK_GAP`` nats, the runner-up stands a fair
chance, so the tree spends ``branch`` + 1 of its k tokens there: the chain drafts k - 1 - branch
tokens, and at the first of them whose runner-up lies that close the branch starts with the
runner-up, continued by ``branch`` draws of the draft after it. Where no position of the chain
forks, the chain drafts all k. The target's own draws decide which continuation is kept, so the
text stays the target's.

The branch is drafted after the chain, from the draft cache cut back to the fork; the next round
catches the draft up on whichever continuation was kept (its first step's batch).
"""

from __future__ import annotations

from collections.abc import Sequence

from fly_cpp.drafters.seam import Branch, Draft
from fly_cpp.drafters.steps import Stepper

FORK_GAP = 1.0  # nats between the draft's two best scores where a tree forks


def draft_tree(stepper: Stepper, committed: Sequence[int], k: int, branch: int) -> Draft:
    """A tree of at most ``k`` tokens after ``committed``: a chain, and where it forks a branch of
    ``branch`` + 1 tokens (``k`` must exceed ``branch`` + 1). The draft's own tokens throughout
    (``Draft.by_model``); no n-gram guess is checked and no confidence read."""
    chain = k - 1 - branch
    catchup = stepper.start(committed)
    out: list[int] = []
    fork: tuple[int, int] | None = None  # (where, the runner-up)
    while len(out) < (chain if fork is not None else k):
        s = stepper.step(catchup, [*committed, *out], [], ranked=fork is None and len(out) < chain)
        catchup = []
        if fork is None and s.second is not None and s.second[1] < FORK_GAP:
            fork = (len(out), s.second[0])
        out.append(s.token)
        if stepper.is_eog(s.token):
            break
    if fork is None or fork[0] >= len(out):
        return Draft(out, [None] * len(out), by_model=True)
    where, second = fork
    history = [*committed, *out[:where], second]
    tokens = [second]
    if not stepper.is_eog(second):
        catchup = stepper.start(history)  # the draft cache cut back to the fork
        while len(tokens) <= branch:
            s = stepper.step(catchup, [*history, *tokens[1:]], [])
            catchup = []
            tokens.append(s.token)
            if stepper.is_eog(s.token):
                break
    return Draft(out, [None] * len(out), by_model=True, branch=Branch(where, tuple(tokens)))
