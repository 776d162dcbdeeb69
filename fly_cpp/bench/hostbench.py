"""Host time of a speculative round, numpy vs native, measured.

Two measurements:
- ``round_table``: the per-row work one round does on the host, on random logits of a given
  vocabulary size and draft length k. A greedy round: argmax of the k+1 target rows, top-3
  entropy of the drafted rows (worst case: all k need the gate), and k one-row draft argmaxes
  with the draft's confidence in each (one per draft step: k auto asks every drafted token's).
  A sampled round (authors' rule): 2k+1 draws from the sampling chain plus the k entropies.
- ``engine_share``: real generations on a model pair with the library on and off, reporting
  the time per round spent outside the draft and target forward passes (``Stats.host_seconds``)
  and its share of the round.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from time import perf_counter

import numpy as np

from fly_cpp.backend import native, rows
from fly_cpp.backend.sampling import Sampler
from fly_cpp.config import SamplingSettings, SpecSettings
from fly_cpp.engine.engine import Engine

VOCABS = (512, 32000, 128256, 151936)
KS = (4, 8, 15)


@dataclass(frozen=True)
class RoundTiming:
    """Median host seconds of one round; ``native`` is None without the library."""

    mode: str
    n_vocab: int
    k: int
    numpy: float
    native: float | None

    @property
    def speedup(self) -> float | None:
        return self.numpy / self.native if self.native else None


def _round(mode: str, target: np.ndarray, draft: np.ndarray, sampler: Sampler) -> Callable[[], None]:
    """target: (k+1, V) float32 target logits; draft: (k, V) float32 draft logits."""
    k = draft.shape[0]

    def greedy() -> None:
        rows.argmax(target)
        rows.top_entropy(target[:k])
        for i in range(k):
            rows.argmax(draft[i : i + 1])
            rows.top_probability(draft[i : i + 1])

    def sampled() -> None:
        for i in range(2 * k + 1):
            sampler.sample(target[i % (k + 1)], ())
        rows.top_entropy(target[:k])

    return greedy if mode == "greedy" else sampled


def time_round(mode: str, n_vocab: int, k: int, repeats: int = 7, seed: int = 0) -> tuple[float, float | None]:
    """Median seconds of one round on random logits (normal, sd 3: a spread-out distribution),
    (numpy, native); the two are timed alternately so that a busy machine slows both alike."""
    rng = np.random.default_rng(seed)
    target = rng.standard_normal((k + 1, n_vocab), dtype=np.float32) * 3.0  # (k+1, V)
    draft = rng.standard_normal((k, n_vocab), dtype=np.float32) * 3.0  # (k, V)
    settings = (False, True) if native.available() else (False,)
    times: dict[bool, list[float]] = {on: [] for on in settings}
    for rep in range(repeats + 1):
        for on in settings:
            run = _round(mode, target, draft, Sampler(SamplingSettings(temperature=0.8), seed))
            with native.enabled(on):
                t0 = perf_counter()
                run()
                if rep:  # the first is a warm-up: first touch of the arrays, library load
                    times[on].append(perf_counter() - t0)
    return statistics.median(times[False]), statistics.median(times[True]) if True in times else None


def round_table(mode: str = "greedy", vocabs: Sequence[int] = VOCABS, ks: Sequence[int] = KS,
                repeats: int = 7) -> list[RoundTiming]:
    return [RoundTiming(mode, n_vocab, k, *time_round(mode, n_vocab, k, repeats)) for n_vocab in vocabs for k in ks]


def format_table(timings: Sequence[RoundTiming]) -> str:
    lines = [f"{'vocab':>7} {'k':>3} {'numpy ms':>9} {'native ms':>9} {'speedup':>7}"]
    for t in timings:
        fast = f"{t.native * 1e3:9.3f}" if t.native is not None else f"{'-':>9}"
        gain = f"{t.speedup:6.1f}x" if t.speedup is not None else f"{'-':>7}"
        lines.append(f"{t.n_vocab:>7} {t.k:>3} {t.numpy * 1e3:9.3f} {fast} {gain}")
    return "\n".join(lines)


@dataclass(frozen=True)
class EngineShare:
    """Per-round times (seconds) of real generations, summed over the runs."""

    native: bool
    n_rounds: int
    n_tokens: int
    round: float
    draft: float
    target: float
    host: float

    @property
    def host_share(self) -> float:
        return self.host / self.round if self.round else 0.0

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "host_share": self.host_share}


def engine_share(engine: Engine, prompt: str, spec: SpecSettings, sampling: SamplingSettings,
                 max_tokens: int = 64, runs: int = 3) -> list[EngineShare]:
    """Generate ``runs`` times with the library off, then on (same seed, same tokens), and
    split the rounds' time into draft, target and host."""
    if sampling.seed is None:
        sampling = SamplingSettings(**{**asdict(sampling), "seed": 0})
    out = []
    for use_native in (False, True) if native.available() else (False,):
        with native.enabled(use_native):
            engine.generate(prompt, spec=spec, sampling=sampling, max_tokens=max_tokens).run()  # warm-up
            rounds = tokens = 0
            total = draft = target = host = 0.0
            for _ in range(runs):
                stats = engine.generate(prompt, spec=spec, sampling=sampling, max_tokens=max_tokens).run().stats
                rounds += stats.n_rounds
                tokens += stats.n_tokens
                total += stats.seconds
                draft += stats.draft_seconds
                target += stats.target_seconds
                host += stats.host_seconds
        n = max(rounds, 1)
        out.append(EngineShare(use_native, rounds, tokens, total / n, draft / n, target / n, host / n))
    return out


def format_shares(shares: Sequence[EngineShare]) -> str:
    lines = [f"{'native':>6} {'rounds':>6} {'round ms':>9} {'draft ms':>9} {'target ms':>9} {'host ms':>8} {'host %':>6}"]
    for s in shares:
        lines.append(f"{'on' if s.native else 'off':>6} {s.n_rounds:>6} {s.round * 1e3:9.3f} {s.draft * 1e3:9.3f} "
                     f"{s.target * 1e3:9.3f} {s.host * 1e3:8.3f} {s.host_share * 100:5.1f}%")
    return "\n".join(lines)
