"""One benchmark, end to end: prompts -> runner -> summary -> results dictionary.

Resuming (``previous``: the results of an earlier run into the same place): its records are
kept and only the missing (prompt, mode) pairs run. A resume is refused when the earlier run
used other models, dataset, token budget, sampling or system message, or when a mode that still
has prompts to run was run there with other settings (its records would not be comparable).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from typing import Any

from fly_cpp.basics.errors import FlyError
from fly_cpp.bench import summary
from fly_cpp.bench.datasets import Dataset, select
from fly_cpp.bench.modes import Mode
from fly_cpp.bench.peer import Peer
from fly_cpp.bench.runner import BenchConfig, Runner
from fly_cpp.engine.engine import Engine

# meta fields two runs must share to be merged into one results file
SAME_RUN = ("dataset", "target", "draft", "max_tokens", "templated", "system", "sampling")
# settings that change nothing in a mode that does not loosen (and the safeguards under the paper's rule)
LOOSENING = ("window", "entropy_threshold", "fly_rule", "loose_min_ratio", "loose_top_n", "loose_in_code",
             "loose_digits", "cross_round", "cross_round_confidence")
SAFEGUARDS = ("loose_min_ratio", "loose_top_n", "loose_in_code", "loose_digits")


def _plain(value: Any) -> Any:
    """``value`` as it reads back from results.json (tuples become lists)."""
    return json.loads(json.dumps(value))


def _mode_settings(m: Mode) -> dict[str, Any]:
    return _plain(dataclasses.asdict(m.spec) if m.spec else {"peer": m.peer, "k": m.k})


def _relevant(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings that can change a mode's output (the target's: none but its mode)."""
    mode = settings.get("mode")
    if mode == "target":
        return {"mode": mode}
    drop = LOOSENING if mode == "spd" else SAFEGUARDS if settings.get("fly_rule") == "paper" else ()
    return {k: v for k, v in settings.items() if k not in drop}


def _differ(before: Any, now: Any) -> bool:
    """Whether a run setting changed; fields only one side has (a newer fly-cpp added them) are
    not compared."""
    if isinstance(before, dict) and isinstance(now, dict):
        return any(k in now and _differ(v, now[k]) for k, v in before.items())
    return before != now


def _check_resume(previous: dict[str, Any], meta: dict[str, Any], modes: Sequence[Mode],
                  prompts: Sequence[str]) -> None:
    old = previous.get("meta", {})
    for key in SAME_RUN:
        if key in old and _differ(_plain(old[key]), _plain(meta[key])):
            raise FlyError(f"--resume: the results there were made with {key} {old[key]!r}, this run has "
                           f"{meta[key]!r}; use another --out")
    have = {(r["prompt_id"], r["mode"]) for r in previous.get("records", [])}
    for m in modes:
        before = old.get("modes", {}).get(m.label)
        if before is None or all((p, m.label) in have for p in prompts):
            continue
        before, now = _relevant(before), _relevant(_mode_settings(m))
        diff = sorted(k for k in before if k in now and before[k] != now[k])  # fields added since: not compared
        if diff:
            shown = ", ".join(f"{k} {before.get(k)!r} there, {now.get(k)!r} now" for k in diff[:3])
            raise FlyError(f"--resume: mode {m.label!r} ran with other settings ({shown}); use another --out")


def run_benchmark(engine: Engine, dataset: Dataset, modes: Sequence[Mode], config: BenchConfig, *,
                  limit: int | None = None, offset: int = 0, peer: Peer | None = None,
                  progress: Callable[[str], None] | None = None,
                  previous: dict[str, Any] | None = None,
                  checkpoint: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run (or, with ``previous``, finish) a benchmark. ``checkpoint`` gets the partial result
    after every prompt that ran something."""
    prompts = select(dataset.prompts, limit, offset)
    runner = Runner(engine, modes, config, peer)
    started = time.time()
    info = engine.info()
    draft = info.draft.path if info.draft is not None else None
    meta: dict[str, Any] = {
        "dataset": dataset.name, "checker": config.checker, "n_prompts": len(prompts),
        "target": os.path.basename(info.target.path), "draft": os.path.basename(draft) if draft else None,
        "target_path": info.target.path, "draft_path": draft, "n_ctx": info.n_ctx,
        "n_threads": info.n_threads, "rpc": list(info.target.rpc),
        "draft_rpc": list(info.draft.rpc) if info.draft is not None else [], "max_tokens": config.max_tokens,
        "k": sorted({m.k for m in modes if m.k is not None}, key=str) or [m.spec.k for m in modes if m.spec][:1],
        "modes": {m.label: _mode_settings(m) for m in modes},
        "templated": runner.renderer.template is not None, "temperature": config.sampling.temperature,
        "sampling": _plain(dataclasses.asdict(config.sampling)), "system": config.system,
        "peer": peer.describe() if peer else None, "machine": platform.machine(), "cpu_count": os.cpu_count(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
    }
    done: list[dict[str, Any]] = []
    if previous is not None:
        _check_resume(previous, meta, modes, [p.id for p in prompts])
        done = list(previous.get("records", []))
        meta["modes"] = {**previous["meta"].get("modes", {}), **meta["modes"]}
        meta["k"] = sorted(set(previous["meta"].get("k", [])) | set(meta["k"]), key=str)
        meta["started"] = previous["meta"].get("started", meta["started"])
    ids = {p.id for p in prompts}
    others = [r for r in done if r["prompt_id"] not in ids]  # prompts this run does not select

    def result(records: list[dict[str, Any]], complete: bool) -> dict[str, Any]:
        reached = {r["prompt_id"] for r in records}  # a partial result keeps what it has not reached yet
        records = records + [r for r in done if r["prompt_id"] in ids and r["prompt_id"] not in reached] + others
        summary.add_ratios(records)
        rows = summary.summarize(records, list(meta["modes"]))
        reference = [r for r in records if r["mode"] == modes[0].label]
        out_meta = {**meta, "n_prompts": len({r["prompt_id"] for r in records}), "complete": complete,
                    "truncated_prompts": sum(1 for r in reference if r["truncated"]),
                    "wall_seconds": time.time() - started + (previous or {}).get("meta", {}).get("wall_seconds", 0.0)}
        return {"meta": out_meta, "summary": rows, "by_category": summary.by_category(records),
                "comparisons": summary.comparisons(rows, records), "records": records}

    records = runner.run(prompts, progress, done=done,
                         on_prompt=None if checkpoint is None else lambda recs: checkpoint(result(recs, False)))
    return result(records, True)
