#!/usr/bin/env python3
"""Price a bench run's recorded rounds with cost curves: what each mode's rounds would take at
another machine's costs (a GPU's), with no models and no clock.

    python scripts/round_prices.py RUN/results.json                         # at the run's own curves
    python scripts/round_prices.py RUN/results.json --curves tests/data/replays/gpu-shaped.json
    python scripts/round_prices.py RUN/results.json --curves-from GPU_RUN/results.json --ratio fly@k12/spd@k12

A round that drafted d tokens costs what k auto prices it at: a draft decode of the catch-up row
with the first step (2 rows), d - 1 one-row steps, and a target decode of d + 1 rows. A round
that drafted nothing costs a one-row target decode, but a first token taken from the prompt's
last row (exact verification: ``Runs.start``) comes with the prompt's decode and costs nothing.
Each token FLy's rule asked of the draft beyond its draft (``n_asked``) costs a one-row step.
"tokens a pass": tokens per target pass after the prompt. (A bench's "mean acc." counts that
first token as a round: beside fly, whose first round decodes the prompt's last token with its
drafts, it gives the exact modes one round more per answer than they decoded.)

The rounds, their draft lengths and the tokens are the run's: greedy, they are what the texts
and the accept rule make of the pair, on any machine (fly's loose accepts included, which
``scripts/replay_pacer.py`` does not replay). Only the prices change, so that rounds recorded on
a CPU predict what the same rounds cost on a GPU.

Curves: ``--curves FILE.json`` (``{"target": {"rows": [...], "seconds": [...]}, "draft": {...}}``,
as ``tests/data/replays/gpu-shaped.json``), else those k auto priced with in a run
(``--curves-from``, default the run itself: its first k auto record's calibrated curves times
its live scales). Each record is priced at the depth halfway through its answer.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path

from fly_cpp.bench.summary import geomean
from fly_cpp.kauto.costs import Costs, Curve

DRAFT_FIRST_ROWS = 2  # the first step of a round decodes the catch-up row beside its own


def read(path: Path) -> dict:
    """A JSON file, gzipped where its name ends in .gz (as the GPU check brings results back)."""
    with (gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")) as f:
        out: dict = json.load(f)
    return out


def costs_from_run(results: dict) -> Costs:
    """The costs a run's first k auto record with a draft model priced with (calibrated, times its live scales)."""
    for rec in results["records"]:
        c = ((rec.get("stats") or {}).get("pacing") or {}).get("costs")
        if c and c.get("draft_ms"):
            return Costs.from_dict(c)
    raise ValueError("it has no k auto record with a draft model's curves (run the bench with a mode at k auto)")


def costs_from_file(path: Path) -> Costs:
    data = read(path)
    return Costs(*(Curve(tuple(data[m]["rows"]), tuple(data[m]["seconds"])) for m in ("target", "draft")))


def from_prompt(stats: dict) -> int:
    """1 where the record's first token came from the prompt's last row (exact verification and
    the target alone: ``Runs.start``), a round of the output's with no target pass of its own, else
    0: the record's ``n_from_prompt``; in records from before it, 1 where ``first_seconds`` is 0
    (no round finished the prompt) and a round drafted nothing."""
    if "n_from_prompt" in stats:
        return int(stats["n_from_prompt"])
    return int(stats["first_seconds"] == 0 and stats["draft_lengths"].get("0", 0) > 0)


def passes(stats: dict) -> int:
    """The target's passes after the prompt: the record's rounds but a first token from the prompt's row."""
    return stats["n_rounds"] - from_prompt(stats)


