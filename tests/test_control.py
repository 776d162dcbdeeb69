"""k auto's face to the engine (``fly_cpp.engine.control``) on real models: where the target is
wholly on a GPU its rounds are steady. No GPU here: ``Control.on_gpu`` is told so, which is
all the controller reads of where the layers went (``tests/test_gpu.py`` runs on one)."""

from __future__ import annotations

import pytest

from fly_cpp.config import ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.engine.control import Control
from fly_cpp.kauto.costs import Costs, Curve
from fly_cpp.engine.engine import Engine

PROMPTS = ["Once upon a time", "Lily and Tom went to the park"]
MS = 1e-3
GREEDY = SamplingSettings(temperature=0)
# a GPU's shape: verification nearly free, a draft step 1/17 of a decode (this pair's own costs
# on a CPU are nearly flat: no draft pays beside them)
GPU_SHAPED = Costs(Curve((1, 2, 4, 8, 16, 32), (3.4 * MS, 3.42 * MS, 3.46 * MS, 3.55 * MS, 3.75 * MS, 4.3 * MS)),
                   Curve((1, 2, 4, 8, 16, 32), (0.2 * MS, 0.21 * MS, 0.22 * MS, 0.24 * MS, 0.28 * MS, 0.36 * MS)))


@pytest.fixture()
def on_gpu(monkeypatch, stories, stories_draft):
    monkeypatch.setattr(Control, "on_gpu", lambda self: True)
    # one row at a time: batched verification would differ from the target's own decodes at near-ties
    with Engine(ModelSettings(str(stories), n_ctx=512, n_ubatch=1), ModelSettings(str(stories_draft))) as e:
        yield e


def test_k_auto_on_a_gpu_drafts_steady_rounds_of_the_target_own_text(on_gpu):
    assert on_gpu.control is not None
    on_gpu.control.use(GPU_SHAPED)
    for prompt in PROMPTS:
        expected = on_gpu.generate(prompt, spec=SpecSettings(mode="target"), sampling=GREEDY,
                                   max_tokens=64).run().tokens
        gen = on_gpu.generate(prompt, spec=SpecSettings(mode="spd"), sampling=GREEDY, max_tokens=64).run()
        assert gen.tokens == expected
        plans = gen.stats.pacing["plans"]
        assert plans["steady"] > 0 and plans["draft"] == plans["explore"] == 0, plans


def test_k_gpu_sets_a_fixed_k_there_and_0_plans_each_round(on_gpu):
    fixed = on_gpu.generate(PROMPTS[0], spec=SpecSettings(mode="spd", k_gpu=4), max_tokens=64).run()
    assert fixed.stats.pacing is None and max(fixed.stats.draft_lengths) <= 4
    planned = on_gpu.generate(PROMPTS[0], spec=SpecSettings(mode="spd", k_gpu=0), max_tokens=64).run()
    assert planned.stats.pacing is not None and planned.stats.pacing["plans"]["steady"] == 0
