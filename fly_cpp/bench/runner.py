"""The benchmark loop: every mode on every prompt, interleaved per prompt, after a warm-up.

Interleaving (prompt 1: all modes, prompt 2: all modes, ...) spreads machine drift over all
modes alike; the order of the modes rotates from one prompt to the next so that no mode always
runs first. Before each timed generation both KV caches are brought to the prompt (untimed),
so every mode's time is decoding only, as llama.cpp's own "decoded ... t/s" is.

After the timed runs of a prompt (so that scoring never sits between two timed runs) come
fidelity (agreement with the target's output, the target's NLL of each output) and the task
checker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fly_cpp.bench import fidelity
from fly_cpp.bench.checkers import CHECKERS
from fly_cpp.bench.datasets import Prompt
from fly_cpp.bench.modes import REFERENCE, Mode
from fly_cpp.bench.peer import Peer
from fly_cpp.bench.prompting import PromptRenderer, Rendered
from fly_cpp.config import SamplingSettings
from fly_cpp.engine import Engine
from fly_cpp.errors import FlyError

WARMUP_TOKENS = 16


@dataclass
class BenchConfig:
    max_tokens: int = 128
    sampling: SamplingSettings = field(default_factory=lambda: SamplingSettings(seed=0))
    checker: str | None = None
    template: bool = True
    warmup: bool = True
    fidelity: bool = True


def _record(prompt: Prompt, rendered: Rendered, mode: Mode) -> dict[str, Any]:
    return {"prompt_id": prompt.id, "category": prompt.category, "mode": mode.label, "k": mode.k,
            "n_prompt": len(rendered.tokens), "truncated": rendered.truncated}


class Runner:
    def __init__(self, engine: Engine, modes: Sequence[Mode], config: BenchConfig, peer: Peer | None = None) -> None:
        if modes[0].label != REFERENCE:
            raise ValueError("the reference mode must come first")
        if any(m.peer for m in modes) and peer is None:
            raise ValueError("peer modes need a Peer")
        self.engine, self.modes, self.config, self.peer = engine, list(modes), config, peer
        reserve = config.max_tokens + max(m.max_draft for m in modes) + 2
        self.renderer = PromptRenderer(engine, template=config.template, reserve=reserve)

    def _generate(self, mode: Mode, rendered: Rendered, max_tokens: int) -> dict[str, Any]:
        if mode.peer is not None:
            assert self.peer is not None
            # llama.cpp's binaries abort on characters a byteless vocabulary cannot spell
            run = self.peer.run(mode.peer, self.engine.spellable(rendered.text), max_tokens, mode.k, mode.p_min)
            return {"stats": run.as_dict(), "text": run.text, "peer": True}
        assert mode.spec is not None
        self.engine.prefill(rendered.tokens)
        gen = self.engine.generate(rendered.tokens, spec=mode.spec, sampling=self.config.sampling,
                                   max_tokens=max_tokens)
        loose_rounds = sorted({step.round for step in gen if step.loose})  # rounds that kept a token loosely
        stats = gen.stats.as_dict()
        stats["accepted_lengths"] = list(gen.stats.accepted_lengths)  # per round, 1-based round i at i - 1
        stats["loose_rounds"] = loose_rounds
        return {"stats": stats, "tokens": gen.tokens, "text": gen.text, "finish_reason": gen.finish_reason}

    def warm_up(self, rendered: Rendered) -> None:
        for mode in self.modes:
            self._generate(mode, rendered, min(WARMUP_TOKENS, self.config.max_tokens))

    def run(self, prompts: Sequence[Prompt], progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
        rendered = [self.renderer.render(p.text) for p in prompts]
        if not rendered:
            raise FlyError("no prompts to run")
        if self.config.warmup:
            self.warm_up(rendered[0])
        records: list[dict[str, Any]] = []
        for i, (prompt, r) in enumerate(zip(prompts, rendered)):
            shift = i % len(self.modes)
            order = self.modes[shift:] + self.modes[:shift]
            by_mode: dict[str, dict[str, Any]] = {}
            for mode in order:
                rec = _record(prompt, r, mode)
                rec.update(self._generate(mode, r, self.config.max_tokens))
                by_mode[mode.label] = rec
                if progress is not None:
                    progress(f"{prompt.id} {mode.label}")
            ordered = [by_mode[m.label] for m in self.modes]
            self._score(prompt, r, ordered)
            records += ordered
        return records

    def _score(self, prompt: Prompt, rendered: Rendered, recs: list[dict[str, Any]]) -> None:
        reference = recs[0]
        checker = CHECKERS.get(self.config.checker) if self.config.checker else None
        for rec in recs:
            if rec.get("peer"):  # text only: the binaries print text, and may overshoot max_tokens
                ours, theirs = reference["text"].rstrip("\n"), rec["text"].rstrip("\n")
                rec["same_start_as_target"] = ours.startswith(theirs) or theirs.startswith(ours)
                continue
            if self.config.fidelity:
                rec["agreement"], rec["first_divergence"] = fidelity.agreement(rec["tokens"], reference["tokens"])
                rec["nll"] = self.engine.score(rendered.tokens, rec["tokens"]).nll
            if checker is not None:
                rec["check"] = checker(rec["text"], prompt.meta)
