"""What a verified round keeps, complete (``Keep``): made by the verifier (``fly_cpp.rounds.verify.Verifier.keep``),
applied by the loop (``fly_cpp.rounds.loop``), counted by the round's record (``fly_cpp.rounds.step.Round.tally``)."""

from __future__ import annotations

from dataclasses import dataclass

from fly_cpp.rounds.accept import Verdict


@dataclass(frozen=True)
class Keep:
    """What a verified round keeps, complete: the accept rule's ``verdict`` (cut where FLy's
    plan-independent rule must ask the draft model instead), the ``tokens`` to commit (the kept
    drafts, then the target's own token or, ``asked``, the draft model's own one there, kept
    loosely; ``held`` when that one waits for its window), whether the round ``confirmed`` the open
    window, how often the draft model was asked (``n_asked``) and the seconds that took."""

    verdict: Verdict
    tokens: list[int]
    asked: bool = False
    held: bool = False
    confirmed: bool = False
    n_asked: int = 0
    ask_seconds: float = 0.0

    def loose(self, i: int) -> bool:
        """Whether the round's ``i``-th token is kept loosely (its window judged later or not)."""
        return i in self.verdict.loose or (self.asked and i == self.verdict.accepted)
