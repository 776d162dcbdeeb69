"""Settings: the accept policy each mode and rule gives, and validation of the safeguards."""

from __future__ import annotations

import math

import pytest

from fly_cpp.accept import AcceptPolicy
from fly_cpp.config import SpecSettings
from fly_cpp.errors import FlyError


def test_paper_rule_is_the_published_window_and_gate_whatever_the_safeguards_say():
    spec = SpecSettings(fly_rule="paper", window=4, entropy_threshold=0.5, loose_min_ratio=0.9, loose_top_n=1,
                        loose_in_code=False)
    assert spec.policy() == AcceptPolicy(4, 0.5) and not spec.policy().guarded


def test_guarded_rule_carries_the_safeguards_and_the_support_guard():
    spec = SpecSettings(fly_rule="guarded", loose_min_ratio=0.25, loose_top_n=3, loose_in_code=False)
    assert spec.policy() == AcceptPolicy(6, 0.3, top_n=3, min_ratio=0.25, supported=True, loose_in_code=False)


def test_exact_modes_ignore_the_rule():
    for mode in ("spd", "target"):
        assert SpecSettings(mode=mode, fly_rule="guarded").policy() == AcceptPolicy.exact()
    assert SpecSettings(entropy_threshold=math.inf).policy().loosens is False


@pytest.mark.parametrize("kwargs, message", [
    ({"fly_rule": "loose"}, "fly_rule must be one of guarded, paper"),
    ({"loose_min_ratio": -0.1}, "loose_min_ratio must be in [0, 1]"),
    ({"loose_min_ratio": 1.5}, "loose_min_ratio must be in [0, 1]"),
    ({"loose_top_n": -1}, "loose_top_n must be >= 0"),
])
def test_bad_safeguards(kwargs, message):
    with pytest.raises(FlyError, match=message.replace("[", r"\[").replace("]", r"\]")):
        SpecSettings(**kwargs)
