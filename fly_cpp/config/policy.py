"""The accept rule's knobs (``fly_cpp.rounds.accept`` applies them): settings like the others,
declared here so that ``SpecSettings.policy()`` returns them without the settings importing the
round."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AcceptPolicy:
    """The knobs of loose acceptance: FLy's window and gate, and the safeguards (module doc).
    The defaults are the paper's rule; ``AcceptPolicy.exact()`` is plain exact matching.

    top_n: loosen only where the drafted token is among the target's n most likely (0 = off).
    min_ratio: loosen only where p(d)/p(top) >= min_ratio (0 = off).
    supported: loosen only where the target's sampler could produce the drafted token.
    loose_in_code: loosen inside ``` code blocks too (False = never there).
    loose_digits: loosen where the drafted or the target's token holds a digit too.
    own_only: loosen only the draft model's own tokens (``Facts.own``), and when sampling
        match drafts against one target draw, not two: FLy's text then depends on the text
        alone, wherever rounds begin and end (the loop asks the draft model for its token where
        no draft reached, ``fly_cpp.rounds.loop``).
    """

    window: int = 6
    entropy_threshold: float = 0.3
    top_n: int = 0
    min_ratio: float = 0.0
    supported: bool = False
    loose_in_code: bool = True
    loose_digits: bool = True
    own_only: bool = False

    @staticmethod
    def exact() -> AcceptPolicy:
        return AcceptPolicy(window=0, entropy_threshold=math.inf)

    @property
    def loosens(self) -> bool:
        """Whether any mismatch can ever be kept under this policy."""
        return self.window >= 1 and math.isfinite(self.entropy_threshold)

    @property
    def guarded(self) -> bool:
        """Whether any safeguard is on (then ``Facts`` are needed to loosen anything)."""
        return (self.top_n > 0 or self.min_ratio > 0 or self.supported or not self.loose_in_code
                or not self.loose_digits or self.own_only)
