"""What a generation emits: one ``Step`` per token, and a ``Stats`` record per generation;
before its first token, a ``Progress`` per batch of the prompt (``Generation.events``).

The same Step flows unchanged from the loop to the CLI, the Python API and the server.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from fly_cpp.rounds.keep import Keep


@dataclass(frozen=True, slots=True)
class TokenProbs:
    """The target's view of one emitted token (asked for with ``n_probs``): its log-probability
    and the n most likely tokens there with theirs, most likely first. They come from the very
    target pass that verified the token (its raw distribution: softmax of the logits, before
    any sampling setting), so under FLy a loosely accepted token shows how unlikely the target
    found it."""

    logprob: float
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True, slots=True)
class Progress:
    """The prompt's processing after one of its batches (llama-server's ``prompt_progress``):
    ``total`` prompt tokens, ``cache`` of them the target's cache held already, ``processed``
    ones in the cache now (``cache`` included), ``seconds`` since the generation began. The
    first report comes before any decode (``processed == cache``), the last once the prompt's
    last token is decoded (``processed == total``): with a draft that is inside the first
    round, whose decode finishes the prompt's last batch."""

    total: int
    cache: int
    processed: int
    seconds: float

    def as_dict(self) -> dict[str, int]:
        """llama-server's ``prompt_progress`` object."""
        return {"total": self.total, "cache": self.cache, "processed": self.processed,
                "time_ms": int(self.seconds * 1e3)}


@dataclass(frozen=True, slots=True)
class Step:
    """One emitted token.

    token: the token id. text: the text this token releases (may be "" while an incomplete
    UTF-8 character or a possible stop string is held back; the texts of all steps concatenate
    to the generation's text). drafted: the token came from the draft and the target kept it.
    loose: a drafted token the target disagreed with but FLy kept. round: the target forward
    pass (1-based) that committed it. probs: the target's probabilities there, when the
    generation was asked for them (``n_probs``).
    """

    token: int
    text: str
    drafted: bool
    loose: bool
    round: int
    probs: TokenProbs | None = None


@dataclass
class Round:
    """One verified round, as the loop records it once it is over (``Stats.add``): drafted
    tokens verified, the verdict's counts (kept exactly, loosely, mismatches the gate or a
    safeguard refused, one kept pending its window), a window confirmed or refuted (and the
    rounds its segment took), FLy's ask of the draft model where no draft reached and whether
    its token was kept (loosely, or pending its window), the tokens the round committed (the
    target's own included; 1 for a refuted round), and the seconds drafting and verifying took."""

    number: int
    drafted: int = 0
    exact: int = 0
    loose: int = 0
    gate_rejected: int = 0
    guard_rejected: int = 0
    provisional: int = 0
    confirmed: int = 0
    refuted_rounds: int | None = None  # a window refuted: the rounds its segment took
    asked: int = 0
    committed: int = 1
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    branched: bool = False  # a tree's round that kept its branch (``fly_cpp.drafters.tree``)

    def tally(self, keep: Keep) -> None:
        """Count what the round keeps (``fly_cpp.rounds.verify.Keep``): the verdict's counts, the
        draft model's token where FLy asked for it (kept loosely, or pending its window)."""
        verdict = keep.verdict
        self.confirmed = int(keep.confirmed)
        self.asked += keep.n_asked
        self.draft_seconds += keep.ask_seconds
        self.exact += verdict.n_exact
        self.loose += len(verdict.loose) + (keep.asked and not keep.held)
        self.gate_rejected += verdict.gate_rejected
        self.guard_rejected += verdict.guard_rejected
        self.provisional += (verdict.provisional is not None) + keep.held
        self.committed = verdict.accepted + 1


