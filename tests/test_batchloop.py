"""Slots (``Engine(n_seq=N)``, the engine's step loop ``fly_cpp.engine.scheduler`` and
``fly_cpp.engine.batchloop``): several greedy generations at once, their rows sharing the target's
batches, return exactly what each returns alone. ``n_ubatch=1`` makes a row's numbers
independent of what else is in its batch (docs/fly-rule.md)."""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest
import slot_runs
from slot_runs import GREEDY

from fly_cpp import Engine, ModelSettings, SpecSettings
from fly_cpp.engine.batchloop import LOAD_RUN, Throttled
from fly_cpp.drafters.seam import Draft
from fly_cpp.basics.errors import FlyError

PROMPTS = ["Once upon a time", "Lily and Tom went to the park", "The little dog was sad because",
           "Sam liked to eat"]
N = 40


def exact(path) -> ModelSettings:
    return ModelSettings(str(path), n_ctx=1024, n_ubatch=1)


@pytest.fixture(scope="module")
def alone(stories, stories_draft):
    with Engine(exact(stories), exact(stories_draft)) as e:
        yield e


@pytest.fixture(scope="module")
def slots(stories, stories_draft):
    with Engine(exact(stories), exact(stories_draft), n_seq=4) as e:
        yield e


def spec(mode: str) -> SpecSettings:
    return SpecSettings(mode=mode) if mode == "target" else SpecSettings(mode=mode, k=6)


def together(engine: Engine, mode: str, prompts=PROMPTS, max_tokens: int = N) -> list[list[int]]:
    """Run every prompt in its own slot at once; each slot's tokens."""
    return [g.tokens for g in slot_runs.together(engine, spec(mode), prompts, max_tokens)]


@pytest.mark.parametrize("mode", ["target", "spd", "fly"])
def test_slots_return_what_each_returns_alone(alone, slots, mode):
    expected = [alone.generate(p, spec=spec(mode), sampling=GREEDY, max_tokens=N).run().tokens for p in PROMPTS]
    before = slots.batchers["target"].decodes
    assert together(slots, mode) == expected
    shared = slots.batchers["target"]
    assert shared.decodes > before
    assert shared.rows > shared.decodes  # some decodes held several slots' rows


def test_fly_loosening_in_slots_gives_the_text_it_gives_alone(alone, slots):
    """FLy's loose acceptance runs in every slot (each its own cross-round window, the draft
    model's own token asked for through the shared draft batches): the text is the one alone."""
    loose = SpecSettings(mode="fly", k=6, loosen="on", entropy_threshold=0.5)
    expected = [alone.generate(p, spec=loose, sampling=GREEDY, max_tokens=N).run() for p in PROMPTS]
    assert sum(g.stats.n_loose for g in expected) > 0  # the rule did loosen here
    gens = slot_runs.together(slots, loose, PROMPTS, N)
    assert [g.tokens for g in gens] == [g.tokens for g in expected]


def test_the_defaults_in_slots_write_the_targets_text_even_beside_a_cpu_hog(alone, slots):
    """k auto's plans follow the timings (drafting together or not, runs under load), and a busy
    machine moves the timings; the text never follows them: greedy, the defaults in four slots at
    once write what the target writes alone."""
    expected = [alone.generate(p, spec=spec("target"), sampling=GREEDY, max_tokens=N).run().tokens for p in PROMPTS]
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        gens = slot_runs.together(slots, SpecSettings(), PROMPTS, N)
        hogged = slot_runs.together(slots, spec("spd"), PROMPTS, N)
    finally:
        hog.kill()
        hog.wait()
    assert [g.tokens for g in gens] == expected
    assert [g.tokens for g in hogged] == expected


def test_slot_finishing_or_closed_early_does_not_disturb_others(alone, slots):
    slot_runs.check_a_cancelled_slot(alone, slots, spec("spd"), PROMPTS, N)


def test_a_slot_outside_the_engine_is_refused(slots):
    with pytest.raises(FlyError, match="id_slot 4"):
        slots.generate("Once", max_tokens=2, slot=4)


