"""A pair loaded: the target model and the optional draft model, their contexts (one cache,
with ``n_seq`` sequences for as many slots), the target's MTP head where it drafts, the slots'
batchers and each slot's caches. Loading checks what needs the weights (the vocabularies agree,
a draft model's caches can go back); ``fly_cpp.backend.fit`` has checked the rest from the headers."""

from __future__ import annotations

from collections.abc import Sequence

from fly_cpp.backend.batch import Batcher, Seq
from fly_cpp.backend.context import Context
from fly_cpp.backend.model import Model
from fly_cpp.backend.mtp import MtpContext
from fly_cpp.basics.errors import FlyError
from fly_cpp.config import ModelSettings, SpecSettings
from fly_cpp.engine.vocab import check_compatible
from fly_cpp.kauto.rollback_costs import pick_rollback


def check_rollback(ctx: Context) -> None:
    """Refuse speculation on a model whose cache can neither drop drafted tokens nor be checkpointed."""
    if not ctx.can_rollback:
        raise FlyError(f"{ctx.model.name} is a recurrent model whose state llama.cpp can neither roll back nor "
                       "checkpoint: it cannot take part in speculative decoding (use --mode target)")


class Loaded:
    """The models and contexts of one engine; ``close`` frees whatever was made, also when
    loading failed half-way (the constructor closes what it made before it raises)."""

    def __init__(self, t: ModelSettings, d: ModelSettings | None, n_ctx: int, n_seq: int, kv_unified: bool,
                 max_draft: int = 0, branches: bool = False) -> None:
        """``branches``: the target's cache may fork for a tree's verification (``Context``).
        ``max_draft``: the longest draft a round may make (at least k auto's default longest):
        llama.cpp's buffers hold logits for that many rows and one more a sequence (``Context``'s
        ``n_outputs``), as llama-server sizes its contexts by its --draft-max (a buffer for every
        row of a batch took 300 MiB a context on the Qwen pair)."""
        n_outputs = max(max_draft, SpecSettings().k_max) + 1
        self.draft_model: Model | None = None
        self.target: Context | None = None
        self.draft_ctx: Context | None = None
        self.mtp_ctx: MtpContext | None = None  # the target's own MTP head, where it has one and no -d is given
        self.batchers: dict[str, Batcher] = {}  # with several slots, each model's shared decodes ("target", "draft")
        self.views: Sequence[tuple[Context | Seq, Context | Seq | None]] = []  # each slot's caches
        self.target_model = _load(t, mtp=d is None)
        try:
            if d is not None:
                self.draft_model = _load(d)
                check_compatible(self.target_model, self.draft_model)
            self.target = _context(self.target_model, t, n_ctx, t.threads, n_seq, kv_unified, n_outputs,
                                   branches and d is not None)
            if d is not None and self.draft_model is not None:
                # the draft holds the same tokens as the target, so it gets the same context size
                # like llama.cpp's -td, the draft's threads default to the target's
                threads = d.threads if d.n_threads else t.threads
                self.draft_ctx = _context(self.draft_model, d, self.target.n_ctx, threads, n_seq, kv_unified, n_outputs)
            if self.target_model.mtp_loaded and n_seq == 1:  # the head drafts for one sequence (-np 1) for now
                self.mtp_ctx = MtpContext(self.target)
            if self.draft_ctx is not None:  # speculation is the point of a draft model
                check_rollback(self.target)
                check_rollback(self.draft_ctx)
            if n_seq > 1:
                self.batchers = {role: Batcher(ctx) for role, ctx in (("target", self.target), ("draft", self.draft_ctx))
                                 if ctx is not None}
                target, draft = self.batchers["target"], self.batchers.get("draft")
                self.views = [(target.seq(i), draft.seq(i) if draft is not None else None) for i in range(n_seq)]
            else:
                self.views = [(self.target, self.draft_ctx)]
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for part in (self.mtp_ctx, self.draft_ctx, self.target, self.draft_model, self.target_model):
            if part is not None:
                part.close()


def _load(s: ModelSettings, mtp: bool = False) -> Model:
    return Model(s.path, n_gpu_layers=s.offloaded_layers, split_mode=s.split_mode, main_gpu=s.main_gpu,
                 tensor_split=s.tensor_split, repack=s.repack, mmap=s.mmap, mlock=s.mlock, rpc=s.rpc, mtp=mtp)


def _context(model: Model, s: ModelSettings, n_ctx: int, threads: int, n_seq: int, kv_unified: bool,
             n_outputs: int = 0, branches: bool = False) -> Context:
    # several sequences go back by checkpoints only: nothing to measure
    rollback = pick_rollback(model, s, threads) if n_seq == 1 else s.rollback
    return Context(model, n_ctx=n_ctx, n_threads=threads, n_batch=s.n_batch, n_ubatch=s.n_ubatch,
                   type_k=s.type_k, type_v=s.type_v, flash_attn=s.flash_attn,
                   rollback=rollback, n_seq=n_seq, kv_unified=kv_unified, n_outputs=n_outputs, branches=branches)
