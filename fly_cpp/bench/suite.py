"""One benchmark, end to end: prompts -> runner -> summary -> results dictionary."""

from __future__ import annotations

import dataclasses
import os
import platform
import time
from collections.abc import Callable, Sequence
from typing import Any

from fly_cpp.bench import summary
from fly_cpp.bench.datasets import Dataset, select
from fly_cpp.bench.modes import Mode
from fly_cpp.bench.peer import Peer
from fly_cpp.bench.runner import BenchConfig, Runner
from fly_cpp.engine import Engine


def run_benchmark(engine: Engine, dataset: Dataset, modes: Sequence[Mode], config: BenchConfig, *,
                  limit: int | None = None, peer: Peer | None = None,
                  progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    prompts = select(dataset.prompts, limit)
    runner = Runner(engine, modes, config, peer)
    started = time.time()
    records = runner.run(prompts, progress)
    summary.add_ratios(records)
    rows = summary.summarize(records, [m.label for m in modes])
    info = engine.info()
    draft = info.draft.path if info.draft is not None else None
    meta = {
        "dataset": dataset.name, "checker": config.checker, "n_prompts": len(prompts),
        "target": os.path.basename(info.target.path), "draft": os.path.basename(draft) if draft else None,
        "target_path": info.target.path, "draft_path": draft, "n_ctx": info.n_ctx,
        "n_threads": info.n_threads, "rpc": list(info.target.rpc),
        "draft_rpc": list(info.draft.rpc) if info.draft is not None else [], "max_tokens": config.max_tokens,
        "k": sorted({m.k for m in modes if m.k is not None}, key=str) or [m.spec.k for m in modes if m.spec][:1],
        "modes": {m.label: (dataclasses.asdict(m.spec) if m.spec else {"peer": m.peer, "k": m.k}) for m in modes},
        "templated": runner.renderer.template is not None, "temperature": config.sampling.temperature,
        "truncated_prompts": sum(1 for r in records if r["mode"] == modes[0].label and r["truncated"]),
        "peer": peer.describe() if peer else None, "machine": platform.machine(), "cpu_count": os.cpu_count(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "wall_seconds": time.time() - started,
    }
    return {"meta": meta, "summary": rows, "by_category": summary.by_category(records),
            "comparisons": summary.comparisons(rows, records), "records": records}
