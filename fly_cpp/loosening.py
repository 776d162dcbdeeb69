"""Whether FLy loosens under k auto on a pair, from what loosening measurably gains there.

With a draft model: tokens per second with and without loosening, priced as k auto prices a
plan (``worth.loosening``), from the pair's measured costs and from what a probe counts: the
target writes its greedy text after each of ``PROBES`` (as long as ``length`` says), the draft
model reads along, and at every position the request's accept rule (``fly_cpp.verify``) judges the
draft model's token: kept exactly, kept loosely (a mismatch the gate and the safeguards pass,
followed by a window of exact matches), or not; the share of positions where the target was
unsure prices the asks (a round asks the draft model's token where the target was unsure and
no draft reached). On the target's own text, as a generation's rounds are judged: on the draft
model's text instead, the `costly` pair's acceptance read 0.77 where its rounds kept about 0.5,
and the probe said loosen where fly then ran 0.95x the target alone and spd 1.45x.

With the target's MTP head drafting (no probe drafts with it): its measured step beside a
target decode.

Decided once per pair, machine and accept rule, before the first generation that needs it, and
kept beside the cost cache (``loosening.json``): the same request then gives the same text in
every later process and slot. Nothing else decides it: not the load, not the text."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from fly_cpp import jsoncache, worth
from fly_cpp.backend.batch import Seq
from fly_cpp.backend.context import Context
from fly_cpp.calibrate import RETRY_SECONDS, SPAN
from fly_cpp.config import SamplingSettings, SpecSettings
from fly_cpp.costcache import cache_path
from fly_cpp.costs import Costs
from fly_cpp.recall import key as record_key
from fly_cpp.request import Request
from fly_cpp.rows import top_entropy
from fly_cpp.verify import Verifier

PROBES = ("The history of the printing press begins",
          'def merge_sorted(a, b):\n    """Merge two sorted lists into one sorted list."""\n')


@dataclass(frozen=True)
class Verdict:
    """Whether fly loosens on the pair, and why, in words (what was measured)."""

    loosen: bool
    why: str

    @classmethod
    def priced(cls, costs: Costs, tally: Tally, spec: SpecSettings) -> Verdict:
        """From what the probe counted (``Tally``), priced with the pair's costs."""
        accept_exact, accept_loose, unsure = tally.shares()
        exact, loose = worth.loosening(costs, accept_exact, accept_loose, unsure, spec.window, spec.k_max)
        gain = loose / exact if exact > 0 else 0.0
        return cls(bool(gain >= worth.LOOSE_MARGIN),
                   f"loosened rounds priced {gain:.2f}x exact ones (a drafted token kept {accept_loose:.2f} "
                   f"loosened, {accept_exact:.2f} exactly; the target unsure at {unsure:.0%} of "
                   f"{tally.positions} positions)")

    @classmethod
    def of_head(cls, costs: Costs) -> Verdict:
        """Where the target's MTP head drafts (no probe drafts with it): its measured step beside
        a target decode (``worth.ASK_SHARE``)."""
        share = costs.draft(1) / costs.target(1)
        return cls(bool(share < worth.ASK_SHARE),
                   f"a step of the target's MTP head costs {share:.2f} of a target decode (loosening pays "
                   f"below {worth.ASK_SHARE})")

    def describe(self) -> str:
        return f"fly {'loosens' if self.loosen else 'matches exactly'}: {self.why}"


@dataclass(frozen=True)
class Tally:
    """What a probe counted over its texts' positions: where the draft model's token was the
    target's (exact), where a mismatch would be kept loosely (the gate and the safeguards let it
    through and the draft matched the target over the rest of the window after it), and where
    the target was unsure (its top-3 entropy at the gate or above)."""

    positions: int = 0
    exact: int = 0
    loose: int = 0
    unsure: int = 0

    @classmethod
    def of(cls, exact: Sequence[bool], admitted: Sequence[bool], unsure: Sequence[bool], window: int) -> Tally:
        """One text's counts: ``exact[i]``, ``admitted[i]`` (a mismatch the gate and safeguards
        pass), ``unsure[i]`` at each position. A mismatch whose window runs past the text is not
        counted as kept."""
        n = len(exact)
        loose = sum(1 for i in range(n) if not exact[i] and admitted[i] and i + window <= n
                    and all(exact[i + 1:i + window]))
        return cls(n, sum(map(bool, exact)), loose, sum(map(bool, unsure)))

    def __add__(self, other: Tally) -> Tally:
        return Tally(self.positions + other.positions, self.exact + other.exact, self.loose + other.loose,
                     self.unsure + other.unsure)

    def shares(self) -> tuple[float, float, float]:
        """(exact, loosened, unsure): a drafted token's chance to be kept matching exactly and
        loosened, and the share of positions where the target was unsure."""
        n = max(self.positions, 1)
        return self.exact / n, (self.exact + self.loose) / n, self.unsure / n


