"""Slots on a hybrid model (``Engine(n_seq=N)`` over the synthetic qwen35-tiny pair: Gated
DeltaNet + attention, random weights): each sequence's recurrent state goes back by checkpoints
of its own, taken and restored between shared decodes, and several greedy generations at once
return exactly what each returns alone, as on a transformer (``tests/test_batchloop.py``).
``n_ubatch=1`` makes a row's numbers independent of what else is in its batch."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest
import slot_runs
from slot_runs import GREEDY

from fly_cpp import Engine, ModelSettings, SpecSettings
from fly_cpp.backend.batch import Batcher
from fly_cpp.backend.context import Context
from fly_cpp.backend.model import Model
from fly_cpp.engine.batchloop import Throttled
from fly_cpp.basics.errors import FlyError
from fly_cpp.backend.rollback import CHECKPOINTS, KV, NONE, SNAPSHOTS
from fly_cpp.engine.scheduler import Scheduler

PROMPTS = ["Hello world, this is a test of the hybrid model.", "def fib(n):\n    return", "The capital of France is",
           "Once upon a time"]
N = 32


def exact(path) -> ModelSettings:
    return ModelSettings(str(path), n_ctx=1024, n_ubatch=1)


def spec(mode: str) -> SpecSettings:
    return SpecSettings(mode=mode) if mode == "target" else SpecSettings(mode=mode, k=5, ngram=False)


@pytest.fixture(scope="module")
def alone(qwen35_pair):
    target, draft = qwen35_pair
    with Engine(exact(target), exact(draft)) as e:
        yield e


@pytest.fixture(scope="module", params=[2, 4])
def slots(request, qwen35_pair):
    target, draft = qwen35_pair
    with Engine(exact(target), exact(draft), n_seq=request.param) as e:
        yield e


@pytest.fixture
def drafting(monkeypatch):
    """Every slot drafts its full k under load too (a slot alone always does): rounds then roll
    back in several sequences at once."""
    monkeypatch.setattr(Throttled, "draft", lambda self, committed, limit, need=0: self.inner.draft(committed, limit, need))


def together(engine: Engine, mode: str, prompts=PROMPTS, max_tokens: int = N):
    """Run the prompts in slots 0.. at once (as many as the engine has); each generation's result."""
    return slot_runs.together(engine, spec(mode), prompts, max_tokens)


@pytest.mark.parametrize("mode", ["target", "spd"])
def test_hybrid_slots_return_what_each_returns_alone(alone, slots, mode, drafting):
    prompts = PROMPTS[: slots.n_seq]
    expected = [alone.generate(p, spec=spec(mode), sampling=GREEDY, max_tokens=N).run().tokens for p in prompts]
    before = slots.batchers["target"].decodes
    out = together(slots, mode, prompts)
    assert [g.tokens for g in out] == expected
    shared = slots.batchers["target"]
    assert shared.decodes > before and shared.rows > shared.decodes  # some decodes held several slots' rows
    assert all(g.stats.rollback["target"]["way"] == CHECKPOINTS for g in out)
    if mode == "spd":  # every slot drafted, and rejections rolled sequences back while the others decoded
        assert all(g.stats.n_drafted > 0 for g in out)
        assert sum(g.stats.rollback["target"]["restores"] for g in out) > 0


def test_a_cancelled_hybrid_slot_does_not_disturb_the_others(alone, slots, drafting):
    slot_runs.check_a_cancelled_slot(alone, slots, spec("spd"), PROMPTS[: slots.n_seq], N)


def _script(rng: random.Random, n_ops: int) -> list[tuple[str, list[int] | int]]:
    """Random decodes (several rows checked, as verification does), rollbacks and checkpoints."""
    ops: list[tuple[str, list[int] | int]] = []
    held = 0
    for _ in range(n_ops):
        op = rng.random()
        if op < 0.5 or held < 3:
            new = [rng.randrange(5000) for _ in range(rng.randint(1, 8))]
            ops.append(("decode", new))
            held += len(new)
        elif op < 0.8:
            held -= rng.randint(1, min(10, held))
            ops.append(("truncate", held))
        else:
            ops.append(("checkpoint", max(0, held - rng.randint(0, 4))))
    return ops