@dataclass
class Stats:
    """Counters of one generation. ``seconds`` is the decoding time after the prompt.

    n_cached: prompt tokens the target's KV cache already held (not processed again).
    n_drafts: rounds that verified a draft (a non-empty one); n_drafted: tokens drafted.

    n_exact / n_loose count drafted tokens kept by exact match / loosely; n_gate_rejected /
    n_guard_rejected count rounds that stopped at a mismatch the window would have kept but the
    entropy gate / a safeguard refused; with the cross-round
    window, n_provisional mismatches were kept pending, n_confirmed of them were confirmed
    (and counted in n_loose), n_refuted were rolled back, and n_refuted_rounds is the number of
    rounds spent on refuted segments (their tokens were thrown away; n_exact still counts the
    matches made inside them). n_asked counts the times FLy's rule asked the draft model for its
    token where no draft of its reached (the target was unsure there; the prompt's last row
    included). n_eog is 1 when the text ended on an end-of-generation token: a round committed it,
    though it is not part of the text (nor of n_tokens). n_from_prompt is 1 where the first token
    came from the prompt's last row (greedy, and under FLy's rule where no other token could be
    kept there: ``Runs.start``): a round of the output's, though no target pass after the prompt made it
    (``n_passes`` leaves it out). loosens: whether fly's rule could keep a mismatch in this
    generation (as set, or as k auto's measure of the pair settled it: ``fly_cpp.kauto.loosening``)."""

    mode: str
    n_prompt: int = 0
    n_cached: int = 0
    n_tokens: int = 0
    n_rounds: int = 0
    n_drafts: int = 0
    n_drafted: int = 0
    n_exact: int = 0
    n_loose: int = 0
    n_gate_rejected: int = 0
    n_guard_rejected: int = 0
    n_provisional: int = 0
    n_confirmed: int = 0
    n_refuted: int = 0
    n_refuted_rounds: int = 0
    n_eog: int = 0
    n_from_prompt: int = 0  # 1: the first token came from the prompt's last row (``from_prompt``)
    n_asked: int = 0
    n_shifts: int = 0  # context shifts (``fly_cpp.rounds.shift``)
    n_branched: int = 0  # rounds of a tree that kept its branch (``fly_cpp.drafters.tree``); n_drafted counts its tokens
    # a cache shared by slots had no room for this slot's next decode: the generation ended there, as
    # at a full context, and its cells were freed for the other slots (``fly_cpp.backend.batch``)
    cache_full: bool = False
    prompt_seconds: float = 0.0
    first_seconds: float = 0.0  # of ``seconds``, until the decode that finished the prompt (the first round's, with a draft)
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    seconds: float = 0.0
    accepted_lengths: list[int] = field(default_factory=list, repr=False)
    draft_lengths: dict[int, int] = field(default_factory=dict)  # tokens drafted -> rounds
    pacing: dict[str, object] | None = None  # k auto: the controller's plans, acceptance and cost model
    rollback: dict[str, object] | None = None  # recurrent/hybrid models: the way back and what it cost, by role
    drafter: str = ""  # "mtp" where the target's own MTP head drafted (chosen or by default)
    loosens: bool = False
    slot: int = 0  # the engine's slot it ran in (serve -np N)

    def add(self, r: Round) -> None:
        """A verified round's record."""
        self.n_rounds += 1
        self.n_drafts += bool(r.drafted)
        self.n_drafted += r.drafted
        self.draft_lengths[r.drafted] = self.draft_lengths.get(r.drafted, 0) + 1
        self.n_exact += r.exact
        self.n_loose += r.loose + r.confirmed
        self.n_gate_rejected += r.gate_rejected
        self.n_guard_rejected += r.guard_rejected
        self.n_provisional += r.provisional
        self.n_confirmed += r.confirmed
        self.n_asked += r.asked
        self.n_branched += r.branched
        if r.refuted_rounds is not None:
            self.refuted(r.refuted_rounds)
        self.accepted_lengths.append(r.committed)
        self.draft_seconds += r.draft_seconds
        self.target_seconds += r.target_seconds

    def refuted(self, rounds: int) -> None:
        """A window refuted, after its segment took ``rounds`` rounds."""
        self.n_refuted += 1
        self.n_refuted_rounds += rounds

    def from_prompt(self) -> None:
        """The first token comes from the prompt's last row: its round has no target pass of its own."""
        self.n_from_prompt += 1

    def asked(self) -> None:
        """The draft model asked for its token outside a round (at the prompt's last row)."""
        self.n_asked += 1

    def shifted(self) -> None:
        self.n_shifts += 1

    def alone(self, tokens: int = 0, seconds: float = 0.0) -> None:
        """``tokens`` rounds of the target alone decoded in native runs, in ``seconds``."""
        if tokens:
            self.n_rounds += tokens
            self.draft_lengths[0] = self.draft_lengths.get(0, 0) + tokens
            self.accepted_lengths.extend([1] * tokens)
        self.target_seconds += seconds

    @property
    def mean_accepted(self) -> float:
        """Tokens committed per target forward pass (drafted tokens kept + correction/bonus),
        counting the end-of-generation token (a one-token answer took two rounds for two tokens)."""
        return (self.n_tokens + self.n_eog) / self.n_rounds if self.n_rounds else 0.0

    @property
    def n_passes(self) -> int:
        """Target passes after the prompt: the rounds, but a first token taken from the prompt's row.
        Where fly's first round verifies its first token (a loose accept possible there), it decodes
        the prompt's last token with its drafts where spd's prompt decode gives the first token:
        compare the two by tokens per pass."""
        return self.n_rounds - self.n_from_prompt

    @property
    def tokens_per_second(self) -> float:
        return self.n_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def host_seconds(self) -> float:
        """Time in the loop outside draft and target forward passes (Python bookkeeping)."""
        return max(self.seconds - self.draft_seconds - self.target_seconds, 0.0)

    def as_dict(self, pacing: bool = True) -> dict[str, object]:
        """The counters by name; ``pacing`` False leaves k auto's controller dump out (what a
        response's ``fly`` field carries: the answer's counters, not the planner's state)."""
        # field by field: ``asdict`` deep-copied every round's accepted length and the whole pacing
        # dump, kept or not (0.3 ms an answer of the bundled pair's 30)
        left_out = ("accepted_lengths",) if pacing else ("accepted_lengths", "pacing")
        out = {name: value for name, value in vars(self).items() if name not in left_out}
        out["draft_lengths"] = dict(self.draft_lengths)
        for name in ("pacing", "rollback"):
            if out.get(name) is not None:
                out[name] = copy.deepcopy(out[name])
        out.update(mean_accepted=self.mean_accepted, n_passes=self.n_passes,
                   tokens_per_second=self.tokens_per_second, host_seconds=self.host_seconds)
        return out

    def summary(self) -> str:
        line = f"{self.mode}: {plural(self.n_tokens, 'token')} in {self.seconds:.2f}s ({self.tokens_per_second:.1f} tok/s)"
        if self.mode != "target":
            line += (f", {plural(self.n_rounds, 'round')}, mean accepted {self.mean_accepted:.2f}, "
                     f"exact {self.n_exact}, loose {self.n_loose}, gate rejections {self.n_gate_rejected}")
            if self.n_guard_rejected:
                line += f", safeguard rejections {self.n_guard_rejected}"
            if self.n_branched:
                line += f", tree branches kept {self.n_branched}"
            if self.mode == "fly" and not self.loosens:
                line += ", loosening off (matching exactly)"
            if self.drafter == "mtp":
                line += ", drafted by the model's MTP head"
        if self.n_provisional:
            line += (f", provisional {self.n_provisional} (confirmed {self.n_confirmed}, refuted {self.n_refuted}"
                     f" costing {self.n_refuted_rounds} rounds)")
        return line


def plural(n: int, word: str) -> str:
    """"1 token", "2 tokens"."""
    return f"{n} {word}{'' if n == 1 else 's'}"
