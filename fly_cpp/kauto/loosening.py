"""Whether FLy loosens under k auto on a pair, from what loosening would gain there.

With a draft model: tokens per second with and without loosening, priced as k auto prices a
plan (``worth.loosening``), from the pair's costs (its learned curves, else the prior) and what
loosening keeps on a typical pair (``PRIOR``): the share of a draft model's tokens kept exactly and
loosely, and where the target is unsure (a round asks the draft model's token there). What
decides is the costs: where a draft step and verified rows are cheap beside a target decode
(a GPU) the rare loose keeps pay for the asks and windows, where they are dear (a CPU) they do
not. Nothing is measured for it: a probe in which the target wrote its greedy text after two
openings once decided it, 12-15 s inside a first answer on a 2-core CPU, for verdicts that the
costs alone decided on every pair measured (docs/fly-rule.md). Where the target's MTP head
drafts, its step is the draft step priced (a head step of a tenth of a target decode or less
loosens on GPU-shaped costs, as the head's own rule of a tenth once said).

Decided once per pair, machine and accept rule, when the first generation needs it, and kept
beside the cost cache (``loosening.json``): the same request then gives the same text in every
later process and slot. A verdict priced at the prior's costs is priced once more when the
pair's curves have been learned (``learned``): from the next process on, then kept. Nothing else
decides it: not the load, not the text."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from fly_cpp.basics import jsoncache
from fly_cpp.config import SpecSettings
from fly_cpp.kauto import worth
from fly_cpp.kauto.costcache import cache_path
from fly_cpp.kauto.costs import Costs
from fly_cpp.kauto.recall import key as record_key


@dataclass(frozen=True)
class Verdict:
    """Whether fly loosens on the pair, and why, in words; ``learned``: priced at the pair's
    learned costs (False: at the prior's, to be priced again once they are learned)."""

    loosen: bool
    why: str
    learned: bool = True

    @classmethod
    def priced(cls, costs: Costs, tally: Tally, spec: SpecSettings) -> Verdict:
        """From ``tally``'s shares (``PRIOR``), priced with the pair's costs."""
        accept_exact, accept_loose, unsure = tally.shares()
        exact, loose = worth.loosening(costs, accept_exact, accept_loose, unsure, spec.window, spec.k_max)
        gain = loose / exact if exact > 0 else 0.0
        return cls(bool(gain >= worth.LOOSE_MARGIN),
                   f"loosened rounds priced {gain:.2f}x exact ones at the pair's "
                   f"{'prior' if costs.prior else 'learned'} costs (a drafted token kept {accept_loose:.2f} "
                   f"loosened, {accept_exact:.2f} exactly; the target unsure at {unsure:.0%} of positions)",
                   not costs.prior)

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


# what loosening keeps on a typical pair: the means of the probes that decided it on four pairs, CPU-2
# (docs/fly-rule.md: a drafted token kept 0.73-0.87 exactly, 0.01-0.05 more loosely; the target unsure
# at 30-99% of positions)
PRIOR = Tally(100, 81, 3, 67)


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
    return Verdict(entry["loosen"], str(entry.get("why", "")), entry.get("learned", True) is not False)


def keep(record: str, verdict: Verdict) -> None:
    jsoncache.store(path(), record, asdict(verdict))
