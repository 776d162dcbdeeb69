"""How a generation's rounds run (``RoundRules``), resolved once from its settings before the first
round: the loop, the verifier, the cross-round window and the native runs read these and never the
settings bag they came from (``fly_cpp.config.SpecSettings``)."""

from __future__ import annotations

from dataclasses import dataclass

from fly_cpp.config import SpecSettings
from fly_cpp.config.policy import AcceptPolicy


@dataclass(frozen=True)
class RoundRules:
    """``mode`` (target, spd or fly: what the stats say), ``max_draft`` (the longest draft a round
    verifies: k, or k_max under k auto), ``n_min`` (a shorter draft is not verified, llama.cpp's
    --draft-min), ``policy`` (the accept rule's knobs), ``window`` (tokens a mismatch kept loosely
    spans, counting itself), ``cross_round`` (that window reaches across rounds) and
    ``cross_round_confidence`` (the least chance an unfinished window completes to be kept: 0
    under the plan-independent rule, whose every window is finished)."""

    mode: str
    max_draft: int
    n_min: int
    policy: AcceptPolicy
    window: int
    cross_round: bool
    cross_round_confidence: float

    @classmethod
    def of(cls, spec: SpecSettings) -> RoundRules:
        policy = spec.policy()
        return cls(spec.mode, spec.max_draft, spec.n_min, policy, spec.window,
                   spec.cross_round_window and policy.loosens,
                   0.0 if policy.own_only else spec.cross_round_confidence)