def test_generations_without_a_slot_take_the_free_ones(alone, slots):
    expected = [alone.generate(p, spec=spec("fly"), sampling=GREEDY, max_tokens=N).run().tokens for p in PROMPTS]
    gens = [slots.generate(p, spec=spec("fly"), sampling=GREEDY, max_tokens=N) for p in PROMPTS]
    out: list[list[int]] = [[] for _ in gens]
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, gens[i].run().tokens)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == expected
    assert slots.steps.active == 0 and not any(slots.busy_slots())


def test_scoring_and_prefill_run_in_a_free_slot(alone, slots):
    prompt = alone.tokenize(PROMPTS[0])
    output = alone.generate(prompt, spec=spec("target"), sampling=GREEDY, max_tokens=8).run().tokens
    assert slots.score(prompt, output).nll == pytest.approx(alone.score(prompt, output).nll, abs=1e-4)
    slots.prefill(prompt)
    assert slots.generate(prompt, spec=spec("target"), sampling=GREEDY, max_tokens=8, slot=0).run().tokens == output


def test_several_active_slots_draft_together(alone, slots):
    """Under load the slots' rounds draft together, as llama-server's do: a draft-model decode
    holds a step of several slots, and each slot returns what it returns alone."""
    expected = [alone.generate(p, spec=spec("spd"), sampling=GREEDY, max_tokens=N).run().tokens for p in PROMPTS]
    draft = slots.batchers["draft"]
    shared, seqs = draft.shared, draft.seqs
    gens = slot_runs.together(slots, spec("spd"), PROMPTS, N)
    assert [g.tokens for g in gens] == expected
    assert all(g.stats.n_drafted > 0 for g in gens)
    assert draft.seqs - seqs > 1.5 * (draft.shared - shared)  # steps of several slots in one decode


def test_every_slots_verification_rows_go_in_one_target_decode(alone, slots):
    """The step loop holds the target's batch while any slot still drafts: the slots' rounds
    stay in step, each verifying its rows in the same target decode as the others."""
    target = slots.batchers["target"]
    shared, seqs = target.shared, target.seqs
    gens = slot_runs.together(slots, spec("spd"), PROMPTS, N)
    assert all(g.stats.n_drafted > 0 for g in gens)
    rounds = sum(g.stats.n_rounds for g in gens)
    assert target.seqs - seqs >= rounds  # every round's rows in a shared decode (prompts too)
    assert target.shared - shared < 0.5 * rounds  # ... with other slots' rows in most of them


class _Busy:
    """What ``Throttled`` reads of the step loop: how many slots are active."""

    def __init__(self, active: int) -> None:
        self.active = active


def test_without_k_slots_loaded_slots_draft_only_what_windows_need(slots):
    """``k_slots`` 0: with other slots active, k auto's rounds draft only what an open window
    needs (a drafted row costs another client's real row) and leave the rest to the target
    alone, in runs; alone, a slot drafts as it always does."""
    auto = SpecSettings(mode="spd", k_slots=0)
    alone_gen = slots.generate(PROMPTS[0], spec=spec("spd"), max_tokens=N, slot=0).run()
    assert alone_gen.stats.n_drafted > 0

    def drafts(active: int, need: int) -> Draft:
        def make(at: int) -> Draft:
            inner = slots.drafter(auto, slot=at)
            throttled = Throttled(inner, _Busy(active), inner.pacer, None, k=0)  # type: ignore[arg-type, attr-defined]
            committed = slots.tokenize(PROMPTS[1])
            throttled.begin(committed)
            return throttled.draft(committed, 8, need)
        return slots.steps.call(make)

    assert drafts(4, 0) == Draft(alone=LOAD_RUN)
    owed = drafts(4, 2)  # an open window's tokens come from the draft model
    assert len(owed.tokens) == 2 and owed.by_model


def test_a_free_slot_is_picked_by_its_cached_prefix(slots):
    first = "Zed the zebra had a blue hat"
    slots.generate(first, spec=spec("target"), max_tokens=4, slot=3).run()
    gen = slots.generate(first + " and", spec=spec("target"), max_tokens=4)
    gen.run()
    assert gen.stats.n_cached >= len(slots.tokenize(first)) - 1  # it ran in slot 3, where its prefix was