def price(stats: dict, costs: Costs) -> float:
    """Seconds the record's target passes and draft steps cost at ``costs``."""
    costs.at(stats["n_prompt"] + stats["n_tokens"] // 2)
    seconds = stats["n_asked"] * costs.draft(1) - from_prompt(stats) * costs.target(1)
    for drafted, rounds in stats["draft_lengths"].items():
        d = int(drafted)
        one = costs.target(1) if d == 0 else (costs.draft(DRAFT_FIRST_ROWS) + (d - 1) * costs.draft(1)
                                              + costs.target(d + 1))
        seconds += rounds * one
    return seconds


def table(results: dict, costs: Costs, ratios: list[tuple[str, str]], beside: bool) -> list[str]:
    """One row per mode (its rounds priced at ``costs``) and one per ratio; ``beside``: with what
    the run measured (where ``costs`` are the run's own)."""
    by_mode: dict[str, dict[str, dict]] = defaultdict(dict)
    for rec in results["records"]:
        if not rec.get("peer") and "draft_lengths" in rec.get("stats", {}):
            by_mode[rec["mode"]][rec["prompt_id"]] = rec["stats"]
    seconds = {m: {p: price(s, costs) for p, s in recs.items()} for m, recs in by_mode.items()}
    # per prompt, where an answer had tokens that took time (not an answer ended at its first token)
    priced = {m: {p: s["n_tokens"] / seconds[m][p] for p, s in recs.items() if s["n_tokens"] and seconds[m][p] > 0}
              for m, recs in by_mode.items()}
    measured = {m: {p: s["tokens_per_second"] for p, s in recs.items() if s["tokens_per_second"] > 0}
                for m, recs in by_mode.items()}
    extra = " measured tok/s | priced / measured |" if beside else ""
    out = [f"| mode | prompts | tokens a pass | loose | priced tok/s |{extra}", "|---" * (5 + 2 * beside) + "|"]
    for mode, recs in by_mode.items():
        tokens = sum(s["n_tokens"] for s in recs.values())
        n_passes = sum(passes(s) for s in recs.values())
        p_seconds, m_seconds = sum(seconds[mode].values()), sum(s["seconds"] for s in recs.values())
        p_rate, m_rate = tokens / p_seconds if p_seconds > 0 else 0.0, tokens / m_seconds if m_seconds > 0 else 0.0
        per_pass = (tokens + sum(s["n_eog"] for s in recs.values())) / n_passes if n_passes else 0.0
        row = f"| {mode} | {len(recs)} | {per_pass:.2f} | {sum(s['n_loose'] for s in recs.values())} | {p_rate:.1f} |"
        out.append(row + (f" {m_rate:.1f} | {p_rate / m_rate if m_rate else 0.0:.3f} |" if beside else ""))
    if ratios:
        out += ["", f"| ratio, per prompt (geo) | priced |{' measured |' if beside else ''}",
                "|---" * (2 + beside) + "|"]
    for a, b in ratios:
        if a not in by_mode or b not in by_mode:
            raise ValueError(f"--ratio {a}/{b}: the run's modes are {', '.join(by_mode)}")
        row = f"| {a} / {b} | {_ratio(priced[a], priced[b])} |"
        out.append(row + (f" {_ratio(measured[a], measured[b])} |" if beside else ""))
    return out


def _ratio(a: dict[str, float], b: dict[str, float]) -> str:
    """The geometric mean of a / b over the prompts both have ("-" where none)."""
    both = sorted(set(a) & set(b))
    return f"{geomean([a[p] / b[p] for p in both]):.3f}" if both else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, help="a fly-cpp bench results.json (or .json.gz)")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--curves", type=Path, help="price at these curves (JSON: target, draft; seconds by rows)")
    src.add_argument("--curves-from", type=Path, help="price at the curves k auto used in this bench run")
    ap.add_argument("--ratio", action="append", default=[], metavar="A/B", help="per-prompt ratio of two modes")
    args = ap.parse_args()
    ratios = []
    for r in args.ratio:
        a, sep, b = r.partition("/")
        if not sep or not a or not b:
            ap.error(f"--ratio {r!r}: give two modes as A/B (e.g. fly@k12/spd@k12)")
        ratios.append((a, b))
    try:
        results = read(args.results)
        results["records"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"error: {args.results} is not a fly-cpp bench results.json ({e})")
    where = args.curves or args.curves_from or args.results
    try:
        if args.curves is not None:
            costs = costs_from_file(args.curves)
        else:
            costs = costs_from_run(results if args.curves_from is None else read(args.curves_from))
        lines = table(results, costs, ratios, beside=args.curves is None and args.curves_from is None)
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"error: {where}: {e}")
    print(f"{args.results.name}: its rounds priced at the curves of {where.name}\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
