#!/usr/bin/env python3
"""How much each of k auto's tuning constants matters on the recorded runs: every recording in
tests/data/replays replayed with k auto (own curves, and the ASSUMED GPU-shaped ones), with one
constant moved at a time (half and double, or the values given), as the ratio of its speedup
over the target alone to today's. 1.000 everywhere: no recording exercises what the constant
guards (its comment names the incident or test that does).

    python scripts/replay_sensitivity.py                      # every constant, half and double
    python scripts/replay_sensitivity.py PRICE_SPREAD=0.075,0.3 MEMORY=0.98,0.995
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "replays"
sys.path.insert(0, str(ROOT))
_spec = importlib.util.spec_from_file_location("replay_pacer", ROOT / "scripts" / "replay_pacer.py")
rp = importlib.util.module_from_spec(_spec)
sys.modules["replay_pacer"] = rp
_spec.loader.exec_module(rp)  # type: ignore[union-attr]

from fly_cpp.kauto import belief, costs, decayed, evidence, planner, worth  # noqa: E402

# constant -> the modules that read it by name (a module that imported it keeps its own binding)
READERS = {"PRICE_SPREAD": [costs, belief], "UNCHECKED_SPREAD": [belief], "CORRECTION_PRIOR": [belief],
           "AGE": [belief, planner], "PRIOR": [evidence, belief], "MEMORY": [evidence, belief],
           "ROUND": [decayed, belief, evidence, costs], "MIN_SHALLOW": [costs],
           "BINS": [evidence, belief, planner]}
# constant -> (module, name, how) of the constants derived from it, moved with it
_TOLERANCE = lambda spread: math.exp(3 * spread)  # noqa: E731 (costs.CHECK_TOLERANCE)
DERIVED = {"PRICE_SPREAD": [(costs, "CHECK_TOLERANCE", _TOLERANCE), (costs, "MAX_PER_ROW", _TOLERANCE),
                            (worth, "CHECK_TOLERANCE", _TOLERANCE)],
           "BINS": [(planner, "GRID", lambda bins: 4 * bins)]}
# half and double; for a weight of old evidence m, (1 - m) halved and doubled
MOVES = {"PRICE_SPREAD": [0.075, 0.3], "UNCHECKED_SPREAD": [1.0, 4.0], "CORRECTION_PRIOR": [1.0, 4.0],
         "AGE": [0.98, 0.995], "PRIOR": [1.0, 4.0], "MEMORY": [0.98, 0.995], "ROUND": [0.05, 0.2],
         "MIN_SHALLOW": [0.125, 0.5], "BINS": [5, 20]}
ARGS = argparse.Namespace(target_scale=1.0, batch_scale=1.0, draft_scale=1.0, host_ms=0.5, fresh=False)


def recordings() -> dict[str, rp.Recording]:
    gpu = json.loads((DATA / "gpu-shaped.json").read_text(encoding="utf-8"))
    out = {}
    for path in sorted(DATA.glob("*.json.gz")):
        rec, name = rp.Recording.load(path), path.name.removesuffix(".json.gz")
        out[name] = rec
        out[f"{name} (GPU-shaped)"] = dataclasses.replace(rec, target=rp._curve(gpu["target"]),
                                                         draft=rp._curve(gpu["draft"]), measured={})
    return out


def speedups(recs: dict[str, rp.Recording]) -> dict[str, float]:
    """k auto's per-prompt geometric mean speedup over the target alone, by recording."""
    out = {}
    for name, rec in recs.items():
        row = next(line for line in rp.replay(rec, rp.policies(["auto"]), ARGS) if line.startswith("| auto |"))
        groups = len({t.id.split("/")[0] for t in rec.traces})
        out[name] = float(row.split("|")[2 + groups])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("moves", nargs="*", help="NAME=v1,v2 (default: every constant at half and double)")
    moves = {name: [float(v) for v in values.split(",")]
             for name, _, values in (m.partition("=") for m in ap.parse_args().moves)}
    for name in moves:
        if name not in READERS:
            sys.exit(f"unknown constant {name!r} (known: {', '.join(READERS)})")
    recs = recordings()
    base = speedups(recs)
    print(f"| constant | today | moved to | {' | '.join(base)} |")
    print("|---|---|---|" + "---|" * len(base))
    print(f"| (today) | | | {' | '.join(f'{v:.3f}' for v in base.values())} |")
    for name, modules in READERS.items():
        today = getattr(modules[0], name)
        values = moves.get(name) if moves else MOVES[name]
        if values is None:
            continue
        for value in values:
            kept = int(value) if isinstance(today, int) else value
            for m in modules:
                setattr(m, name, kept)
            for m, attr, how in DERIVED.get(name, []):
                setattr(m, attr, how(kept))
            got = speedups(recs)
            print(f"| {name} | {today:g} | {kept:g} | {' | '.join(f'{got[k] / base[k]:.3f}' for k in base)} |", flush=True)
        for m in modules:
            setattr(m, name, today)
        for m, attr, how in DERIVED.get(name, []):
            setattr(m, attr, how(today))


if __name__ == "__main__":
    main()
