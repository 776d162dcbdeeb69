"""The same request gives the same text, whatever the rounds drafted: FLy's guarded rule (the
default) decides on the text alone. A drafter made to plan other lengths (none, an n-gram guess,
the draft model for a random while) must not change a token, greedy or sampled; nor may a busy
machine, in another process."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from fly_cpp import Engine, ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.drafters.drafter import PairDrafter
from fly_cpp.drafters.seam import Draft, DraftRules

PROMPTS = ["Once upon a time", "The little dog ran to the", "Lily wanted to", "One day, a big bird"]
GREEDY = SamplingSettings(temperature=0)


class OtherPlans:
    """The engine's drafter with its plans replaced by chance: a round decodes alone, verifies an
    n-gram guess, or drafts a random length with the draft model (always as much as an open
    window is owed)."""

    def __init__(self, inner, seed: int) -> None:
        self.inner, self.rng, self.ngram = inner, random.Random(seed), PairDrafter(None, DraftRules.of(SpecSettings()))

    def begin(self, prompt):
        self.inner.begin(prompt)

    def candidate(self, committed):
        return self.inner.candidate(committed)

    def accept(self, report):
        self.inner.accept(report)

    def draft(self, committed, limit, need=0):
        r = self.rng.random()
        if need == 0 and r < 0.25:
            return Draft()
        if need == 0 and r < 0.45:
            return self.ngram.draft(committed, limit)
        return self.inner.draft(committed, max(need, min(limit, self.rng.randint(1, 8))), need)


@pytest.fixture(scope="module")
def pair(stories, stories_draft):
    with Engine(ModelSettings(str(stories), n_ctx=512, n_threads=1),
                ModelSettings(str(stories_draft), n_threads=1)) as e:
        yield e


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_fly_text_does_not_depend_on_the_plans(pair, temperature):
    sampling = SamplingSettings(temperature=temperature, seed=7)
    loose = 0
    for prompt in PROMPTS:
        texts = {}
        # loosen "on": this draft is the target's own size, where k auto alone would match exactly
        for name, spec, plans in [("auto", SpecSettings(loosen="on"), None), ("k2", SpecSettings(k=2), None),
                                  ("k12", SpecSettings(k=12), None), ("other1", SpecSettings(k=10), 1),
                                  ("other2", SpecSettings(k=10), 2)]:
            drafter = OtherPlans(pair.drafter(spec, sampling=sampling), plans) if plans is not None else None
            gen = pair.generate(prompt, spec=spec, sampling=sampling, max_tokens=80, drafter=drafter).run()
            texts[name] = gen.text
            loose += gen.stats.n_loose
        assert len(set(texts.values())) == 1, (prompt, texts)
    assert loose > 0  # FLy did keep mismatches: the rule was at work


def test_only_the_guarded_rule_with_its_window_promises_it():
    assert SpecSettings().reproducible and SpecSettings(mode="spd").reproducible
    assert SpecSettings(mode="target").reproducible and SpecSettings(window=0).reproducible
    assert not SpecSettings(fly_rule="paper").reproducible
    assert not SpecSettings(cross_round=False).reproducible


def _generate(stories, stories_draft, *extra: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "fly_cpp.cli.main", "generate", "-m", str(stories), "-d",
                          str(stories_draft), "-p", "The little dog ran to the", "-n", "60", "-t", "1", "--json",
                          *extra], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("sampling", [("--temp", "0"), ("--temperature", "0.9", "--seed", "7"),
                                      ("--temp", "0", "--loosen", "on")])
def test_the_same_request_in_another_process_on_a_busy_machine(stories, stories_draft, sampling, tmp_path,
                                                               monkeypatch):
    monkeypatch.setenv("FLY_CPP_COSTS", str(tmp_path / "costs.json"))  # each process calibrates, busy or not
    idle = _generate(stories, stories_draft, *sampling)
    (tmp_path / "costs.json").unlink(missing_ok=True)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = _generate(stories, stories_draft, *sampling)
    finally:
        hog.kill()
        hog.wait()
    assert busy["text"] == idle["text"] and busy["tokens"] == idle["tokens"]


def test_k_auto_matches_exactly_where_loosening_does_not_pay(pair):
    """The bundled draft is the target's own size: priced on the probe, loosened rounds gain
    less than their windows cost (``fly_cpp.kauto.loosening``), so k auto's fly matches exactly (the
    text of spd) and asks nothing; a fixed k still loosens."""
    assert pair.draft_ctx.model.n_params >= 0.5 * pair.target_model.n_params
    fly = pair.generate(PROMPTS[0], spec=SpecSettings(), sampling=GREEDY, max_tokens=60).run()
    spd = pair.generate(PROMPTS[0], spec=SpecSettings(mode="spd"), sampling=GREEDY, max_tokens=60).run()
    assert not pair.steps.call(lambda at: pair.control.verdict(SpecSettings(), at)).loosen
    assert not fly.stats.loosens and fly.stats.n_asked == 0 and fly.stats.n_loose == 0
    assert fly.tokens == spd.tokens
    assert pair.generate(PROMPTS[0], spec=SpecSettings(k=4), sampling=GREEDY, max_tokens=8).run().stats.loosens
