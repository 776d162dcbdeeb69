"""The engine: loads a target model and an optional draft model once, checks that they fit
together, and runs generations (``fly_cpp.rounds.loop``) on their contexts: one at a time, or with ``n_seq``
slots several at once, each a task of the step loop (``fly_cpp.engine.scheduler``), which alone touches them.

Everything the outer layers (Python API, server, CLI, bench) need goes through its methods:
``generate``, ``tokenize`` / ``detokenize`` / ``piece``, ``info()`` (what is loaded),
``score()`` (teacher-forced scoring), ``prefill()`` (bring both caches to a prompt), ``close()``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from fly_cpp.backend import rollback
from fly_cpp.backend.batch import Batcher, Seq
from fly_cpp.backend.context import Context
from fly_cpp.backend.fit import check_context, placed
from fly_cpp.backend.sampling import NO_BIAS, LogitBias
from fly_cpp.basics.errors import FlyError
from fly_cpp.config import ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.drafters.seam import Drafter, as_drafter
from fly_cpp.engine.admit import admit, check_tokens
from fly_cpp.engine.control import Control, Pair
from fly_cpp.engine.generation import Generation
from fly_cpp.engine.info import EngineInfo, describe
from fly_cpp.engine.ledger import Ledger, SlotView
from fly_cpp.engine.loading import Loaded
from fly_cpp.engine.scheduler import Scheduler, Task
from fly_cpp.kauto.costs import Costs
from fly_cpp.kauto.pacer import Pacer
from fly_cpp.rounds import loop, scoring
from fly_cpp.rounds.output import Output
from fly_cpp.rounds.request import Request, Shift
from fly_cpp.rounds.rules import RoundRules
from fly_cpp.rounds.step import Progress, Stats, Step

T = TypeVar("T")


class Engine:
    """Loads the models once; ``generate`` may be called many times (with one slot the
    generations run one after another). Consecutive generations reuse the longest common prefix
    of both KV caches."""

    def __init__(self, target: ModelSettings | str, draft: ModelSettings | str | None = None, *,
                 n_seq: int = 1, kv_unified: bool = False, max_draft: int = 0, branches: bool = False) -> None:
        """``n_seq`` > 1: that many slots (``fly_cpp.engine.batchloop``), generating at once, each with n_ctx /
        n_seq positions of its own, or all sharing n_ctx (``kv_unified``); ``generate(slot=i)`` picks one.
        ``max_draft``, ``branches``: the longest draft a round may make, whether it may verify a tree (``Loaded``)."""
        if n_seq < 1:
            raise FlyError(f"the number of slots must be >= 1, got {n_seq}")
        self.n_seq = n_seq
        self.steps: Scheduler | None = None  # the step loop: every slot's work runs there
        self.control: Control | None = None  # k auto: pacers, costs, what persists
        self._ledger = Ledger(n_seq)  # what each slot runs and has run (``slot_views``)
        self._open: weakref.WeakSet[Generation] = weakref.WeakSet()
        self.target_settings = t = placed(target)
        self.draft_settings = d = placed(draft) if draft is not None else None
        self._loaded = pair = Loaded(t, d, check_context(t, d), n_seq, kv_unified, max_draft, branches)  # context checked 1st
        assert pair.target is not None
        self.target_model, self.draft_model = pair.target_model, pair.draft_model
        self.target, self.draft_ctx, self.mtp_ctx = pair.target, pair.draft_ctx, pair.mtp_ctx
        self.batchers: dict[str, Batcher] = pair.batchers  # with several slots, each model's shared decodes
        self._views = pair.views  # each slot's caches
        try:
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

    # -- what is loaded --------------------------------------------------------------------

    @property
    def n_ctx(self) -> int:
        """The positions one generation may fill (with slots: one slot's)."""
        return self._views[0][0].n_ctx

    @property
    def n_vocab(self) -> int:
        return self.target_model.n_vocab

    def info(self) -> EngineInfo:
        return describe(self._loaded, self.target_settings, self.draft_settings, self.n_ctx)

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
        check_tokens(self.n_vocab, tokens, what)

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
        text that fills the context shifts it and goes on (``fly_cpp.rounds.shift``; where the caches
        cannot shift, ``can_shift``, and with None it ends there).
        ``sampling.grammar`` / ``sampling.json_schema``: every emitted token obeys the grammar
        (``fly_cpp.rounds.constrain``); an invalid one is a FlyError here."""
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        control = self._control()
        spec = control.plan(spec)
        admitted = admit(self._loaded, tokens, self.n_ctx, spec, sampling, max_tokens, stop, drafter is None, n_probs,
                         cache_prompt, shift if self.can_shift else None)
        if slot is not None and not 0 <= slot < self.n_seq:
            raise FlyError(f"id_slot {slot} is outside 0..{self.n_seq - 1}")
        given = as_drafter(drafter) if drafter is not None and spec.mode != "target" else None
        request = admitted.request
        out = Output(request, admitted.piece, self.target_model.is_eog)

        def start(at: int) -> tuple[Iterator[Step | Progress], Pacer | None]:
            """The loop in slot ``at``, its drafter made there (a new one begins the pacer it
            may share with a running generation), under the settings settled there."""
            settled = control.loosening(spec, at)
            run = request if settled is spec else request.under(RoundRules.of(settled))
            how, stats = control.drafting(settled, request, at, given), out.stats
            if how.name:
                stats.drafter = how.name
            stats.loosens = settled.policy().loosens
            return loop.run(run, self._pair(at)[0], how.drafter, out, how.steady, admitted.rules), how.pacer

        def body(at: int) -> Iterator[Step | Progress]:
            return self._in_slot(at, start, request, out.stats, not cache_prompt)

        gen = Generation(request, spec, out, self._submitted(body, slot, request.prompt))
        self._open.add(gen)
        return gen

    @property
    def can_shift(self) -> bool:
        """Whether a generation's context can shift (``fly_cpp.rounds.shift``): KV caches whose
        positions llama.cpp can move, and no MTP head (its hidden states stay where they were)."""
        target, draft = self._pair(0)
        return self.mtp_ctx is None and target.can_shift and (draft is None or draft.can_shift)

    def busy_slots(self) -> list[bool]:
        """Whether each slot is running a task now (a generation, or work between them)."""
        assert self.steps is not None
        return [t is not None for t in self.steps.busy]

    def slot_views(self) -> list[SlotView]:
        """Each slot's generation (running, else its last) and its counters (``fly_cpp.engine.ledger``)."""
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

    def drafter(self, spec: SpecSettings, bias: LogitBias = NO_BIAS, slot: int = 0,
                sampling: SamplingSettings | None = None) -> Drafter:
        """The default drafter for ``spec`` in ``slot``, drawing as ``sampling`` would (``Control.drafter``)."""
        return self._control().drafter(spec, bias, slot, sampling)

    def costs(self, *, refresh: bool = False) -> Costs:
        """The pair's measured cost model (``fly_cpp.kauto.costs``): from the cache, or measured on
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
            steps, pacer = start(at)  # k auto's costs: cached, else the prior (nothing is measured)
            for ctx in (*self._pair(at), self.mtp_ctx) if fresh else ():  # cache_prompt off: nothing carried over
                if ctx is not None:
                    ctx.truncate(0)
            target, draft = self._pair(at)
            marks = rollback.marks({"target": target, "draft": draft})
            try:
                yield from steps
            finally:
                if pacer is not None:
                    self._control().finish(pacer, stats)
                stats.rollback = rollback.spent(marks)
                for cache in (target, draft) if stats.cache_full else ():  # its cells to the running slots
                    if cache is not None:
                        cache.truncate(0)

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
        self._loaded.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
