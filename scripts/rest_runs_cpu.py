"""CPU time per generated token of k auto's defaults, with the rounds its pacer leaves to the
target alone decoded in native runs (``Draft.alone``) against one Python round each, and of
target-only (in runs) for reference, in one process on a busy machine.

CPU time of this thread, not wall clock: with one thread llama.cpp computes in the calling
thread. Per prompt and configuration, a generation of -n 1 and one of -n N; the difference per
token leaves out the prompt. Configurations alternate per prompt; medians over prompts and
repeats. The pacer (one per engine) carries over, as in a server; its plans are printed.

    python scripts/rest_runs_cpu.py TARGET.gguf DRAFT.gguf [--n 129] [--repeats 3]
        [--dataset spec_bench] [--prompts 19,20,21,23,37,38]

The default prompts are spec_bench's whose text does not end within 129 tokens on the kit's
``fast`` pair, where k auto drafts in few rounds (most prompts before 19 end after 4 tokens).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from time import thread_time

from fly_cpp import Engine, ModelSettings, SpecSettings
from fly_cpp.bench import datasets
from fly_cpp.rounds.runs import Runs


@contextmanager
def rounds_one_by_one() -> Iterator[None]:
    """Runs for target-only generations only, as before the rest ran natively."""
    make = Runs.make
    Runs.make = lambda request, target, drafting, constrained: None if drafting else make(  # type: ignore[method-assign]
        request, target, drafting, constrained)
    try:
        yield
    finally:
        Runs.make = make  # type: ignore[method-assign]


def per_token(engine: Engine, prompt: str, spec: SpecSettings, n: int) -> tuple[float, dict[int, int]]:
    """ms of this thread's CPU per token past the first, and the long generation's draft lengths."""
    used = []
    for max_tokens in (1, n):
        t0 = thread_time()
        got = engine.generate(prompt, spec=spec, max_tokens=max_tokens).run()
        used.append((thread_time() - t0, len(got.tokens)))
    (c1, n1), (cn, nn) = used
    return (cn - c1) / max(nn - n1, 1) * 1e3, got.stats.draft_lengths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target")
    ap.add_argument("draft")
    ap.add_argument("--n", type=int, default=129)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dataset", default="spec_bench")
    ap.add_argument("--prompts", default="19,20,21,23,37,38", help="indices into the dataset")
    a = ap.parse_args()
    every = datasets.load(a.dataset).prompts
    prompts = [every[int(i)].text for i in a.prompts.split(",")]
    engine = Engine(ModelSettings(a.target, n_threads=1, n_ctx=1024), ModelSettings(a.draft, n_threads=1, n_ctx=1024))
    defaults, target = SpecSettings(), SpecSettings(mode="target")
    ms: dict[str, list[float]] = {"defaults, rest round by round": [], "defaults, rest in runs": [], "target-only": []}
    lengths: dict[int, int] = {}
    engine.generate(prompts[0], spec=defaults, max_tokens=8).run()  # costs measured (or read) before the clock
    for rep in range(a.repeats):
        for prompt in prompts:
            with rounds_one_by_one():
                ms["defaults, rest round by round"].append(per_token(engine, prompt, defaults, a.n)[0])
            cpu, drafted = per_token(engine, prompt, defaults, a.n)
            ms["defaults, rest in runs"].append(cpu)
            ms["target-only"].append(per_token(engine, prompt, target, a.n)[0])
            for k, v in drafted.items():
                lengths[k] = lengths.get(k, 0) + v
        print(rep, {k: round(statistics.median(v), 3) for k, v in ms.items()}, flush=True)
    ref = statistics.median(ms["target-only"])
    for name, values in ms.items():
        mid = statistics.median(values)
        print(f"{name}: {mid:.3f} ms CPU per token (median of {len(values)}); target-only / this {ref / mid:.3f}")
    print("draft lengths (rest in runs):", dict(sorted(lengths.items())))
    engine.close()


if __name__ == "__main__":
    main()
