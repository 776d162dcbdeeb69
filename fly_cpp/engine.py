"""The engine: loads a target model and an optional draft model once, checks that they fit
together, and runs generations (``fly_cpp.loop``) on their contexts, one at a time."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator, Sequence

from fly_cpp import loop
from fly_cpp._llama import Context, Model
from fly_cpp.config import ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.drafters import Drafter, ModelDrafter, NgramDrafter
from fly_cpp.errors import FlyError
from fly_cpp.step import Stats, Step
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
                # like llama.cpp's -td, the draft's threads default to the target's
                threads = d.threads if d.n_threads else t.threads
                self.draft_ctx = Context(self.draft_model, n_ctx=self.target.n_ctx, n_threads=threads,
                                     n_batch=d.n_batch, n_ubatch=d.n_ubatch)
        except BaseException:
            self._close()
            raise

    @staticmethod
    def _load(s: ModelSettings) -> Model:
        return Model(s.path, n_gpu_layers=s.offloaded_layers, split_mode=s.split_mode, main_gpu=s.main_gpu,
                     tensor_split=s.tensor_split, repack=s.repack, rpc=s.rpc)

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
            yield from loop.run(gen, self.target, self.target_model, self._drafter(gen.spec))

    def close(self) -> None:
        """Free both contexts and models. Not locked: the caller makes sure no generation is
        running (``fly_cpp.Fly.close`` takes the engine lock around this)."""
        self._close()

    def _close(self) -> None:
        for part in (self.draft_ctx, getattr(self, "target", None), self.draft_model, self.target_model):
            if part is not None:
                part.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
