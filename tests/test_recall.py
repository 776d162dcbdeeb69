"""k auto's evidence outlives the process: a new engine on the same pair starts from what the
last one learned (the first rounds of a fresh ``fly-cpp generate`` are not a cold start)."""

from __future__ import annotations

import time

from fly_cpp import Engine, ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.kauto import recall
from fly_cpp.kauto.evidence import Evidence


def _engine(stories, stories_draft) -> Engine:
    return Engine(ModelSettings(str(stories), n_ctx=256, n_threads=1), ModelSettings(str(stories_draft), n_threads=1))


def test_a_new_process_starts_from_what_the_last_one_learned(stories, stories_draft, tmp_path, monkeypatch):
    monkeypatch.setenv("FLY_CPP_EVIDENCE", str(tmp_path / "evidence.json"))
    spec = SpecSettings(loosen="on")  # as it is on a pair whose draft is smaller than its target
    with _engine(stories, stories_draft) as e:
        pacer = e.drafter(spec).pacer  # the pair's for these settings: every generation's drafter shares it
        e.generate("Once upon a time", spec=spec, sampling=SamplingSettings(temperature=0), max_tokens=40).run()
        deadline = time.monotonic() + 30  # kept once the loop is idle
        while not (tmp_path / "evidence.json").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        learned = pacer.evidence.as_dict()  # read without a new text, which would age it (``Pacer.begin``)
    assert learned["model"][0][1] > 0  # trials seen
    with _engine(stories, stories_draft) as e:  # as a new process would load it
        assert e.drafter(spec).pacer.evidence.as_dict() == learned
        # other settings learn apart
        assert e.drafter(SpecSettings(mode="spd")).pacer.evidence.as_dict() == Evidence().as_dict()
        sampled = e.drafter(spec, sampling=SamplingSettings(seed=1)).pacer.evidence.as_dict()
        assert sampled == Evidence().as_dict()  # sampled answers keep at other rates than greedy ones


def test_a_malformed_record_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("FLY_CPP_EVIDENCE", str(tmp_path / "evidence.json"))
    (tmp_path / "evidence.json").write_text('{"abc": {"model": [1, 2]}}')
    assert recall.load("abc") is None and recall.load("other") is None
    (tmp_path / "evidence.json").write_text("not json")
    assert recall.load("abc") is None
    recall.store("abc", Evidence())  # a broken file is replaced
    assert recall.load("abc") is not None


def test_what_a_generation_taught_is_kept_once_the_step_loop_is_idle(stories, stories_draft, tmp_path, monkeypatch):
    """Kept when the loop runs out of work, not at the generation's end (where other slots'
    decodes would wait for the write), nor only at close: a process killed later keeps it."""
    kept = tmp_path / "evidence.json"
    monkeypatch.setenv("FLY_CPP_EVIDENCE", str(kept))
    with _engine(stories, stories_draft) as e:
        e.generate("Once upon a time", spec=SpecSettings(loosen="on"), sampling=SamplingSettings(temperature=0),
                   max_tokens=40).run()
        deadline = time.monotonic() + 30  # the loop writes it once it is idle, after the answer is out
        while not kept.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert kept.exists()  # before the engine closes