def test_recurrent_models_go_back_by_checkpoints_with_several_slots(qwen35_pair):
    """A hybrid's slots each checkpoint their own sequence's recurrent state (llama.cpp's
    snapshots serve one sequence): tests/test_hybrid_slots.py runs them."""
    target, _ = qwen35_pair
    with Engine(ModelSettings(str(target), n_ctx=256), n_seq=2) as e:
        assert e.target.rollback == "checkpoints" and e.target.n_rs_seq == 0
        assert [e._pair(i)[0].rollback for i in range(2)] == ["checkpoints"] * 2


def test_busy_slots_follow_running_generations(slots):
    gate = slot_runs.Gate()
    gen = slots.generate(PROMPTS[1], spec=spec("spd"), sampling=GREEDY, max_tokens=N, slot=1, drafter=gate)
    it = iter(gen)
    next(it)  # greedy, the first token comes from the prompt's row, before the rounds
    gate.wait_for_round()  # the generation is in its rounds (the step loop waits in its drafter)
    assert slots.busy_slots() == [False, True, False, False] and slots.steps.active == 1
    gate.open()
    gen.close()
    assert slots.busy_slots() == [False] * 4 and slots.steps.active == 0


def test_slots_in_one_unified_cache(stories, stories_draft):
    """``kv_unified``: the slots share all n_ctx positions (a sequence's cells then lie among the
    others', so only near-ties could tell its text from the one alone: compared loosely)."""
    with Engine(exact(stories), exact(stories_draft), n_seq=2, kv_unified=True) as e:
        assert e.n_ctx == 1024
        out = together(e, "spd", PROMPTS[:2])
        assert [len(t) for t in out] == [N, N]
        assert e.batchers["target"].rows > e.batchers["target"].decodes


def test_each_slot_has_its_share_of_the_context(slots):
    assert slots.n_ctx == 256  # n_ctx 1024 over 4 slots, as llama-server's slots
    with pytest.raises(FlyError, match="longer than the context"):
        slots.generate(list(range(1, 300)), max_tokens=2)


def test_each_slot_counts_its_generations(slots):
    """``slot_views``: the running (else last) generation of each slot and counters over its
    life; a generation pinned to a busy slot counts as waiting until the slot frees."""
    before = slots.slot_views()[2].totals
    gate = slot_runs.Gate()
    gen = slots.generate(PROMPTS[2], spec=spec("spd"), sampling=GREEDY, max_tokens=N, slot=2, drafter=gate)
    it = iter(gen)
    next(it)  # greedy, the first token comes from the prompt's row, before the rounds
    gate.wait_for_round()
    view = slots.slot_views()[2]
    assert view.running and view.limit == N and view.last is not None
    assert slots.generations_running == 1
    pinned = slots.generate(PROMPTS[0], spec=spec("target"), sampling=GREEDY, max_tokens=4, slot=2)
    waiter = threading.Thread(target=pinned.run)
    waiter.start()
    while slots.generations_waiting == 0:
        waiter.join(0.01)
    assert slots.generations_running == 1 and waiter.is_alive()
    gate.open()
    stats = gen.run().stats  # the rest of it; then the pinned one runs in slot 2
    waiter.join()
    assert slots.generations_running == 0 and slots.generations_waiting == 0
    view = slots.slot_views()[2]
    assert not view.running and view.last is not None and view.last.n_tokens == 4 and view.last.mode == "target"
    grew = {name: view.totals[name] - before[name] for name in before}
    assert grew == {"generations": 2, "tokens_predicted": N + 4, "rounds": stats.n_rounds + view.last.n_rounds,
                    "drafts": stats.n_drafts, "drafted": stats.n_drafted,
                    "accepted": stats.n_exact + stats.n_loose, "loosely_accepted": stats.n_loose}


