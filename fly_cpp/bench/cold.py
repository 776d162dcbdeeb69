"""``fly-cpp bench --cold``: each fly-cpp generation in a fresh process, as a user meets the CLI
(``fly-cpp generate`` per prompt): the models load, the cost curves and k auto's evidence come
from their caches (or are measured), nothing is carried over from an earlier prompt. The child
prefills the prompt before the clock starts, as the warm bench does and as llama.cpp's binaries
report their decode speed, so both figures stand beside each other."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from typing import Any

from fly_cpp.basics.errors import FlyError
from fly_cpp.config import ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.engine.engine import Engine
from fly_cpp.engine.generation import Generation

TIMEOUT = 3600  # seconds one cold generation may take before the bench gives up on it


def record(gen: Generation) -> dict[str, Any]:
    """A generation's bench record: its stats, per-round accepted lengths and loose rounds."""
    steps = list(gen)
    loose_at = [i for i, step in enumerate(steps) if step.loose]
    stats = gen.stats.as_dict()
    stats["accepted_lengths"] = list(gen.stats.accepted_lengths)  # per round, 1-based round i at i - 1
    stats["loose_rounds"] = sorted({steps[i].round for i in loose_at})  # rounds that kept a token loosely
    return {"stats": stats, "tokens": gen.tokens, "text": gen.text, "finish_reason": gen.finish_reason,
            "loose_at": loose_at}


def generate_cold(target: ModelSettings, draft: ModelSettings | None, spec: SpecSettings,
                  sampling: SamplingSettings, tokens: list[int], max_tokens: int) -> dict[str, Any]:
    """``record`` of one generation run in a new Python process."""
    job = {"target": dataclasses.asdict(target), "draft": dataclasses.asdict(draft) if draft is not None else None,
           "spec": dataclasses.asdict(spec), "sampling": dataclasses.asdict(sampling), "tokens": tokens,
           "max_tokens": max_tokens}
    try:
        done = subprocess.run([sys.executable, "-m", "fly_cpp.bench.cold"], input=json.dumps(job),
                              capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        raise FlyError(f"a cold generation ran past {TIMEOUT} s") from None
    if done.returncode != 0:
        tail = [line for line in done.stderr.strip().splitlines() if line.strip()][-1:] or ["(no message)"]
        raise FlyError(f"a cold generation failed (exit {done.returncode}): {tail[0][:200]}")
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def _settings(fields: dict[str, Any]) -> dict[str, Any]:
    """Settings fields as JSON gave them back, with their tuples (JSON lists) tuples again: every
    sequence a settings class holds is a tuple (``preserved_tokens``, ``logit_bias``, ``rpc``)."""
    def tuples(value: Any) -> Any:
        return tuple(tuples(v) for v in value) if isinstance(value, list) else value
    return {name: tuples(value) for name, value in fields.items()}


def _child() -> None:
    job = json.load(sys.stdin)
    draft = ModelSettings(**_settings(job["draft"])) if job["draft"] is not None else None
    spec = SpecSettings(**_settings(job["spec"]))
    with Engine(ModelSettings(**_settings(job["target"])), draft, max_draft=spec.max_draft,
                branches=spec.draft_tree > 0) as engine:
        engine.prefill(job["tokens"])
        gen = engine.generate(job["tokens"], spec=spec,
                              sampling=SamplingSettings(**_settings(job["sampling"])), max_tokens=job["max_tokens"])
        json.dump(record(gen), sys.stdout)


if __name__ == "__main__":
    _child()
