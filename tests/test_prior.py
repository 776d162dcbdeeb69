"""k auto's prior (``fly_cpp.kauto.prior``): what decodes cost before any is timed, from the GGUF
headers and what this machine learned for other models; a first answer measures nothing and
leaves the curves its live decodes priced for the next process."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from fly_cpp import Engine, ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.kauto import prior
from fly_cpp.kauto.calibrate import _curve
from fly_cpp.kauto.costcache import load

REPLAYS = Path(__file__).parent / "data" / "replays"
# the real Qwen2.5-Coder files' headers (llama_model_size, llama_model_n_params, layers)
F16 = prior.Shape(3554465792, 1777088000, 28)
Q4_K_M = prior.Shape(1111370240, 1777088000, 28)
DRAFT = prior.Shape(485452288, 630167424, 24)
GREEDY = SamplingSettings(temperature=0)


def recorded(name: str) -> dict:
    with gzip.open(REPLAYS / f"{name}.json.gz", "rt") as f:
        return json.load(f)


@pytest.mark.parametrize("name, shape", [("qwen-coder-f16", F16), ("qwen-coder", Q4_K_M)])
def test_the_prior_prices_the_real_targets_near_their_calibrations(name, shape):
    """On the machine the reference was fitted on, at 2 threads: within 10% of the calibrated
    curves at 1, 2, 4 and 17 rows (the sizes rounds use most, and the slope), 30% elsewhere."""
    measured = _curve(recorded(name)["target"])
    guess = prior.curve(shape, prior.REFERENCE, measured.rows)
    for r in measured.rows:
        bound = 0.10 if r in (1, 2, 4, 17) else 0.30
        assert guess(r) == pytest.approx(measured(r), rel=bound), r


def test_the_prior_prices_the_draft_step_below_a_fifth_of_the_target_decode():
    """The draft's one-row step beside the F16 target's decode, as the calibration had it (0.24)."""
    measured = _curve(recorded("qwen-coder-f16")["draft"])
    guess = prior.curve(DRAFT, prior.REFERENCE, measured.rows)
    assert 0.8 <= guess(1) / measured(1) <= 1.0
    assert guess(1) / prior.curve(F16, prior.REFERENCE, (1,))(1) == pytest.approx(0.21, abs=0.03)


def test_curves_learned_for_other_models_set_the_machines_prices():
    """A machine twice as slow as the reference, learned from one model, prices another alike;
    a model whose own curve was learned (the same file, in another pair) gets that curve."""
    slow = prior.Machine(2 * prior.REFERENCE.per_byte, 2 * prior.REFERENCE.per_param, prior.REFERENCE.per_layer, 2)
    rows = prior.TARGET_ROWS
    seen = prior.curve(Q4_K_M, slow, rows)
    known = [("q4", 2, Q4_K_M, seen)]
    fitted = prior.machine(known, 2)
    assert fitted.per_byte == pytest.approx(slow.per_byte) and fitted.per_param == pytest.approx(slow.per_param)
    assert prior.of_model("f16", F16, 2, rows, known)(1) == pytest.approx(prior.curve(F16, slow, rows)(1))
    assert prior.of_model("q4", Q4_K_M, 2, rows, known) is seen
    assert prior.of_model("q4", Q4_K_M, 1, rows, known) is not seen  # other threads: priced, not reused


def test_offloaded_layers_make_rows_nearly_free():
    gpu = prior.curve(prior.Shape(F16.bytes, F16.params, 28, offloaded=28), prior.REFERENCE, prior.TARGET_ROWS)
    cpu = prior.curve(F16, prior.REFERENCE, prior.TARGET_ROWS)
    assert gpu(1) < cpu(1) / 10 and gpu(17) < 1.5 * gpu(1) and cpu(17) > 4 * cpu(1)


def test_a_first_answer_measures_nothing_and_leaves_learned_curves(stories, stories_draft, tmp_path, monkeypatch):
    """Empty cache: k auto starts from the prior (no calibration, no probe), its answer's live
    decodes set the scales, and the curves they priced are cached with the models' shapes; the
    next process starts from them, and its answer is the first one's text."""
    monkeypatch.setenv("FLY_CPP_CACHE", str(tmp_path))
    monkeypatch.delenv("FLY_CPP_COSTS", raising=False)
    import fly_cpp.kauto.calibrate as cal
    monkeypatch.setattr(cal, "measure_deep", lambda *a, **k: pytest.fail("measured inside an answer"))
    monkeypatch.setattr(cal, "FLAT", 0.0)  # a busy test machine must not keep the learned curve out of the cache
    settings = (ModelSettings(str(stories), n_ctx=512, n_threads=1), ModelSettings(str(stories_draft), n_threads=1))
    with Engine(*settings) as e:
        first = e.generate("Once upon a time", spec=SpecSettings(mode="spd"), sampling=GREEDY, max_tokens=64).run()
        key = e.control.cost_key()
    costs = first.stats.pacing["costs"]
    assert costs["prior"] and costs["disagrees"]
    entry = load()[key]
    assert entry["measured"].startswith("learned from live decodes")
    assert entry["basis"]["target"]["shape"]["layers"] == 5 and entry["basis"]["draft"]["threads"] == 1
    with Engine(*settings) as e:
        second = e.generate("Once upon a time", spec=SpecSettings(mode="spd"), sampling=GREEDY, max_tokens=64).run()
    assert not second.stats.pacing["costs"]["prior"] and second.tokens == first.tokens
