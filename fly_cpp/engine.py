"""The engine: loads a target model and an optional draft model once, checks that they fit
together, and runs generations (``fly_cpp.loop``) on their contexts: one at a time, or with
``n_seq`` slots several at once, every one of them a task of the engine's step loop
(``fly_cpp.scheduler``), which alone touches the contexts.

Everything the outer layers (Python API, server, CLI, bench) need goes through its methods:
``generate``, ``tokenize`` / ``detokenize`` / ``piece``, ``info()`` (what is loaded),
``score()`` (teacher-forced scoring), ``prefill()`` (bring both caches to a prompt), ``close()``.
"""

from __future__ import annotations

import dataclasses
import secrets
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from fly_cpp import loop
from fly_cpp import rollback as rb
from fly_cpp import scoring
from fly_cpp.backend.batch import Batcher, Seq
from fly_cpp.backend.context import Context
from fly_cpp.backend.grammar import Grammar, gbnf
from fly_cpp.backend.model import Model
from fly_cpp.backend.mtp import MtpContext
from fly_cpp.batchloop import Throttled
from fly_cpp.config import ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.constrain import Lazy, Rules
from fly_cpp.control import Control, Pair
from fly_cpp.costs import Costs
from fly_cpp.draft_model import ModelDrafter
from fly_cpp.drafters import Drafter, as_drafter
from fly_cpp.errors import ContextExceeded, FlyError
from fly_cpp.fit import check_context, placed
from fly_cpp.generation import Generation
from fly_cpp.ledger import Ledger, SlotView
from fly_cpp.mtp import MtpDrafter
from fly_cpp.output import Output
from fly_cpp.paced import PacedDrafter
from fly_cpp.pacer import Pacer
from fly_cpp.request import Request, Shift
from fly_cpp.rollback_costs import pick_rollback
from fly_cpp.sampling import NO_BIAS, LogitBias
from fly_cpp.scheduler import Scheduler, Task
from fly_cpp.shape import Steady
from fly_cpp.step import Progress, Stats, Step
from fly_cpp.vocab import check_compatible

T = TypeVar("T")


def _check_rollback(ctx: Context) -> None:
    """Refuse speculation on a model whose cache can neither drop drafted tokens nor be checkpointed."""
    if not ctx.can_rollback:
        raise FlyError(f"{ctx.model.name} is a recurrent model whose state llama.cpp can neither roll back nor "
                       "checkpoint: it cannot take part in speculative decoding (use --mode target)")


def _rollback_marks(target: Context | Seq, draft: Context | Seq | None) -> dict[str, tuple[Context | Seq, rb.Ledger]]:
    """Each recurrent cache of a generation with its rollback ledger as the generation starts."""
    return {role: (ctx, dataclasses.replace(ctx.rollbacks)) for role, ctx in (("target", target), ("draft", draft))
            if ctx is not None and ctx.rollback != rb.KV}


def _rollback_spent(marks: dict[str, tuple[Context | Seq, rb.Ledger]]) -> dict[str, object] | None:
    """What the generation's rollbacks cost each recurrent cache since ``_rollback_marks`` (None: none recurrent)."""
    return {role: {"way": ctx.rollback, **ctx.rollbacks.since(before).as_dict()}
            for role, (ctx, before) in marks.items()} or None


@dataclass(frozen=True)
class EngineInfo:
    """What an engine has loaded, for display and for the outer layers' decisions."""

    target: ModelSettings
    draft: ModelSettings | None
    target_name: str
    draft_name: str | None
    n_ctx: int
    n_vocab: int
    n_threads: int  # threads of the target's context, and of the draft's (None: no draft model)
    draft_n_threads: int | None
    bos: int
    eos: int
    add_bos: bool
    bos_text: str  # the BOS / EOS tokens' text, as chat templates want them
    eos_text: str
    chat_template: str | None  # the target GGUF's tokenizer.chat_template
    placement: str = ""  # where each model's layers went ("target on the CPU", "target 29/29 layers on ...")


