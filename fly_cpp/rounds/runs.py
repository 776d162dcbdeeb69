"""Target-only greedy decoding in runs: several tokens per return to Python.

A target-only round is one decode of one token; the host work around it (the loop, the verdict,
the output) is small in instructions but runs after a decode that streamed the whole model
through the caches, so it runs cold, and it leaves llama.cpp's own host code cold for the next
decode: measured on the kit's ``fast`` pair (docs/native.md, "Target-only runs"), ~0.3 ms of
CPU a token against a 2.5 ms decode, where ``llama-completion``'s loop costs ~0.05 ms. A run
decodes, picks the argmax and decodes it again inside the native library
(``Context.greedy_run``), up to ``RUN_SECONDS`` of decoding or an end-of-generation token, and
the loop then commits and emits the run's tokens one by one, as rounds of one token each.
The first token comes from the prompt's own last row (``start``): the prompt is decoded
through its last token in one batch, as llama.cpp's tools do, not that token alone in a round.

Only where the target's choice is the raw argmax: greedy, no penalties or logit bias (nor
ignore_eos), no grammar, no log-probabilities asked; a context that cannot run natively (rpc,
recurrent state, several sequences, MTP hidden states, no library) decodes token by token as
before. The text is the same either way (``tests/test_runs.py``).

With a drafter, where verification is exact, the rounds it leaves to the target alone run too:
k auto's pacer, when no speculation pays, rests a number of rounds without planning
(``Pacer.rest``), and its empty draft says how many (``Draft.alone``); the loop decodes them as
one run and reports them to the drafter as that many rounds (``Report.rounds``). The last
token's round, which no drafter is asked about, stays a round (``tests/test_alone_runs.py``).

Greedy speculative generations take their first token from the prompt's last row too
(``Runs.first``): the target's choice there is the one the first round would have verified, and
it comes one round earlier (the first draft then continues it). Under a loosening rule the draft
model's token may be kept there instead, so where the row leaves that open (the target unsure,
another token able to pass: ``Verifier.may_loosen``) the first token is left to the first round
as before, the prompt's last token taken back out of the cache.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter

import numpy as np

from fly_cpp.backend import rollback as rb
from fly_cpp.backend.batch import Seq
from fly_cpp.backend.context import Context
from fly_cpp.backend.rows import argmax
from fly_cpp.rounds.output import Output
from fly_cpp.rounds.request import Request

RUN_SECONDS = 0.02  # decoding per run: the longest a streamed token waits for the run it is in
MAX_RUN = 64


class Runs:
    """The runs of one generation (``make`` says whether it can use them)."""

    def __init__(self, target: Context | Seq, stop: np.ndarray) -> None:
        self.target, self.stop = target, stop
        self.length = 4  # the first run's; then as many tokens as RUN_SECONDS of decoding holds

    @classmethod
    def make(cls, request: Request, target: Context, drafting: bool, constrained: bool) -> Runs | None:
        """Runs for a generation whose choice is the raw argmax, on a context that runs them:
        all its rounds without a drafter, with one the rounds it leaves to the target alone
        (``Draft.alone``), where verification is exact (a loosening rule may keep the draft
        model's own token where the target decoded alone, FLy's ``ask``)."""
        plain = _raw_argmax(request, constrained) and not (drafting and request.rules.policy.loosens)
        return cls(target, target.model.eog_mask) if plain and target.runs_natively else None

    @classmethod
    def first(cls, request: Request, target: Context | Seq, constrained: bool) -> Runs | None:
        """Where the first token can come from the prompt's last row (``start``), without runs:
        the raw argmax and a KV cache: of one sequence, or a slot's (``Seq``: its prompt's last
        chunk is a shared decode like any other)."""
        one = target.rollback == rb.KV and (isinstance(target, Seq) or target.n_seq == 1)
        return cls(target, target.model.eog_mask) if one and _raw_argmax(request, constrained) else None

    def start(self, committed: list[int], out: Output,
              open_at: Callable[[np.ndarray, int], bool] | None = None) -> bool:
        """The prompt (``committed``) decoded through its last token in one batch (what the
        cache lacks of it), and the first token picked from that row, committed and emitted as a
        round: one single-token decode fewer than the loop's first round, as llama.cpp's tools
        decode a prompt. Where ``open_at(row, token)`` says a loosening rule could keep another
        token there, nothing is committed and the prompt's last token leaves the cache again.
        Either way the loop's invariant holds after. Returns whether the token was committed."""
        row = self.target.sync_through(committed)
        token = int(argmax(row[None, :])[0])
        if open_at is not None and open_at(row, token):
            self.target.truncate(len(committed) - 1)
            return False
        out.stats.from_prompt()
        self._emit([token], committed, out)
        return True

    def run(self, committed: list[int], out: Output, most: int = MAX_RUN) -> float:
        """Decode a run of at most ``most`` tokens after ``committed`` (the target's cache holds
        all of it but the last token), commit and emit its tokens until the output ends; the
        cache holds all but the last committed token after. Returns the seconds decoding the
        committed tokens took (their share of the run's)."""
        stats = out.stats
        budget = out.max_tokens - stats.n_tokens - len(out.held)
        n = max(1, min(self.length, most, budget, self.target.n_ctx - len(committed)))
        t0 = perf_counter()
        tokens = self.target.greedy_run(committed[-1], n, self.stop)
        seconds = perf_counter() - t0
        stats.alone(seconds=seconds)
        if tokens:
            self.length = max(1, min(MAX_RUN, int(RUN_SECONDS * len(tokens) / max(seconds, 1e-9))))
        before = len(committed)
        self._emit(tokens, committed, out)
        return seconds * (len(committed) - before) / max(len(tokens), 1)

    def _emit(self, tokens: list[int], committed: list[int], out: Output) -> None:
        stats = out.stats
        for token in tokens:
            stats.alone(1)
            committed.append(token)
            out.add(token, drafted=False, loose=False, round=stats.n_rounds)
            if out.finish is not None:
                break
        self.target.truncate(len(committed) - 1)  # tokens decoded past the end of the text


def _raw_argmax(request: Request, constrained: bool) -> bool:
    """Whether the target's choice is its raw argmax: greedy, no penalties, logit bias (nor
    ignore_eos), grammar or log-probabilities."""
    s = request.sampling
    return not constrained and s.greedy and not s.penalised and not request.bias and not request.n_probs
