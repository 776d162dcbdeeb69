"""The engine: a target model, an optional draft model, and the speculative loop.

Position invariant of the loop (asserted each round): before a round, the target's KV cache
holds every committed token but the last (``target.tokens == committed[:-1]``). The round
decodes [last committed, d_1..d_m] in one batch, which yields the m+1 rows of logits it needs,
keeps n drafted tokens, and rolls the cache back to ``committed + d_1..d_n``; the correction
or bonus token t_{n+1} is committed without being decoded, which restores the invariant.
The draft model keeps the same invariant on its own cache (see ``drafters.sync``): after a
full accept its catch-up is decoding d_m, which it drafted but never fed itself.

Target-only decoding is the same loop with empty drafts (m = 0).
"""

from __future__ import annotations

import math
import secrets
import threading
from collections.abc import Iterator, Sequence
from time import perf_counter

import numpy as np

from fly_cpp import rows
from fly_cpp._llama import Context, Model
from fly_cpp.accept import AcceptPolicy, Verdict, entropy_needed, verify
from fly_cpp.config import ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.drafters import Drafter, ModelDrafter, NgramDrafter, sync
from fly_cpp.errors import FlyError
from fly_cpp.sampling import Sampler, rejection_verify
from fly_cpp.step import Stats, Step
from fly_cpp.text import Detokenizer, StopFilter
from fly_cpp.vocab import check_compatible

DEFAULT_MAX_CTX = 4096


def _settings(model: ModelSettings | str) -> ModelSettings:
    return model if isinstance(model, ModelSettings) else ModelSettings(path=str(model))


class Generation:
    """One generation. Iterate it for Steps as they are committed; afterwards ``text``,
    ``tokens``, ``stats`` and ``finish_reason`` ("stop" or "length") are final."""

    def __init__(self, engine: Engine, prompt: list[int], spec: SpecSettings, sampling: SamplingSettings,
                 max_tokens: int, stop: Sequence[str], seed: int) -> None:
        self.prompt = prompt
        self.spec = spec
        self.sampling = sampling
        self.max_tokens = max_tokens
        self.stop = tuple(stop)
        self.seed = seed
        self.text = ""
        self.tokens: list[int] = []
        self.stats = Stats(mode=spec.mode, n_prompt=len(prompt))
        self.finish_reason: str | None = None
        self.context_full = False
        self._steps = engine._run(self)

    def __iter__(self) -> Iterator[Step]:
        for step in self._steps:
            self.text += step.text
            self.tokens.append(step.token)
            yield step

    def run(self) -> Generation:
        """Generate to the end without streaming."""
        for _ in self:
            pass
        return self

    def close(self) -> None:
        """Abandon the generation early (the caches stay consistent)."""
        self._steps.close()