def _play(seq, ops) -> list[tuple[list[int], np.ndarray]]:
    """Run a script on one sequence's view; every decode's rows, with the tokens held after it."""
    rows = []
    for kind, arg in ops:
        if kind == "decode":
            got = seq.decode(arg, logits="all").copy()
            rows.append((list(seq.tokens), got))
        elif kind == "truncate":
            seq.truncate(arg)
        else:
            seq.checkpoint(arg)
    return rows


def test_a_sequence_rolling_back_does_not_disturb_the_others(qwen35_pair):
    """Three sequences of one hybrid context run random decodes, rollbacks and checkpoints at
    once as tasks of one step loop (their decodes shared, their copies and restores between
    decodes): every row is, bit
    for bit, what the same script gives that sequence while the others stay idle."""
    target, _ = qwen35_pair
    scripts = [_script(random.Random(seed), 30) for seed in range(3)]
    with Model(target) as m, Context(m, n_ctx=3 * 256, n_threads=1, n_ubatch=1, n_seq=3) as ctx:
        assert ctx.rollback == CHECKPOINTS and ctx.n_rs_seq == 0
        shared = Batcher(ctx)
        alone = []
        for i, ops in enumerate(scripts):
            seq = shared.seq(i)
            alone.append(_play(seq, ops))
            seq.truncate(0)
        seqs = [shared.seq(i) for i in range(3)]
        steps = Scheduler(3, shared, None, cached=lambda i: seqs[i].tokens)  # the engine's step loop
        try:
            tasks = [steps.submit(lambda at: iter((_play(seqs[at], scripts[at]),)), slot=i) for i in range(3)]
            out = [next(iter(t)) for t in tasks]
        finally:
            steps.close()
        for got, want in zip(out, alone):
            assert len(got) == len(want)
            assert all(a[0] == b[0] and np.array_equal(a[1], b[1]) for a, b in zip(got, want))
        assert all(s.rollbacks.copies and s.rollbacks.restores for s in seqs)
        assert shared.rows > shared.decodes  # the sequences did share decodes
        # and the rows are right: each sequence's last decode ends as a fresh context's decode
        # of its tokens (kernels differ by hundredths between batch shapes; a wrong state by units)
        for rows in out:
            tokens, last = rows[-1]
            with Context(m, n_ctx=256, n_threads=1, rollback=CHECKPOINTS) as fresh:
                fresh.decode(tokens[:-1], logits="none")
                assert np.abs(last[-1] - fresh.decode(tokens[-1:])[0]).max() < 0.5


def test_a_hybrid_that_cannot_go_back_is_refused_with_several_slots_in_one_line(qwen35_pair, monkeypatch):
    target, draft = qwen35_pair
    with pytest.raises(FlyError, match="snapshots serves one sequence") as e:
        Engine(ModelSettings(str(target), n_ctx=256, rollback=SNAPSHOTS), n_seq=2)
    assert "\n" not in str(e.value)
    monkeypatch.setattr(Context, "_rollback_kind", lambda self, recurrent: NONE if recurrent else KV)
    with pytest.raises(FlyError, match="can neither roll back nor checkpoint") as e:
        Engine(ModelSettings(str(target), n_ctx=256), ModelSettings(str(draft), n_ctx=256), n_seq=2)
    assert "\n" not in str(e.value)


def test_the_server_serves_a_hybrid_pair_with_two_slots(qwen35_pair, tmp_path):
    """``fly-cpp serve -np 2`` on the hybrid pair: two requests at once get the target's own text."""
    import httpx
    from serving import Server

    target, draft = qwen35_pair
    server = Server(tmp_path, "-m", str(target), "-d", str(draft), "-t", "1", "-c", "1024", "-ub", "1",
                    "-np", "2", "--mode", "spd")
    try:
        assert httpx.get(server.url + "/props", timeout=30).json()["total_slots"] == 2
        with Engine(exact(target)) as alone:
            runs = [alone.generate(p, spec=spec("target"), sampling=GREEDY, max_tokens=24).run() for p in PROMPTS[:2]]
            want = [alone.detokenize(g.tokens) for g in runs]
        got = [""] * 2

        def ask(i: int) -> None:
            r = httpx.post(server.url + "/completion", json={"prompt": PROMPTS[i], "n_predict": 24, "temperature": 0},
                           timeout=120)
            assert r.status_code == 200
            got[i] = r.json()["content"]

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == want
        assert [s["id"] for s in httpx.get(server.url + "/slots", timeout=30).json()] == [0, 1]
    finally:
        assert server.stop() == 0