class Engine:
    """Loads the models once; ``generate`` may be called many times (with one slot the
    generations run one after another). Consecutive generations reuse the longest common prefix
    of both KV caches."""

    def __init__(self, target: ModelSettings | str, draft: ModelSettings | str | None = None, *,
                 n_seq: int = 1, kv_unified: bool = False) -> None:
        """``n_seq`` > 1: that many slots (``fly_cpp.batchloop``), generating at once, each
        with n_ctx / n_seq positions of its own, or all sharing n_ctx (``kv_unified``);
        ``generate(slot=i)`` picks one."""
        if n_seq < 1:
            raise FlyError(f"the number of slots must be >= 1, got {n_seq}")
        self.n_seq = n_seq
        self.steps: Scheduler | None = None  # the step loop: every slot's work runs there
        self._views: list[tuple[Context | Seq, Context | Seq | None]] = []  # each slot's caches
        self.batchers: dict[str, Batcher] = {}  # with several slots, each model's shared decodes ("target", "draft")
        self._ledger = Ledger(n_seq)  # what each slot runs and has run (``slot_views``)
        self.target_settings = placed(target)
        self.draft_settings = placed(draft) if draft is not None else None
        self._open: weakref.WeakSet[Generation] = weakref.WeakSet()
        self.control: Control | None = None  # k auto: pacers, costs, what persists
        self.draft_model: Model | None = None
        self.draft_ctx: Context | None = None
        self.mtp_ctx: MtpContext | None = None  # the target's own MTP head, where it has one and no -d is given
        n_ctx = check_context(self.target_settings, self.draft_settings)  # before any weights load
        self.target_model = self._load(self.target_settings, mtp=self.draft_settings is None)
        try:
            t, d = self.target_settings, self.draft_settings
            if d is not None:
                self.draft_model = self._load(d)
                check_compatible(self.target_model, self.draft_model)
            self.target = self._context(self.target_model, t, n_ctx, t.threads, n_seq, kv_unified)
            if d is not None and self.draft_model is not None:
                # the draft holds the same tokens as the target, so it gets the same context size
                # like llama.cpp's -td, the draft's threads default to the target's
                threads = d.threads if d.n_threads else t.threads
                self.draft_ctx = self._context(self.draft_model, d, self.target.n_ctx, threads, n_seq, kv_unified)
            if self.target_model.mtp_loaded and n_seq == 1:  # the head drafts for one sequence (-np 1) for now
                self.mtp_ctx = MtpContext(self.target)
            if self.draft_ctx is not None:  # speculation is the point of a draft model
                for ctx in (self.target, self.draft_ctx):
                    _check_rollback(ctx)
            if n_seq > 1:
                self.batchers = {role: Batcher(ctx) for role, ctx in (("target", self.target), ("draft", self.draft_ctx))
                                 if ctx is not None}
                target, draft = self.batchers["target"], self.batchers.get("draft")
                self._views = [(target.seq(i), draft.seq(i) if draft is not None else None) for i in range(n_seq)]
            else:
                self._views = [(self.target, self.draft_ctx)]
            self.steps = Scheduler(n_seq, self.batchers.get("target"), self.batchers.get("draft"),
                                   cached=lambda i: self._views[i][0].tokens)
            self.control = Control(Pair(self.target, t, self.draft_ctx, d, self.mtp_ctx, self._views), self.steps)
        except BaseException:
            self._close()
            raise

    @staticmethod
    def preflight(target: ModelSettings, draft: ModelSettings | None = None) -> None:
        """The checks of loading that need no weights (files, context size against the model
        and this machine's memory), from the GGUF headers alone: a server refuses bad settings
        this way before it binds its port."""
        check_context(placed(target), placed(draft) if draft is not None else None)

    @staticmethod
    def _load(s: ModelSettings, mtp: bool = False) -> Model:
        return Model(s.path, n_gpu_layers=s.offloaded_layers, split_mode=s.split_mode, main_gpu=s.main_gpu,
                     tensor_split=s.tensor_split, repack=s.repack, mmap=s.mmap, mlock=s.mlock, rpc=s.rpc, mtp=mtp)

    @staticmethod
    def _context(model: Model, s: ModelSettings, n_ctx: int, threads: int, n_seq: int = 1,
                 kv_unified: bool = False) -> Context:
        # several sequences go back by checkpoints only: nothing to measure
        rollback = pick_rollback(model, s, threads) if n_seq == 1 else s.rollback
        return Context(model, n_ctx=n_ctx, n_threads=threads, n_batch=s.n_batch, n_ubatch=s.n_ubatch,
                       type_k=s.type_k, type_v=s.type_v, flash_attn=s.flash_attn,
                       rollback=rollback, n_seq=n_seq, kv_unified=kv_unified)

    # -- what is loaded --------------------------------------------------------------------

    @property
    def n_ctx(self) -> int:
        """The positions one generation may fill (with slots: one slot's)."""
        return self._views[0][0].n_ctx

    @property
    def n_vocab(self) -> int:
        return self.target_model.n_vocab

    def info(self) -> EngineInfo:
        m = self.target_model

        def text(token: int) -> str:
            return m.token_text(token).decode("utf-8", "replace") if token >= 0 else ""

        return EngineInfo(
            target=self.target_settings, draft=self.draft_settings, target_name=m.name,
            draft_name=self.draft_model.name if self.draft_model is not None else None,
            n_ctx=self.n_ctx, n_vocab=m.n_vocab, n_threads=self.target.n_threads,
            draft_n_threads=self.draft_ctx.n_threads if self.draft_ctx is not None else None,
            bos=m.bos, eos=m.eos, add_bos=m.add_bos, bos_text=text(m.bos), eos_text=text(m.eos),
            chat_template=m.meta("tokenizer.chat_template"),
            placement="; ".join(f"{role} {model.placement}" for role, model in
                                (("target", m), ("draft", self.draft_model)) if model is not None))

    # -- tokens ----------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.target_model.tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        return self.target_model.detokenize(tokens, special)

    def piece(self, token: int) -> bytes:
        """The bytes one token stands for."""
        return self.target_model.piece(token)

    def spellable(self, text: str) -> str:
        """``text`` as the target's vocabulary can spell it (see ``Model.spellable``)."""
        return self.target_model.spellable(text)

    def check_tokens(self, tokens: Sequence[int], what: str = "token id") -> None:
        if bad := [t for t in tokens if not 0 <= t < self.n_vocab]:
            raise FlyError(f"{what} {bad[0]} is outside the vocabulary (0..{self.n_vocab - 1})")

    # -- generating ------------------------------------------------------------------------

    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        spec: SpecSettings = SpecSettings(),
        sampling: SamplingSettings = SamplingSettings(),
        max_tokens: int = 128,
        stop: Sequence[str] = (),
        drafter: Drafter | None = None,
        n_probs: int = 0,
        cache_prompt: bool = True,
        slot: int | None = None,
        shift: Shift | None = None,
    ) -> Generation:
        """Prepare a generation (errors about the request are raised here, before any token).
        ``drafter``: who drafts (default: the draft model, else n-gram lookup; see ``drafter``).
        ``n_probs``: give every emitted Step the target's top-n log-probabilities (``Step.probs``).
        ``cache_prompt`` False: both KV caches start empty instead of keeping what they hold in
        common with the prompt (slower; the same numbers whatever ran before). ``slot``: which
        sequence of an engine with several (``n_seq``; None: the first free one when it starts);
        generations of different slots run at once, each slot's one at a time. ``shift``: a
        text that fills the context shifts it and goes on (``fly_cpp.shift``; where the caches
        cannot shift, ``can_shift``, and with None it ends there).
        ``sampling.grammar`` / ``sampling.json_schema``: every emitted token obeys the grammar
        (``fly_cpp.constrain``); an invalid one is a FlyError here."""
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not tokens:
            raise FlyError("the prompt is empty")
        if len(tokens) > self.n_ctx:
            raise ContextExceeded(len(tokens), self.n_ctx)
        self.check_tokens(tokens)
        if max_tokens < 0:
            raise FlyError(f"max_tokens must be >= 0, got {max_tokens}")
        if spec.spec_type == "draft-mtp" and spec.mode != "target" and drafter is None and self.mtp_ctx is None:
            why = ("a draft model is loaded (leave out -d)" if self.draft_ctx is not None
                   else f"{self.target_model.name} has no MTP layers")
            raise FlyError(f"--spec-type draft-mtp drafts with the target's own MTP head: {why}")
        if (spec.mode != "target" and drafter is None and self.draft_ctx is None and self.mtp_ctx is None
                and not spec.ngram):
            raise FlyError(f"mode {spec.mode} needs a draft model or n-gram lookup")
        if spec.mode != "target":
            _check_rollback(self.target)
        for model in (self.target_model, self.draft_model):
            if model is not None:
                model.check()  # a lost rpc-server: refuse before any token (HTTP 503 in the server)
        if isinstance(n_probs, bool) or not isinstance(n_probs, int) or n_probs < 0:
            raise FlyError(f"n_probs must be an integer >= 0, got {n_probs!r}")
        self.check_tokens([t for t, _ in sampling.logit_bias], what="logit_bias token")
        bias = LogitBias(sampling.logit_bias, self.target_model.eog_ids if sampling.ignore_eos else ())
        control = self._control()
        spec = control.plan(spec)
        rules: Rules | None = Grammar(self.target_model, gbnf(sampling)) if sampling.constrained else None
        piece = self.target_model.piece_keeping(sampling.preserved_tokens)
        if rules is not None and sampling.grammar_trigger:
            rules = Lazy(rules, sampling.grammar_trigger, self.target_model.tokenize, piece=piece)
        seed = sampling.seed if sampling.seed is not None else secrets.randbits(32)
        request = Request(tuple(tokens), spec, sampling, max_tokens, tuple(stop), seed, bias,
                          min(n_probs, self.n_vocab), cache_prompt, shift if self.can_shift else None)
        if slot is not None and not 0 <= slot < self.n_seq:
            raise FlyError(f"id_slot {slot} is outside 0..{self.n_seq - 1}")
        own = spec.mode != "target" and drafter is None
        if spec.mode == "target":
            drafter = None
        elif drafter is not None:
            drafter = as_drafter(drafter)
        out = Output(request, piece, self.target_model.is_eog)

        def start(at: int) -> tuple[Iterator[Step | Progress], Pacer | None]:
            """The loop in slot ``at``, its drafter made there."""
            base = control.base_drafter(spec, bias, at) if own else None
            made = control.paced(base, spec, at) if base is not None else drafter
            if isinstance(base, MtpDrafter):
                out.stats.drafter = "mtp"
            steady = Steady() if made is not None and control.steady_batches(spec) else None
            pacer = made.pacer if isinstance(made, PacedDrafter) else None
            if self.n_seq > 1 and made is not None:
                assert self.steps is not None  # under load the draft model's fixed-k rounds, in step with the others'
                made = Throttled(made, self.steps, pacer, base if isinstance(base, ModelDrafter) else None,
                                 spec.k_slots if spec.auto else int(spec.k))
            return loop.run(request, self._pair(at)[0], made, out, steady, rules), pacer

        def body(at: int) -> Iterator[Step | Progress]:
            return self._in_slot(at, start, request, out.stats, not cache_prompt)

        gen = Generation(request, out, self._submitted(body, slot, request.prompt))
        self._open.add(gen)
        return gen

    @property
    def can_shift(self) -> bool:
        """Whether a generation's context can shift (``fly_cpp.shift``): KV caches whose
        positions llama.cpp can move, and no MTP head (its hidden states stay where they were)."""
        target, draft = self._pair(0)
        return self.mtp_ctx is None and target.can_shift and (draft is None or draft.can_shift)

    def busy_slots(self) -> list[bool]:
        """Whether each slot is running a task now (a generation, or work between them)."""
        assert self.steps is not None
        return [t is not None for t in self.steps.busy]

    def slot_views(self) -> list[SlotView]:
        """Each slot's generation (running, else its last) and its counters (``fly_cpp.ledger``)."""
        return self._ledger.view()

    def sharing(self) -> dict[str, tuple[int, int, int]]:
        """With several slots, how the shared decodes ran so far, by model ("target", "draft"):
        (decodes, sequences, rows) in all (``Batcher.sharing``); empty with one slot."""
        return {role: b.sharing for role, b in self.batchers.items()}

    @property
    def generations_running(self) -> int:
        return self._ledger.running

    @property
    def generations_waiting(self) -> int:
        """Generations started (iterated) that wait for a slot."""
        return self.steps.waiting if self.steps is not None else 0

    def _pair(self, slot: int = 0) -> tuple[Context | Seq, Context | Seq | None]:
        """The target's and the draft's caches a generation in ``slot`` runs on."""
        return self._views[slot]

    def _control(self) -> Control:
        assert self.control is not None  # made with the contexts
        return self.control

    def drafter(self, spec: SpecSettings, bias: LogitBias = NO_BIAS, slot: int = 0) -> Drafter:
        """The default drafter for ``spec`` in ``slot`` (``Control.drafter``)."""
        return self._control().drafter(spec, bias, slot)

    def costs(self, *, refresh: bool = False) -> Costs:
        """The pair's measured cost model (``fly_cpp.costs``): from the cache, or measured on
        first use; ``refresh`` measures again. Waits for a free slot."""
        assert self.steps is not None
        control = self._control()
        return self.steps.call(lambda at: control.cost_model(refresh=refresh, slot=at))

    def _submitted(self, body: Callable[[int], Iterator[T]], slot: int | None, prompt: Sequence[int] = (),
                   ) -> Iterator[T]:
        """``body``'s items: it goes to the step loop when the first one is asked for (a
        generation takes its slot when it starts, as before), and is cancelled when this
        iterator is closed before its end."""
        assert self.steps is not None
        task: Task[T] = self.steps.submit(body, slot, prompt)
        yield from task

    def _in_slot(self, at: int, start: Callable[[int], tuple[Iterator[Step | Progress], Pacer | None]],
                 request: Request, stats: Stats, fresh: bool) -> Iterator[Step | Progress]:
        """A generation in slot ``at`` (on the step loop). Its loop and drafter are made there
        too: a new drafter begins the pacer it may share with a running generation."""
        with self._ledger.run(at, stats, request.max_tokens):
            if self.n_seq > 1:
                stats.slot = at
            steps, pacer = start(at)
            if pacer is not None:  # once per pair and machine (cached on disk), before the clock starts
                self._control().cost_model(slot=at)
            if fresh:  # cache_prompt off: nothing carried over from earlier generations
                for ctx in (*self._pair(at), self.mtp_ctx):
                    if ctx is not None:
                        ctx.truncate(0)
            marks = _rollback_marks(*self._pair(at))
            try:
                yield from steps
            finally:
                if pacer is not None:
                    self._control().finish(pacer, stats)
                stats.rollback = _rollback_spent(marks)

    def prefill(self, prompt: Sequence[int]) -> None:
        """Bring both caches to ``prompt`` now (the next generation of it then starts decoding
        at once: the bench times decoding alone this way), in a free slot."""
        def sync(at: int) -> None:
            target, draft = self._pair(at)
            target.sync(prompt)
            if draft is not None:
                draft.sync(prompt)

        assert self.steps is not None
        self.steps.call(sync)

    def score(self, prompt: Sequence[int], output: Sequence[int], top_n: int = 0) -> scoring.Score:
        """The target's teacher-forced scores of ``output`` after ``prompt``, in a free slot
        (it waits for one)."""
        assert self.steps is not None
        return self.steps.call(lambda at: scoring.score(self._pair(at)[0], prompt, output, top_n))  # type: ignore[arg-type]

    def slower_note(self, gen: Generation) -> str | None:
        """One line when ``gen`` (finished) ran slower than the target alone would have here
        (``Control.slower_note``); None otherwise."""
        return self._control().slower_note(gen.stats, gen.spec)

    # -- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        """Free both contexts and models. Open generations are closed first; one that another
        thread is running is waited for."""
        for gen in list(self._open):
            try:
                gen.close()
            except ValueError:  # running in another thread: the step loop's close waits for it
                pass
        self._close()

    def _close(self) -> None:
        if self.steps is not None:
            self.steps.close()  # the running and waiting tasks end first
        if self.control is not None:
            self.control.close()
        for part in (self.mtp_ctx, self.draft_ctx, getattr(self, "target", None), self.draft_model, self.target_model):
            if part is not None:
                part.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