class Engine:
    """Loads the models once; ``generate`` may be called many times (calls are serialised).
    Consecutive generations reuse the longest common prefix of both KV caches."""

    def __init__(self, target: ModelSettings | str, draft: ModelSettings | str | None = None) -> None:
        self.target_settings = _settings(target)
        self.draft_settings = _settings(draft) if draft is not None else None
        self._lock = threading.Lock()
        self.draft_model: Model | None = None
        self.draft_ctx: Context | None = None
        self.target_model = self._load(self.target_settings)
        try:
            t = self.target_settings
            n_ctx = t.n_ctx or min(self.target_model.n_ctx_train or DEFAULT_MAX_CTX, DEFAULT_MAX_CTX)
            self.target = Context(self.target_model, n_ctx=n_ctx, n_threads=t.threads, n_batch=t.n_batch,
                                  n_ubatch=t.n_ubatch)
            if self.draft_settings is not None:
                d = self.draft_settings
                self.draft_model = self._load(d)
                check_compatible(self.target_model, self.draft_model)
                for model in (self.target_model, self.draft_model):
                    if not model.rolls_back:
                        raise FlyError(f"{model.name} is a recurrent/hybrid model: its cache cannot roll back "
                                       "drafted tokens, so it cannot take part in speculative decoding")
                # the draft holds the same tokens as the target, so it gets the same context size
                self.draft_ctx = Context(self.draft_model, n_ctx=self.target.n_ctx, n_threads=d.threads,
                                     n_batch=d.n_batch, n_ubatch=d.n_ubatch)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _load(s: ModelSettings) -> Model:
        return Model(s.path, n_gpu_layers=s.n_gpu_layers, split_mode=s.split_mode, main_gpu=s.main_gpu,
                     tensor_split=s.tensor_split, repack=s.repack)

    @property
    def n_ctx(self) -> int:
        return self.target.n_ctx

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.target_model.tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.target_model.detokenize(tokens)

    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        spec: SpecSettings = SpecSettings(),
        sampling: SamplingSettings = SamplingSettings(),
        max_tokens: int = 128,
        stop: Sequence[str] = (),
    ) -> Generation:
        """Prepare a generation (errors about the request are raised here, before any token)."""
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not tokens:
            raise FlyError("the prompt is empty")
        if len(tokens) > self.n_ctx:
            raise FlyError(f"the prompt is {len(tokens)} tokens, longer than the context (n_ctx={self.n_ctx})")
        if bad := [t for t in tokens if not 0 <= t < self.target_model.n_vocab]:
            raise FlyError(f"token id {bad[0]} is outside the vocabulary (0..{self.target_model.n_vocab - 1})")
        if max_tokens < 0:
            raise FlyError(f"max_tokens must be >= 0, got {max_tokens}")
        if spec.mode != "target" and self.draft_ctx is None and not spec.ngram:
            raise FlyError(f"mode {spec.mode} needs a draft model or n-gram lookup")
        seed = sampling.seed if sampling.seed is not None else secrets.randbits(32)
        return Generation(self, tokens, spec, sampling, max_tokens, stop, seed)

    def _drafter(self, spec: SpecSettings) -> Drafter | None:
        if spec.mode == "target":
            return None
        if self.draft_ctx is not None:
            return ModelDrafter(self.draft_ctx, min(self.target_model.n_vocab, self.draft_ctx.model.n_vocab), spec)
        return NgramDrafter(spec)

    def _run(self, gen: Generation) -> Iterator[Step]:
        with self._lock:
            yield from self._loop(gen)

    def _loop(self, gen: Generation) -> Iterator[Step]:
        spec, stats, target = gen.spec, gen.stats, self.target
        policy = AcceptPolicy(spec.window, spec.entropy_threshold) if spec.mode == "fly" else AcceptPolicy.exact()
        sampler = Sampler(gen.sampling, gen.seed)
        drafter = self._drafter(spec)
        detok, stops = Detokenizer(self.target_model.piece), StopFilter(gen.stop)
        committed = list(gen.prompt)

        begin = perf_counter()
        sync(target, committed)
        start = perf_counter()
        stats.prompt_seconds = start - begin
        paused = 0.0  # time spent by the consumer between our yields, not ours to count
        try:
            while gen.finish_reason is None and stats.n_tokens < gen.max_tokens:
                room = target.n_ctx - len(committed)  # drafted tokens that still fit the cache
                if room < 0:
                    gen.finish_reason, gen.context_full = "length", True
                    break
                assert target.tokens == committed[:-1] if len(committed) < 64 else len(target.tokens) == len(committed) - 1
                limit = min(spec.k, room, gen.max_tokens - stats.n_tokens - 1)
                t0 = perf_counter()
                drafted = drafter.draft(committed, limit) if drafter is not None and limit > 0 else []
                t1 = perf_counter()
                logits = target.decode([committed[-1], *drafted], logits="all")  # (m+1, n_vocab) view
                t2 = perf_counter()
                verdict = self._verify(logits, drafted, committed, policy, sampler)
                target.truncate(len(committed) + verdict.accepted)
                stats.draft_seconds += t1 - t0
                stats.target_seconds += t2 - t1
                stats.n_rounds += 1
                stats.n_drafted += len(drafted)
                stats.n_exact += verdict.n_exact
                stats.n_loose += len(verdict.loose)
                stats.n_gate_rejected += verdict.gate_rejected
                stats.accepted_lengths.append(verdict.accepted + 1)

                released: list[Step] = []
                for i, token in enumerate([*drafted[: verdict.accepted], verdict.next_token]):
                    if self.target_model.is_eog(token):
                        gen.finish_reason = "stop"
                        break
                    committed.append(token)
                    stats.n_tokens += 1
                    released += stops.push(Step(token, detok(token), i < verdict.accepted, i in verdict.loose, stats.n_rounds))
                    if stops.stopped:
                        gen.finish_reason = "stop"
                        break
                    if stats.n_tokens >= gen.max_tokens:
                        break
                if gen.finish_reason is None and stats.n_tokens >= gen.max_tokens:
                    gen.finish_reason = "length"
                if gen.finish_reason is not None:
                    released += stops.flush()
                t3 = perf_counter()
                for step in released:
                    yield step
                paused += perf_counter() - t3
            if gen.finish_reason is None:  # max_tokens == 0
                gen.finish_reason = "length"
        finally:
            stats.seconds = perf_counter() - start - paused

    def _verify(self, logits: np.ndarray, drafted: list[int], committed: list[int], policy: AcceptPolicy,
                sampler: Sampler) -> Verdict:
        m = len(drafted)
        draft_ids = np.asarray(drafted, dtype=np.int64)  # (m,)

        def history(i: int) -> list[int]:
            return committed + drafted[:i]

        if sampler.settings.greedy:
            target = sampler.greedy(logits, history)  # (m+1,)
            need = entropy_needed(draft_ids, target, policy)
            entropy = None
            if need.any():
                entropy = np.zeros(m)
                entropy[need] = rows.top_entropy(logits[:m][need])
            return verify(draft_ids, target, entropy, policy)
        if policy.window >= 1 and math.isfinite(policy.entropy_threshold):  # the authors' sampled rule
            first = np.array([sampler.sample(logits[i], history(i)) for i in range(m + 1)])
            second = np.array([sampler.sample(logits[i], history(i)) for i in range(m)])
            return verify(draft_ids, first, rows.top_entropy(logits[:m]), policy, target_alt=second)
        n, token = rejection_verify(drafted, lambda i: sampler.distribution(logits[i], history(i)), sampler)
        return Verdict(accepted=n, loose=(), next_token=token, gate_rejected=False)

    def close(self) -> None:
        for part in (self.draft_ctx, getattr(self, "target", None), self.draft_model, self.target_model):
            if part is not None:
                part.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
