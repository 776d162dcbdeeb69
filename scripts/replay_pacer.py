#!/usr/bin/env python3
"""Replay k auto's controller, and fixed-k drafting, over a bench run's prompts without the
machine's noise: what each policy would have decoded, timed by the pair's measured cost curves.

    python scripts/replay_pacer.py RUN/results.json --dataset prompts.jsonl [--draft-scale 1.2]
    python scripts/replay_pacer.py RUN/results.json --dataset prompts.jsonl --no-draft --policies auto,spd@k6
    python scripts/replay_pacer.py RUN/results.json --dataset prompts.jsonl --save tests/data/replays/NAME.json.gz
    python scripts/replay_pacer.py tests/data/replays/NAME.json.gz [--policies ...]

From the run: every prompt's rendered tokens (re-rendered from ``--dataset`` as the bench did)
and the target's greedy output (its ``target`` records). One teacher-forced pass of the draft
model over prompt + output gives the draft's top token and its probability at every position:
exactly what the draft proposes while it stays on the target's path (off it, nothing it drafts
can be kept; its confidence there is taken from the same position). Policies then decode each
prompt against that trace, greedy and exact (loose accepts are not replayed):

- ``target``: one plain decode per token;
- ``auto``: the real ``fly_cpp.drafters.drafter.PairDrafter`` and ``fly_cpp.kauto.pacer.Pacer``, with the
  drafter's n-gram checks and catch-up rows, the pacer carried from prompt to prompt as in a bench;
- ``spd@kN`` / ``spd-plain@kN``: N drafted tokens every round, with / without the drafter's n-gram
  checks; ``...pP`` stops a draft under probability P, as llama.cpp's ``--spec-draft-p-min``;
- ``oracle``: drafts exactly the run the target will keep, when that pays.

``--no-draft`` replays the target with n-gram lookup alone (what ``-m`` without ``-d`` runs; the
run needs no draft model): ``auto`` plans with no draft model, ``spd@kN`` guesses up to N tokens
by lookup every round, as the pair's drafter does without a model.

The clock is the pair's calibrated curves (``fly_cpp.kauto.costs``, cached per machine) times the
``--*-scale`` factors; the replayed tok/s of each policy the run also measured is printed beside
the measured one, so that the scales can be set to make the replay keep the run's time.

``--save`` records what a replay reads (the traces, the curves, the run's measured totals) in one
gzipped JSON file, which replays later with no models and on any machine, to the last digit:
``tests/test_replays.py`` replays the recordings in ``tests/data/replays`` against the tables
stored beside them, so that a change to k auto shows what it does to every recorded run.
``--curves FILE.json`` replaces a recording's curves (``{"target": {"rows": [...], "seconds":
[...]}, "draft": {...}}``), e.g. with a GPU's, to replay the same texts at other costs.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fly_cpp.backend import rows
from fly_cpp.backend.cache import common_prefix
from fly_cpp.backend.sampling import NO_BIAS
from fly_cpp.basics.errors import FlyError
from fly_cpp.bench import datasets
from fly_cpp.bench.prompting import PromptRenderer
from fly_cpp.bench.summary import geomean
from fly_cpp.config import ModelSettings, SpecSettings
from fly_cpp.drafters.drafter import PairDrafter
from fly_cpp.drafters.seam import Draft, Drafter, DraftRules, Report
from fly_cpp.drafters.steps import Stepped
from fly_cpp.engine.engine import Engine
from fly_cpp.kauto import worth
from fly_cpp.kauto.costs import Costs, Curve
from fly_cpp.kauto.evidence import Acceptance
from fly_cpp.kauto.pacer import Pacer

OFF = -1  # a drafted token off the target's path: never kept
DEFAULTS = SpecSettings()  # k auto's longest draft and the drafter's n-gram lookup, as the engine runs them
K_MAX = DEFAULTS.k_max


@dataclass
class Trace:
    id: str
    prompt: list[int]
    out: list[int]  # the target's greedy output
    top: list[int]  # the draft's top token after prompt + out[:i], i = 0..len(out) (empty: no draft)
    prob: list[float]  # ... and its probability


@dataclass
class Recording:
    """What a replay reads, with no models: the traces, the pair's curves, the run's totals."""
    traces: list[Trace]
    target: Curve
    draft: Curve | None
    measured: dict[str, list[float]]  # mode -> [tokens, seconds] the run measured
    note: str = ""  # where it came from (pair, prompts, machine, date)

    def save(self, path: Path) -> None:
        data = {"version": 1, "note": self.note, "measured": self.measured,
                "target": dataclasses.asdict(self.target),
                "draft": dataclasses.asdict(self.draft) if self.draft is not None else None,
                "traces": [dataclasses.asdict(t) for t in self.traces]}
        with gzip.open(path, "wt", encoding="utf-8") as f:
            json.dump(data, f, separators=(",", ":"))

    @staticmethod
    def load(path: Path) -> Recording:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
        return Recording([Trace(**t) for t in data["traces"]], _curve(data["target"]), _curve(data["draft"]),
                         data["measured"], data.get("note", ""))


def _curve(d: dict | None) -> Curve | None:
    return None if d is None else Curve(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def traces(engine: Engine, results: dict, dataset: str) -> list[Trace]:
    outputs = {x["prompt_id"]: x for x in results["records"] if x["mode"] == "target"}
    meta = results["meta"]
    ks = [K_MAX if x["k"] == "auto" else x["k"] for x in results["records"] if x.get("k") is not None]
    # as the bench renders them: a prompt too long for the context is cut to leave room for the answer
    renderer = PromptRenderer(engine, template=meta.get("templated", True), system=meta.get("system"),
                              reserve=meta["max_tokens"] + max(ks, default=0) + 2)
    ctx, found = engine.draft_ctx, []
    for p in datasets.load(dataset).prompts:
        if p.id not in outputs:
            continue
        record = outputs[p.id]
        prompt, out = renderer.render(p.text).tokens, record["tokens"]
        if len(prompt) != record["n_prompt"]:
            print(f"skipped {p.id}: renders to {len(prompt)} tokens, the run had {record['n_prompt']}", file=sys.stderr)
            continue
        if ctx is None:
            found.append(Trace(p.id, prompt, out, [], []))
            continue
        ctx.truncate(0)
        logits = ctx.decode(prompt + out, logits=len(out) + 1)[:, : engine.n_vocab]
        found.append(Trace(p.id, prompt, out, [int(t) for t in rows.argmax(logits)],
                           [float(q) for q in rows.top_probability(logits)]))
    return found


class Clock:
    """The replay's time: what the decodes of the pair cost by its calibrated curves
    (``costs``, at the depth set each round), advanced by the decodes replayed."""

    def __init__(self, costs: Costs) -> None:
        self.costs, self.seconds = costs, 0.0

    def now(self) -> float:
        return self.seconds


class TraceModel:
    """The draft model along a trace, as ``DraftModel`` (the ``Stepper`` the real drafter drives): its
    greedy token after any prefix of the target's output is the trace's, off that path its
    tokens are never kept; each step advances the clock by what its decode costs."""

    n_batch = 1 << 30
    bias = NO_BIAS
    checks_guesses = True
    end = None

    def __init__(self, trace: Trace, clock: Clock) -> None:
        self.t, self.clock = trace, clock
        self.cache: list[int] = trace.prompt[:-1]  # what the draft's KV holds: the prompt, as the bench prefills it

    def predict(self, history: list[int], extra: list[int]) -> tuple[int, float]:
        t, pos = self.t, len(history) - len(self.t.prompt)
        at = min(pos + len(extra), len(t.out))
        on = history[len(t.prompt):] + extra == t.out[:pos + len(extra)]
        return (t.top[at] if on else OFF), t.prob[at]

    def is_eog(self, token: int) -> bool:
        return False  # the trace ends where the output did

    def prefill(self, prompt: list[int]) -> None:
        self.cache = list(prompt[:-1])

    def lag(self, committed: list[int]) -> int:
        return len(committed) - 1 - common_prefix(self.cache, committed[:-1])

    def start(self, committed: list[int]) -> list[int]:
        keep = common_prefix(self.cache, committed[:-1])
        self.cache = list(committed[:keep])
        return list(committed[keep:-1])

    def run(self, committed: list[int], limit: int, need: int, spec: object, confident: bool,
            checks: int | None = None) -> None:
        """No native draft runs in a replay: a fixed k drafts through ``step``, as the Python steps do."""
        return None

    def step(self, catchup: list[int], history: list[int], guess: list[int], confident: bool = False) -> Stepped:
        rows = len(catchup) + 1 + len(guess)
        self.clock.seconds += self.clock.costs.draft(rows)
        preds = [self.predict(list(history), list(guess[:j])) for j in range(len(guess) + 1)]
        agree = 0
        while agree < len(guess) and guess[agree] == preds[agree][0]:
            agree += 1
        self.cache = [*history, *guess[:agree]]
        return Stepped(np.array([p for p, _ in preds]), agree, [q for _, q in preds[: agree + 1]], rows)

    def candidate(self, committed: list[int]) -> int:
        return self.predict(committed, [])[0]

    def shift(self, keep: int, drop: int) -> None:
        """No context shift in a replay."""


class Replay:
    """One prompt decoded by one drafter through the real seam (``draft`` / ``accept``), the
    target's judgement exact against the trace; ``clock.seconds`` is the cost model's time."""

    def __init__(self, trace: Trace, clock: Clock) -> None:
        self.t, self.clock = trace, clock

    def oracle(self, committed: list[int], pos: int, limit: int, model: TraceModel) -> list[int]:
        t, run, costs = self.t, 0, self.clock.costs
        while run < limit and t.top[pos + run] == t.out[pos + run]:
            run += 1
        lag = model.lag(committed)
        best, h_best = 1 / costs.target(1), 0
        for h in range(1, run + 1):
            rate = (h + 1) / (costs.draft(lag + 1) + (h - 1) * costs.draft(1) + costs.target(h + 1))
            if rate > best:
                best, h_best = rate, h
        if h_best:
            self.clock.seconds += costs.draft(lag + 1) + (h_best - 1) * costs.draft(1)
            model.cache = committed + t.out[pos: pos + h_best - 1]
        return t.out[pos: pos + h_best]

    def run(self, drafter: Drafter | None, k: int = K_MAX, lengths: Counter | None = None,
            oracle: TraceModel | None = None) -> tuple[int, float, int]:
        """(tokens, seconds, target passes)."""
        t, clock, costs = self.t, self.clock, self.clock.costs
        committed, pos, passes, n = list(t.prompt), 0, 0, len(t.out)
        clock.seconds = 0.0
        if drafter is not None:
            drafter.begin(committed)
        while pos < n:
            costs.at(len(committed))
            limit, start = min(k, n - pos - 1), clock.seconds
            draft = Draft()
            if oracle is not None:
                draft = Draft(self.oracle(committed, pos, limit, oracle))
            elif drafter is not None and limit > 0:
                draft = drafter.draft(committed, limit)
            drafted = draft.tokens
            drafting = clock.seconds - start
            target = costs.target(len(drafted) + 1)
            clock.seconds += target + costs.host
            kept = 0
            while kept < len(drafted) and drafted[kept] == t.out[pos + kept]:
                kept += 1
            committed += t.out[pos: pos + kept + 1]
            pos, passes = pos + kept + 1, passes + 1
            if lengths is not None:
                lengths[len(drafted)] += 1
            if drafter is not None:
                drafter.accept(Report(draft, len(drafted), kept, committed, drafting, target, clock.seconds - start,
                                      len(drafted) + 1))
        return n, clock.seconds, passes


def drafter_for(how: dict, trace: Trace, clock: Clock, pacer: Pacer | None) -> tuple[Drafter | None, TraceModel | None]:
    """The real drafter a policy runs (k auto's paced one, a fixed k's), on the trace."""
    model = TraceModel(trace, clock) if trace.top else None
    if how["policy"] == "target":
        return None, None
    if how["policy"] == "oracle":
        return None, model
    spec = SpecSettings(k=how.get("k", K_MAX), ngram=how.get("ngram", True), p_min=how.get("p_min", 0.0))
    if pacer is None:  # a fixed k checks the guesses that pay at the prior agreement, as the engine prices them
        checks = worth.guess_length(clock.costs, Acceptance().mean(), spec.ngram_tokens, 0) if spec.ngram else None
        rules = DraftRules.of(spec)
        return PairDrafter(model, rules, checks if model is not None else None), None
    return PairDrafter(model, DraftRules.of(spec), pacer=pacer, now=clock.now, cpu=clock.now), None


def policies(names: list[str]) -> list[tuple[str, dict]]:
    out = []
    for name in names:
        base, _, p = name.partition("p0")
        if base in ("auto", "steady", "oracle"):
            out.append((name, {"policy": base}))
            continue
        mode, _, k = base.partition("@k")
        if mode not in ("spd", "spd-plain") or not k.isdigit():
            sys.exit(f"unknown policy {name!r}: auto, steady, oracle, spd@kN, spd-plain@kN (optionally ...p0.75)")
        out.append((name, {"policy": "fixed", "k": int(k), "p_min": float("0" + p) if p else 0.0,
                           "ngram": mode == "spd"}))
    return out


def geo(values: list[float]) -> float:
    return geomean(values) or float("nan")


def record(args: argparse.Namespace) -> Recording:
    """The run's traces and the pair's curves, read with the models (a bench results.json)."""
    try:
        results = json.loads(Path(args.results).read_text(encoding="utf-8"))
        meta = results["meta"]
        keys = ("target_path",) if args.no_draft else ("target_path", "draft_path")
        settings = [ModelSettings(path=meta[key], n_ctx=meta["n_ctx"], n_threads=meta["n_threads"]) for key in keys]
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"error: {args.results} is not a fly-cpp bench results.json{'' if args.no_draft else ' with a draft model'} ({e})")
    if not any(x.get("mode") == "target" for x in results.get("records", [])):
        sys.exit(f"error: {args.results} has no target records to replay (run the bench with the target mode)")
    if args.dataset is None:
        sys.exit("error: --dataset is needed to replay a bench run (the JSONL file or dataset name it used)")
    try:
        # the traces read the draft's row at every position of an answer in one decode
        with Engine(*settings, max_draft=meta["max_tokens"] + 1) as engine:
            found = traces(engine, results, args.dataset)
            calibrated = engine.costs()  # the curves this machine learned for the pair, else measured now
            if calibrated.prior:
                calibrated = engine.costs(refresh=True)
    except FlyError as e:
        sys.exit(f"error: {e}")
    if not found:
        sys.exit(f"error: none of the run's prompts is in --dataset {args.dataset}")
    measured: dict[str, list[float]] = {}
    for x in results["records"]:
        measured.setdefault(x["mode"], [0, 0])
        measured[x["mode"]][0] += x["stats"]["n_tokens"]
        measured[x["mode"]][1] += x["stats"]["seconds"]
    note = (f"{Path(meta['target_path']).name} + {Path(meta['draft_path']).name if not args.no_draft else 'no draft'}, "
            f"{len(found)} prompts of {args.dataset}, {meta['max_tokens']} tokens")
    return Recording(found, calibrated.target_curve, None if args.no_draft else calibrated.draft_curve, measured, note)


def replay(rec: Recording, chosen: list[tuple[str, dict]], args: argparse.Namespace) -> list[str]:
    """The table: one row per policy, replayed over the recording's traces."""
    found, measured = rec.traces, rec.measured
    costs = Costs(rec.target, rec.draft,  # the pacer's, scaled: it learns the scales
                  scales=(args.target_scale, args.batch_scale, args.draft_scale))
    costs.host = args.host_ms / 1e3
    clock = Clock(costs)
    groups = sorted({t.id.split("/")[0] for t in found})
    alone = {t.id: (lambda r: r[0] / r[1])(Replay(t, clock).run(None)) for t in found}
    out = [f"{len(found)} prompts; speedup: per-prompt geometric mean over the target alone, replayed", "",
           f"| policy | {' | '.join(groups)} | all | tok/s replayed | tok/s measured | mean accepted | draft lengths |",
           "|---|" + "---|" * (len(groups) + 5)]
    no_draft = rec.draft is None
    for name, how in [("target", {"policy": "target"}), *chosen]:
        speedups, tokens, seconds, passes, lengths = {}, 0, 0.0, 0, Counter()
        pacer = Pacer(lambda: costs, K_MAX, steady=how["policy"] == "steady") if how["policy"] in ("auto", "steady") else None
        for t in found:
            if args.fresh and pacer is not None:  # every prompt a pair's first answer: nothing learned yet
                pacer = Pacer(lambda: costs, K_MAX, steady=how["policy"] == "steady")
            drafter, oracle = drafter_for(how, t, clock, pacer)  # a paced drafter begins a new text for its pacer
            n, s, p = Replay(t, clock).run(drafter, how.get("k", K_MAX), lengths, oracle)
            speedups[t.id] = (n / s) / alone[t.id]
            tokens, seconds, passes = tokens + n, seconds + s, passes + p
        by_group = [geo([v for i, v in speedups.items() if i.split("/")[0] == g]) for g in groups]
        mode = next((m for m in ("spd", "fly") if m in measured), None) if name == "auto" else name  # k auto's run
        real = measured.get(mode) if name == "target" or not no_draft else None
        out.append(f"| {name} | {' | '.join(f'{v:.3f}' for v in by_group)} | {geo(list(speedups.values())):.3f} | "
                   f"{tokens / seconds:.2f} | {f'{real[0] / real[1]:.2f}' if real else '-'} | "
                   f"{tokens / passes:.2f} | {dict(sorted(lengths.items()))} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a bench run's results.json, or a recording (.json.gz) made with --save")
    ap.add_argument("--dataset", help="the JSONL file or dataset name the run used (not for a recording)")
    ap.add_argument("--policies", default="auto,oracle,spd@k3,spd@k5,spd-plain@k3,spd-plain@k5")
    ap.add_argument("--target-scale", type=float, default=1.0, help="one-row target decodes x this")
    ap.add_argument("--batch-scale", type=float, default=1.0, help="target batches x this")
    ap.add_argument("--draft-scale", type=float, default=1.0, help="draft decodes x this")
    ap.add_argument("--host-ms", type=float, default=0.5, help="host time of a round")
    ap.add_argument("--no-draft", action="store_true", help="the target with n-gram lookup alone")
    ap.add_argument("--save", type=Path, help="record the traces and curves in this .json.gz file")
    ap.add_argument("--curves", type=Path, help="replay with these curves (JSON: target, draft) instead")
    ap.add_argument("--fresh", action="store_true",
                    help="k auto starts anew on every prompt, as a pair's first answer does (nothing learned)")
    args = ap.parse_args()
    chosen = policies(args.policies.split(","))
    if args.no_draft and any(how["policy"] == "oracle" for _, how in chosen):
        sys.exit("error: the oracle drafts with the draft model: not with --no-draft")
    if args.results.endswith(".json.gz"):
        try:
            rec = Recording.load(Path(args.results))
        except (OSError, ValueError, KeyError, TypeError) as e:
            sys.exit(f"error: {args.results} is not a recording made with --save ({e})")
    else:
        rec = record(args)
    if args.curves is not None:
        curves = {k: v for k, v in json.loads(args.curves.read_text(encoding="utf-8")).items() if k in ("target", "draft")}
        rec = dataclasses.replace(rec, target=_curve(curves["target"]),
                                  draft=_curve(curves.get("draft")) if rec.draft is not None else None,
                                  measured={}, note=f"{rec.note}; curves from {args.curves.name}")
    if rec.draft is None and any(how["policy"] == "oracle" for _, how in chosen):
        sys.exit("error: the oracle drafts with the draft model: not with --no-draft")
    if args.save is not None:
        rec.save(args.save)
    print("\n".join(replay(rec, chosen, args)))


if __name__ == "__main__":
    main()
