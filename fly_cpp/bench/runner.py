"""The benchmark loop: every mode on every prompt, interleaved per prompt, after a warm-up.

Interleaving (prompt 1: all modes, prompt 2: all modes, ...) spreads machine drift over all
modes alike; the order of the modes rotates from one prompt to the next so that no mode always
runs first. Before each timed generation both KV caches are brought to the prompt (untimed),
so every mode's time is decoding only, as llama.cpp's own "decoded ... t/s" is.

After the timed runs of a prompt (so that scoring never sits between two timed runs) come
fidelity (agreement with the target's output, the target's NLL of each output, and the loose
accepts with the target's own choice there) and the task checker.

Resuming: ``run`` takes the records of an earlier run (``done``); a (prompt, mode) that has one
is kept as it is and not run again. ``on_prompt`` sees every prompt's records as soon as they
are complete, so that a caller can write them before the next prompt starts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fly_cpp.basics.errors import FlyError
from fly_cpp.bench import fidelity
from fly_cpp.bench.checkers import CHECKERS
from fly_cpp.bench.cold import generate_cold, record
from fly_cpp.bench.datasets import Prompt
from fly_cpp.bench.modes import REFERENCE, Mode
from fly_cpp.bench.peer import Peer
from fly_cpp.bench.prompting import PromptRenderer, Rendered
from fly_cpp.config import SamplingSettings
from fly_cpp.engine.engine import Engine

WARMUP_TOKENS = 16
LOOSE_CONTEXT = (12, 6)  # tokens of text shown before and after a loose accept


@dataclass
class BenchConfig:
    max_tokens: int = 128
    sampling: SamplingSettings = field(default_factory=lambda: SamplingSettings(seed=0))
    checker: str | None = None
    template: bool = True
    warmup: bool = True
    fidelity: bool = True
    system: str | None = None  # a system message before every prompt (chat template only)
    cold: bool = False  # every fly-cpp generation in a fresh process (fly_cpp.bench.cold)


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
        self.renderer = PromptRenderer(engine, template=config.template, reserve=reserve, system=config.system)

    def _generate(self, mode: Mode, rendered: Rendered, max_tokens: int) -> dict[str, Any]:
        if mode.peer is not None:
            assert self.peer is not None
            # llama.cpp's binaries abort on characters a byteless vocabulary cannot spell
            run = self.peer.run(mode.peer, self.engine.spellable(rendered.text), max_tokens, mode.k, mode.p_min,
                                 mode.spec_type)
            return {"stats": run.as_dict(), "text": run.text, "peer": True}
        assert mode.spec is not None
        if self.config.cold:
            return generate_cold(self.engine.target_settings, self.engine.draft_settings, mode.spec,
                                 self.config.sampling, list(rendered.tokens), max_tokens)
        self.engine.prefill(rendered.tokens)
        return record(self.engine.generate(rendered.tokens, spec=mode.spec, sampling=self.config.sampling,
                                           max_tokens=max_tokens))

    def warm_up(self, rendered: Rendered) -> None:
        for mode in self.modes:
            self._generate(mode, rendered, min(WARMUP_TOKENS, self.config.max_tokens))

    def run(self, prompts: Sequence[Prompt], progress: Callable[[str], None] | None = None,
            done: Sequence[dict[str, Any]] = (),
            on_prompt: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
        """Records of every (prompt, mode), the ``done`` ones kept, in prompt order and then
        mode order (modes found only in ``done`` come after this run's)."""
        rendered = [self.renderer.render(p.text) for p in prompts]
        if not rendered:
            raise FlyError("no prompts to run")
        kept: dict[str, dict[str, dict[str, Any]]] = {}
        for rec in done:
            kept.setdefault(rec["prompt_id"], {})[rec["mode"]] = rec
        todo = [[m for m in self.modes if m.label not in kept.get(p.id, {})] for p in prompts]
        if self.config.warmup and not self.config.cold and any(todo):  # a cold run has nothing to warm
            self.warm_up(rendered[0])
        records: list[dict[str, Any]] = []
        for i, (prompt, r, missing) in enumerate(zip(prompts, rendered, todo)):
            shift = i % len(self.modes)
            order = [m for m in self.modes[shift:] + self.modes[:shift] if m in missing]
            by_mode = dict(kept.get(prompt.id, {}))
            new: list[dict[str, Any]] = []
            for mode in order:
                rec = _record(prompt, r, mode)
                rec.update(self._generate(mode, r, self.config.max_tokens))
                by_mode[mode.label] = rec
                new.append(rec)
                if progress is not None:
                    progress(f"{prompt.id} {mode.label}")
            labels = [m.label for m in self.modes]
            ordered = [by_mode[x] for x in labels] + [rec for x, rec in by_mode.items() if x not in labels]
            if new:
                self._score(prompt, r, by_mode[REFERENCE], new)
            records += ordered
            if on_prompt is not None and new:
                on_prompt(records)
        return records

    def _score(self, prompt: Prompt, rendered: Rendered, reference: dict[str, Any], recs: list[dict[str, Any]]) -> None:
        checker = CHECKERS.get(self.config.checker) if self.config.checker else None
        for rec in recs:
            if rec.get("peer"):  # text only: the binaries print text, and may overshoot max_tokens
                ours, theirs = reference["text"].rstrip("\n"), rec["text"].rstrip("\n")
                rec["same_start_as_target"] = ours.startswith(theirs) or theirs.startswith(ours)
                continue
            if self.config.fidelity:
                rec["agreement"], rec["first_divergence"] = fidelity.agreement(rec["tokens"], reference["tokens"])
                loose_at = rec.get("loose_at") or []
                score = self.engine.score(rendered.tokens, rec["tokens"], top_n=1 if loose_at else 0)
                rec["nll"] = score.nll
                if loose_at:
                    rec["loose"] = [self._loose_event(rec["tokens"], score, i) for i in loose_at if i < len(score.logprobs)]
            if checker is not None:
                rec["check"] = checker(rec["text"], prompt.meta)

    def _loose_event(self, tokens: list[int], score: Any, i: int) -> dict[str, Any]:
        """A loosely accepted token with the target's own choice there (from the teacher-forced
        pass) and the text around it."""
        before, after = LOOSE_CONTEXT
        text = lambda ts: self.engine.detokenize(ts)  # noqa: E731
        return {"pos": i, "kept": text(tokens[i:i + 1]), "target": text([int(score.top_ids[i, 0])]),
                "log_ratio": float(score.logprobs[i] - score.top_logprobs[i, 0]),
                "before": text(tokens[max(0, i - before):i]), "after": text(tokens[i + 1:i + 1 + after])}
