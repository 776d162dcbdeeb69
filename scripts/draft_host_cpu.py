"""Host CPU time of speculative rounds at a fixed k, drafting in Python steps against native draft
runs (``DraftModel.run``), in one process on a busy machine.

CPU time of this thread, not wall clock: with one thread llama.cpp computes in the calling
thread, so a generation's CPU time is its decodes plus the host work around them. The decodes'
own CPU time is taken, around each llama_decode, in the Python-steps mode (the native runs call
llama_decode from C, out of sight; both modes decode the same batches): host = CPU - decodes.
Modes alternate, medians over the repeats.

    python scripts/draft_host_cpu.py TARGET.gguf DRAFT.gguf [--k 4] [--n 128] [--repeats 7]
        [--p-min 0] [--no-ngram]
"""

from __future__ import annotations

import argparse
import statistics
from time import thread_time

from fly_cpp import Engine, ModelSettings, SpecSettings
from fly_cpp.backend import native
from fly_cpp.backend.lib import ll
from fly_cpp.drafters.drafter import PairDrafter

PROMPT = "Tom and Sue went to the park. They saw a big dog"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("draft")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--p-min", type=float, default=0.0)
    ap.add_argument("--no-ngram", action="store_true")
    a = ap.parse_args()
    engine = Engine(ModelSettings(a.target, n_threads=1, n_ctx=1024), ModelSettings(a.draft, n_threads=1, n_ctx=1024))
    spec = SpecSettings(mode="spd", k=a.k, p_min=a.p_min, ngram=not a.no_ngram)
    clock = {"target": 0.0, "draft decodes": 0.0, "drafting": 0.0}
    for ctx, name in ((engine.target, "target"), (engine.draft_ctx, "draft decodes")):
        call = ctx._call

        def timed(fn, *args, call=call, name=name):  # type: ignore[no-untyped-def]
            if fn is not ll.llama_decode:
                return call(fn, *args)
            t0 = thread_time()
            try:
                return call(fn, *args)
            finally:
                clock[name] += thread_time() - t0
        ctx._call = timed
    draft = PairDrafter.own

    def timed_draft(self, *args, **kw):  # type: ignore[no-untyped-def]
        t0 = thread_time()
        try:
            return draft(self, *args, **kw)
        finally:
            clock["drafting"] += thread_time() - t0
    PairDrafter.own = timed_draft  # type: ignore[method-assign]
    has_run = native.has_draft_run
    results: dict[str, list[tuple[float, float, float, float]]] = {"python steps": [], "native runs": []}
    texts, stats = {}, {}
    engine.generate(PROMPT, spec=spec, max_tokens=16).run()  # warm-up
    for _ in range(a.repeats):
        for mode in results:
            native.has_draft_run = has_run if mode == "native runs" else (lambda: False)
            clock.update({name: 0.0 for name in clock})
            t0 = thread_time()
            g = engine.generate(PROMPT, spec=spec, max_tokens=a.n).run()
            results[mode].append((thread_time() - t0, clock["target"], clock["draft decodes"], clock["drafting"]))
            texts[mode], stats[mode] = g.tokens, g.stats
    native.has_draft_run = has_run
    assert texts["python steps"] == texts["native runs"], "the modes wrote different text"
    s = stats["python steps"]
    steps = results["python steps"]
    target, drafts = statistics.median(r[1] for r in steps), statistics.median(r[2] for r in steps)
    rounds, drafted = s.n_rounds, max(s.n_drafted, 1)
    print(f"{native.status()}; k {a.k}, p_min {a.p_min}, ngram {not a.no_ngram}: {s.n_tokens} tokens, "
          f"{rounds} rounds, {s.n_drafted} drafted; decodes' CPU a round: target {target / rounds * 1e3:.3f} ms, "
          f"draft {drafts / rounds * 1e3:.3f} ms")
    print(f"{'mode':<13} {'CPU/round':>9} {'host/round':>10} {'host/drafted':>12} {'drafting host/drafted':>21} "
          f"{'CPU/token':>9}   (ms)")
    for mode, rs in results.items():
        cpu = statistics.median(r[0] for r in rs)
        host = cpu - target - drafts
        drafting = statistics.median(r[3] for r in rs) - drafts  # drafting's own host work
        print(f"{mode:<13} {cpu / rounds * 1e3:9.3f} {host / rounds * 1e3:10.3f} {host / drafted * 1e3:12.4f} "
              f"{drafting / drafted * 1e3:21.4f} {cpu / s.n_tokens * 1e3:9.3f}")


if __name__ == "__main__":
    main()