def test_one_row_micro_batches_give_each_sequence_its_own_numbers(slots):
    """llama.cpp puts one row of each of two sequences in one micro-batch even at n_ubatch 1 (a
    cache per sequence): a shared decode must still give every row the very numbers it gets
    decoded alone, or FLy's decisions near a threshold follow the load (seen under -np 4)."""
    from fly_cpp.backend.batch import Job

    shared = slots.batchers["target"]
    prompts = [slots.tokenize(p) for p in PROMPTS[:3]]
    seqs = [shared.seq(i) for i in range(3)]
    alone = []
    for s, tokens in zip(seqs, prompts):
        s.tokens.clear()
        s._physical(0)  # whatever an earlier test left there
        s.decode(tokens[:-1], logits="none")
        alone.append(s.decode(tokens[-1:]))
        s.truncate(len(tokens) - 1)
    jobs = [Job(s.seq_id, len(tokens) - 1, tokens[-1:], 1) for s, tokens in zip(seqs, prompts)]
    shared._run(jobs)
    try:
        for job, rows in zip(jobs, alone):
            assert np.array_equal(job.rows, rows)
    finally:
        for s, tokens in zip(seqs, prompts):
            s._physical(len(tokens) - 1)  # what the jobs decoded outside the sequences' views
            s.truncate(0)


def test_k_auto_fly_decides_loosening_by_the_pair_in_slots_too(slots):
    """Whether k auto's fly loosens is the pair's to decide (the bundled target is too small for
    it to pay), never the number of slots or the load, so that a request gives the text it gives
    alone; a fixed k, or --loosen on, still loosens."""
    assert not slots.generate(PROMPTS[0], spec=SpecSettings(), max_tokens=8).run().stats.loosens
    assert slots.generate(PROMPTS[0], spec=SpecSettings(k=4), max_tokens=8).run().stats.loosens
    assert slots.generate(PROMPTS[0], spec=SpecSettings(loosen="on"), max_tokens=8).run().stats.loosens


def test_shared_decodes_are_counted(slots):
    """``Engine.sharing`` (the server's ``llamacpp:n_busy_slots_per_decode`` and
    ``fly_cpp_*_rows_per_decode``): slots running at once share the target's decodes."""
    before = slots.sharing()["target"]
    together(slots, "target")
    decodes, seqs, rows = (a - b for a, b in zip(slots.sharing()["target"], before))
    assert decodes > 0 and rows >= seqs >= decodes
    assert seqs > decodes  # at least one decode held several slots' rows
    assert set(slots.sharing()) == {"target", "draft"}


def test_one_slot_shares_nothing(alone):
    assert alone.sharing() == {}


def test_a_request_made_while_another_runs_leaves_its_pacer_alone(stories, stories_draft, tmp_path, monkeypatch):
    """With one slot, a server prepares the next request (engine.generate) on another thread
    while a generation runs. Its drafter, which begins the pacer the running one shares, is made
    only when it runs, under the engine's lock: made at once (as it was), it reset the running
    generation's controller, and under load the running generation's llama_decode failed
    (llama-server's test_completion_parallel_slots[1-3])."""
    monkeypatch.setenv("FLY_CPP_COSTS", str(tmp_path / "costs.json"))
    with Engine(exact(stories), exact(stories_draft)) as e:
        auto = SpecSettings(mode="spd")
        running = e.generate(PROMPTS[0], spec=auto, max_tokens=N)
        steps = iter(running)
        next(steps)
        pacer = e.control.pacers()[0]
        begun: list[bool] = []
        begin = pacer.begin
        monkeypatch.setattr(pacer, "begin", lambda: begun.append(e.steps.running_task() is not None) or begin())
        waiting = e.generate(PROMPTS[1], spec=auto, max_tokens=N)
        assert begun == []  # nothing of the next generation touched the running one's controller
        for _ in steps:
            pass
        assert waiting.run().tokens and begun == [True]