def length(costs: Costs, spec: SpecSettings) -> int:
    """Tokens of text after each of ``PROBES``: as many as both models decode in about
    ``RETRY_SECONDS`` (the bound of one model's calibration) over them all, at their measured
    one-row decodes, and at least three of the longest rounds' worth; in all at most a
    calibration's ``SPAN`` of context (the host's work per token bounds a tiny pair's probe, not
    its decodes). The F16 Qwen pair on a 2-core CPU (93 + 18 ms) writes 48 after each, an 8B
    target on a GPU 256: more of the rare loose keeps where they are cheap to count."""
    step = max(costs.target(1) + costs.draft(1), 1e-6)
    most = SPAN // len(PROBES)
    return min(max(int(RETRY_SECONDS / (len(PROBES) * step)), 3 * spec.k_max), most)


def probe(target: Context | Seq, draft: Context | Seq, spec: SpecSettings, n_vocab: int, length: int,
          tokenize: Callable[[str], list[int]], piece: Callable[[int], bytes],
          is_eog: Callable[[int], bool]) -> Tally:
    """The counts of ``Tally`` on ``PROBES``, on these caches: the target writes ``length``
    tokens of its greedy text after each, the draft model reading along (its own token at every
    position), and the request's accept rule judges each mismatch (``Verifier.admits``). Each
    probe starts from empty caches (nothing they held changes the measure); what they held is
    decoded again after (a cached prompt stays cached)."""
    held = [(cache, list(cache.tokens)) for cache in (target, draft)]
    tally = Tally()
    for text in PROBES:
        prompt = tokenize(text)
        room = min(length, target.n_ctx - len(prompt) - 1, draft.n_ctx - len(prompt) - 1)
        if room < 1:
            continue
        verify = Verifier(Request(tuple(prompt), spec, SamplingSettings(), room, (), 0), piece)
        exact: list[bool] = []
        admitted: list[bool] = []
        unsure: list[bool] = []
        for cache in (target, draft):
            cache.truncate(0)
        row, guess = target.decode(prompt, "last"), draft.decode(prompt, "last")
        written = list(prompt)
        while row is not None and guess is not None and len(exact) < room:
            token, own = int(np.argmax(row[0][:n_vocab])), int(np.argmax(guess[0][:n_vocab]))
            if is_eog(token):
                break
            exact.append(own == token)
            admitted.append(own != token and verify.admits(row[0], own, written, token))
            unsure.append(bool(top_entropy(row[0][None])[0] >= spec.entropy_threshold))
            written.append(token)
            if len(exact) < room:
                row, guess = target.decode([token], "last"), draft.decode([token], "last")
        tally += Tally.of(exact, admitted, unsure, spec.window)
    for cache, tokens in held:
        cache.truncate(0)
        if tokens:
            cache.decode(tokens, "none")
    return tally


def path() -> Path:
    """``loosening.json`` beside the cost cache."""
    return cache_path().with_name("loosening.json")


def key(pair: str, spec: SpecSettings) -> str:
    """A verdict's key: the pair's cost-cache key, the accept rule and the longest draft."""
    return record_key(pair, (spec.policy(), spec.k_max))  # as k auto's evidence is keyed


def recall(record: str) -> Verdict | None:
    """The verdict kept under ``record``, or None (never decided, or malformed)."""
    entry = jsoncache.load(path()).get(record)
    if not isinstance(entry, dict) or not isinstance(entry.get("loosen"), bool):
        return None
    return Verdict(entry["loosen"], str(entry.get("why", "")))


def keep(record: str, verdict: Verdict) -> None:
    jsoncache.store(path(), record, asdict(verdict))
