#!/usr/bin/env python3
"""Replay of a cost-cache entry that the live decodes contradict: the bundled pair's calibrated
curves cached 20x (target) and 10x (draft) too dear, then R fresh engines each write one greedy
spd answer. Each run should end with the entry cached again as its live decodes priced it
("rescaled"); a run whose scales came out unfit to cache drops it ("dropped") and the next
process measures again inside its answer. Run it beside other work (e.g. three busy
processes on this 2-core machine) to see what load does to the live scales.

    python scripts/contradicted_cache.py [--runs 60] [--tokens 96]
"""

from __future__ import annotations

import argparse
import os
import tempfile

from fly_cpp import Engine, ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.kauto.costs import Curve
from fly_cpp.models import bundled


def _entry(curve: Curve, times: float) -> dict[str, object]:
    return {"rows": list(curve.rows), "seconds": [s * times for s in curve.seconds], "depth": curve.depth,
            "per_token": [p * times for p in curve.per_token]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--tokens", type=int, default=96)
    args = ap.parse_args()
    where = tempfile.mkdtemp(prefix="fly-contradicted-")
    os.environ["FLY_CPP_COSTS"] = os.path.join(where, "costs.json")  # read by the cache at each use
    os.environ["FLY_CPP_EVIDENCE"] = os.path.join(where, "evidence.json")
    from fly_cpp.kauto.costcache import load, store

    def pair() -> tuple[ModelSettings, ModelSettings]:
        return (ModelSettings(str(bundled.TARGET), n_ctx=256, n_threads=1),
                ModelSettings(str(bundled.DRAFT), n_threads=1))

    with Engine(*pair()) as e:  # calibrates once
        key, real = e.control.cost_key(), e.costs()
    dropped = 0
    for i in range(args.runs):
        store(key, {"target": _entry(real.target_curve, 20.0), "draft": _entry(real.draft_curve, 10.0),
                    "measured": "replay"})
        with Engine(*pair()) as e:
            gen = e.generate("Once upon a time", spec=SpecSettings(mode="spd"),
                             sampling=SamplingSettings(temperature=0), max_tokens=args.tokens).run()
        costs = gen.stats.pacing["costs"]
        kept = load().get(key)
        dropped += kept is None
        print(f"run {i}: {'rescaled' if kept else 'dropped'}  one-row scale {costs['target_scale']}  "
              f"batch scale {costs['batch_scale']}", flush=True)
    print(f"dropped {dropped} of {args.runs}")


if __name__ == "__main__":
    main()