def test_k_auto_measures_the_costs_in_its_own_slot(stories, stories_draft, tmp_path, monkeypatch):
    """A slot's k auto pacer measures the pair's costs (when it first needs them: as soon as it
    begins, once a pair has a long record) on its own slot's sequence, on the step loop: measured
    on slot 0's (as it was), the measuring decodes raced slot 0's generation, and llama_decode
    refused the positions two threads had written."""
    monkeypatch.setenv("FLY_CPP_COSTS", str(tmp_path / "costs.json"))
    with Engine(exact(stories), exact(stories_draft), n_seq=2) as e:
        seq0, calls = e._pair(0)[0], []
        decode = seq0.decode
        monkeypatch.setattr(seq0, "decode", lambda *a, **k: calls.append(a) or decode(*a, **k))
        costs = e.steps.call(lambda at: e.drafter(SpecSettings(mode="spd"), slot=at).pacer.costs, slot=1)
        assert costs.prior and calls == []  # nothing cached: the prior, and nothing decoded for it
        measured = e.steps.call(lambda at: e.control.cost_model(refresh=True, slot=at), slot=1)
        assert measured.cached is False and calls == []  # measured now, and not on slot 0's sequence


@pytest.mark.parametrize("mode", ["target", "spd"])
def test_a_full_shared_cache_ends_only_the_largest_answer(stories, stories_draft, mode):
    """Four slots in one 512-cell cache, two answers of 300 tokens at once (together past the
    cache): the slot holding most when the cache fills ends as a full context ends (its text
    kept, ``context_full``, its cells freed), the other writes all its tokens; nothing raises
    (llama-server ends every slot there, and the server answered HTTP 500)."""
    from fly_cpp.config import SamplingSettings
    endless = SamplingSettings(temperature=0, ignore_eos=True)
    with Engine(ModelSettings(str(stories), n_ctx=512, n_threads=1),
                ModelSettings(str(stories_draft), n_threads=1) if mode != "target" else None,
                n_seq=4, kv_unified=True) as e:
        gens = [e.generate(p, spec=SpecSettings(mode=mode, k=4), sampling=endless, max_tokens=300, slot=i)
                for i, p in enumerate(["Once upon a time", "Lily and Ben went to the park"])]
        runs = [threading.Thread(target=g.run) for g in gens]
        for run in runs:
            run.start()
        for run in runs:
            run.join()
        ended = sorted(gens, key=lambda g: len(g.tokens))
        assert ended[0].context_full and ended[0].stats.cache_full and ended[0].finish_reason == "length"
        assert len(ended[1].tokens) == 300 and not ended[1].stats.cache_full
        assert 0 < len(ended[0].tokens) < 300
        again = e.generate("Once upon a time", spec=SpecSettings(mode=mode, k=4), sampling=endless, max_tokens=40,
                           slot=ended[0].stats.slot).run()  # the freed slot answers again
        assert len(again.tokens) == 40


def test_a_full_draft_cache_at_the_draft_s_prompt_ends_the_answer_cleanly(stories, stories_draft, monkeypatch):
    """The soak's HTTP 500 (four slots, long answers overflowing one shared cache): the draft's
    cache met the full cache while it took the prompt, before the rounds. The answer ends there
    as a full context ends, and the slot answers again after. (The draft's prompt fails as
    llama.cpp's decode fails there, ``decode_failed(.., 1)``.)"""
    from fly_cpp.backend.cache import decode_failed
    from fly_cpp.config import SamplingSettings
    from fly_cpp.drafters.draft_model import DraftModel
    greedy = SamplingSettings(temperature=0)
    with Engine(ModelSettings(str(stories), n_ctx=512, n_threads=1), ModelSettings(str(stories_draft), n_threads=1),
                n_seq=2, kv_unified=True) as e:
        prefill = DraftModel.prefill

        def full(self, prompt):  # type: ignore[no-untyped-def]
            raise decode_failed("draft.gguf", 1)

        monkeypatch.setattr(DraftModel, "prefill", full)
        gen = e.generate("Once upon a time", spec=SpecSettings(mode="spd", k=4), sampling=greedy, max_tokens=20).run()
        assert gen.stats.cache_full and gen.context_full and gen.finish_reason == "length"
        monkeypatch.setattr(DraftModel, "prefill", prefill)
        again = e.generate("Once upon a time", spec=SpecSettings(mode="spd", k=4), sampling=greedy, max_tokens=20).run()
        assert len(again.tokens) == 20
