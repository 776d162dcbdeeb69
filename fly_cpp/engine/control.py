"""k auto's one face to the engine. The engine hands it the pair (its contexts and settings,
each slot's caches, the step loop) once; per request it returns the settings as k auto runs
them (``plan``) and the drafter that drafts them (``drafter``); at a paced generation's end it
keeps what was learned (``finish``). Everything that decides how far to draft, whether to
loosen, what the pair's decodes cost and what persists across processes lives behind it:
the pacers (one per slot and mode, ``fly_cpp.kauto.pacer``), the cost model (``fly_cpp.kauto.calibrate``,
measured once per pair and machine) and the evidence file (``fly_cpp.kauto.recall``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from fly_cpp.backend.batch import Seq
from fly_cpp.backend.context import Context
from fly_cpp.backend.mtp import MtpContext
from fly_cpp.backend.sampling import LogitBias, Sampler, draft_sampler
from fly_cpp.config import AUTO, ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.drafters.draft_model import DraftModel
from fly_cpp.drafters.drafter import PairDrafter
from fly_cpp.drafters.mtp import MtpHead
from fly_cpp.drafters.seam import Drafter, DraftRules
from fly_cpp.drafters.steps import Stepper
from fly_cpp.engine.batchloop import Throttled
from fly_cpp.engine.scheduler import Scheduler
from fly_cpp.kauto import loosening, recall, worth
from fly_cpp.kauto.calibrate import basis, cached, calibrate, pair_key, prior, store_draft_checked, store_live
from fly_cpp.kauto.costs import Costs
from fly_cpp.kauto.evidence import Acceptance
from fly_cpp.kauto.pacer import Pacer
from fly_cpp.rounds.request import Request
from fly_cpp.rounds.shape import Steady
from fly_cpp.rounds.step import Stats


@dataclass(frozen=True)
class Pair:
    """What the controller is told of the pair and where it runs: the target's and the draft
    model's contexts and settings, the target's MTP head (where it drafts), and each slot's
    caches (``views[slot]``: the target's, the draft's)."""
    target: Context
    target_settings: ModelSettings
    draft: Context | None
    draft_settings: ModelSettings | None
    mtp: MtpContext | None
    views: Sequence[tuple[Context | Seq, Context | Seq | None]]


@dataclass(frozen=True)
class Drafting:
    """Who drafts one generation in its slot and how: the drafter (None: the target alone), the
    pacer that paces it (k auto), the steady batch width its verifications are padded to, and
    ``name`` "mtp" where the target's own head drafts (the stats say so)."""
    drafter: Drafter | None = None
    pacer: Pacer | None = None
    steady: Steady | None = None
    name: str = ""


class Control:
    """k auto for one engine: its pacers, its cost model and what it keeps across processes."""

    def __init__(self, pair: Pair, steps: Scheduler) -> None:
        self.pair, self.steps = pair, steps
        steps.when_idle(self.save)
        self._costs: Costs | None = None
        self._measuring = False  # a task is measuring the pair's costs (the others wait for them)
        self._pacers: dict[tuple[object, ...], Pacer] = {}
        self._verdicts: dict[str, loosening.Verdict] = {}  # whether fly loosens, by accept rule (``verdict``)
        self._settled: dict[SpecSettings, SpecSettings] = {}  # a request's settings as ``loosening`` settles them
        self._cost_key: str | None = None  # the pair's (``cost_key``)
        self._records: dict[int, str] = {}  # a pacer's key in the evidence kept across processes (``recall``)
        self._unsaved: set[int] = set()  # pacers (by id) whose evidence has not been kept since it grew

    # -- a request's plan ------------------------------------------------------------------

    def plan(self, spec: SpecSettings) -> SpecSettings:
        """``spec`` as k auto runs it here, as far as it is known before the request's slot: a
        fixed k where the target is wholly on a GPU and ``SpecSettings.k_gpu`` sets one (with
        "auto" the pacer drafts steady rounds there: ``steady``). Whether fly loosens is settled
        in the slot (``loosening``)."""
        if spec.auto and spec.k_gpu != AUTO and spec.k_gpu and spec.mode != "target" and self.on_gpu():
            spec = dataclasses.replace(spec, k=min(int(spec.k_gpu), spec.k_max))
        return spec

    def loosening(self, spec: SpecSettings, slot: int) -> SpecSettings:
        """``spec`` with k auto's fly loosening only where that measurably pays on this pair
        (``verdict``), decided on the step loop in ``slot`` before the generation's first round.
        n-gram lookup alone never asks for a model's token: nothing to weigh. Decided for the
        pair, so that a request gives the same text in any slot, with one slot or several,
        whatever the load."""
        if spec.mode != "fly" or spec.loosen != "auto" or not spec.auto:
            return spec
        settled = self._settled.get(spec)  # decided once a process: the same settings, the same answer
        if settled is None:
            if len(self._settled) >= 256:  # requests of many settings: kept for the latest
                self._settled.clear()
            kept = (not spec.policy().loosens or self.pair.draft is None and self.pair.mtp is None
                    or self.verdict(spec, slot).loosen)
            settled = self._settled[spec] = spec if kept else dataclasses.replace(spec, loosen="off")
        return settled

    def verdict(self, spec: SpecSettings, slot: int) -> loosening.Verdict:
        """What loosening gains on this pair under ``spec``'s accept rule (``fly_cpp.kauto.loosening``):
        kept from an earlier process, else priced now (nothing measured); one priced at the
        prior's costs is priced again, once, in the first process that has learned curves."""
        record = loosening.key(self.cost_key(), spec)
        if record not in self._verdicts:
            known = loosening.recall(record)
            if known is None or not known.learned and not self.cost_model(slot=slot).prior:
                known = loosening.Verdict.priced(self.cost_model(slot=slot), loosening.PRIOR, spec)
                loosening.keep(record, known)
            self._verdicts[record] = known
        return self._verdicts[record]

    def on_gpu(self) -> bool:
        """Whether the target runs wholly on a local GPU, with a KV cache and one slot: where
        k auto drafts steady rounds (``Pacer.steady``, or ``k_gpu``'s fixed k). There a decode
        costs more when the batch's shape changes from the last, and rounds planned one by one
        change it: on an H100 (costly pair) k auto's planned rounds ran 0.69-0.92x llama.cpp's
        best fixed k, fly at a fixed k 6 0.93-1.18x (docs/benchmarks.md). Partial offloads, rpc
        servers, recurrent states (whose rollbacks k auto prices) and several slots (whose
        rounds share decodes) keep the planned rounds."""
        m = self.pair.target.model
        return (len(self.pair.views) == 1 and not self.pair.target_settings.rpc and not m.recurrent
                and m.offloaded >= m.n_layer)

    def steady_batches(self, spec: SpecSettings) -> bool:
        """Whether ``spec``'s verification batches are padded to a steady width
        (``fly_cpp.rounds.shape``): as set, and with "auto" where the target runs on a GPU or rpc server
        (on a CPU every padded row costs its share)."""
        if spec.steady_batches != "auto":
            return spec.steady_batches == "on"
        return self.pair.target.model.offloaded > 0

    # -- drafters --------------------------------------------------------------------------

    def drafting(self, spec: SpecSettings, request: Request, slot: int, given: Drafter | None) -> Drafting:
        """How a generation of ``spec`` (``request``'s, as settled) drafts in ``slot``: with
        ``given`` (a caller's drafter, paced by its own pacer where it has one) or the pair's
        own (``drafter``, drawing as ``Request.draft_sampler`` says; paced under k auto,
        sampled rounds learned apart from greedy ones); with several slots, in step with the
        others' rounds (``fly_cpp.engine.batchloop.Throttled``)."""
        if spec.mode == "target":
            return Drafting()
        head = self._head(slot)
        own = self._drafter(spec, request.bias, slot, request.draft_sampler(), not request.sampling.greedy) \
            if given is None else None
        made: Drafter = own if own is not None else given  # type: ignore[assignment]
        pacer = made.pacer  # a pacer of this pair's, or the caller's own
        if len(self.pair.views) > 1:  # under load the draft model's fixed-k rounds, in step with the others'
            together = own if own is not None and own.stepper is not None and not head else None
            made = Throttled(made, self.steps, pacer, together, spec.k_slots if spec.auto else int(spec.k))
        return Drafting(made, pacer, Steady() if self.steady_batches(spec) else None, "mtp" if own is not None and head else "")

    def drafter(self, spec: SpecSettings, bias: LogitBias, slot: int,
                sampling: SamplingSettings | None = None) -> Drafter:
        """The default drafter for ``spec``: the draft model (with n-gram lookup when
        ``spec.ngram``), else the target's MTP head (draft-mtp, or a model with one and no -d),
        else n-gram lookup alone; with k auto, paced by this pair's controller for this mode
        (the head's steps priced by its own measured curve, its evidence its own). With
        ``sampling`` (and its seed), it draws as a request of those settings drafts
        (``Request.draft_sampler``): given to ``generate``, it drafts what the engine's own would."""
        draws = None
        if sampling is not None and sampling.seed is not None:
            draws = draft_sampler(sampling, sampling.seed, bias)
        return self._drafter(spec, bias, slot, draws, sampling is not None and not sampling.greedy)

    def _head(self, slot: int) -> bool:
        """Whether the target's MTP head drafts in ``slot`` (a head and no draft model there)."""
        return self.pair.mtp is not None and self.pair.views[slot][1] is None

    def _drafter(self, spec: SpecSettings, bias: LogitBias, slot: int, draws: Sampler | None,
                 sampled: bool) -> PairDrafter:
        """The pair's drafter for ``spec`` in ``slot`` (``draws``: ``drafting``'s), paced under k
        auto by this pair's pacer for ``spec`` in ``slot``; ``sampled``: for a generation at T > 0
        (its drafts keep at other rates)."""
        stepper = self._stepper(slot, bias, draws)
        checks = self._guess_checks(spec) if stepper is not None and stepper.checks_guesses and not spec.auto else None
        # a tree's branch is drafted by the draft model and verified where the target's cache can fork, unpadded
        target = self.pair.views[slot][0]
        tree = stepper is not None and stepper.forks and isinstance(target, Context) and target.branches \
            and not self.steady_batches(spec)
        return PairDrafter(stepper, DraftRules.of(spec, tree), checks, self._pacer(spec, slot, sampled) if spec.auto else None,
                           bias)

    def _stepper(self, slot: int, bias: LogitBias, draws: Sampler | None) -> Stepper | None:
        """Who drafts step by step in ``slot``: the target's MTP head, the draft model, or none
        (n-gram lookup alone)."""
        draft_ctx = self.pair.views[slot][1]
        if self._head(slot):
            assert self.pair.mtp is not None
            return MtpHead(self.pair.mtp, bias, draws)
        if draft_ctx is not None:
            n_vocab = min(self.pair.target.model.n_vocab, draft_ctx.model.n_vocab)
            return DraftModel(draft_ctx, n_vocab, bias, draws)  # type: ignore[arg-type]
        return None

    def _pacer(self, spec: SpecSettings, slot: int, sampled: bool) -> Pacer:
        """k auto's controller for ``spec`` in ``slot`` (made once, kept across generations)."""
        key = (*self._key(spec, slot), *(("sampled",) if sampled else ()))
        if key not in self._pacers:
            record = recall.key(self.cost_key(), key[1:])
            # the costs are measured where the pacer first needs them, on the step loop in the
            # slot of the generation that needs them
            self._pacers[key] = pacer = Pacer(lambda: self.cost_model(slot=slot), spec.k_max, recall.load(record),
                                              self._steady(spec))
            self._records[id(pacer)] = record
        return self._pacers[key]

    def _key(self, spec: SpecSettings, slot: int) -> tuple[object, ...]:
        """A pacer's key: one per slot and mode (the head learns apart from n-gram lookup on the
        same file, steady rounds apart from planned ones)."""
        return (slot, spec.mode, spec.policy(), spec.ngram, spec.ngram_max, spec.ngram_tokens, spec.k_max,
                spec.cross_round_window, *(("mtp",) if self._head(slot) else ()),
                *(("steady",) if self._steady(spec) else ()))

    def _steady(self, spec: SpecSettings) -> bool:
        """Whether k auto drafts steady rounds for ``spec`` here (``Pacer.steady``)."""
        return spec.k_gpu == AUTO and self.on_gpu()

    def pacers(self) -> list[Pacer]:
        """The pacers made so far (one per slot and mode)."""
        return list(self._pacers.values())

    def _guess_checks(self, spec: SpecSettings) -> int | None:
        """How many tokens of an n-gram guess a fixed k's draft step checks: as many as pay by
        the pair's measured costs at the prior agreement (k auto prices each step itself, by the
        agreement it learns). On this project's 2-core CPU the Q4_K_M draft's two-row decode
        costs 2.4x its one-row one, and the checks made fly-cpp's k 5 run 1.02x llama.cpp's k 5
        cold where without them it ran 1.21x (docs/benchmarks.md). Nothing is measured here:
        with no cost curve of the pair yet (k auto, ``fly-cpp profile --engine`` measure it),
        None: every step checks up to ``spec.ngram_tokens``, as the published drafter does."""
        if not spec.ngram:
            return None
        p = self.pair
        costs = self._costs or cached(p.target, p.target_settings, p.draft, p.draft_settings)
        if costs is None:
            return None
        return worth.guess_length(costs, Acceptance().mean(), spec.ngram_tokens, 0)

    # -- costs -----------------------------------------------------------------------------

    def cost_key(self) -> str:
        """The pair's key in the cost cache (and the evidence kept beside it), as loaded: found once
        (it reads the files' stats and the machine's, ~0.3 ms: a tiny pair's request decodes in 40)."""
        if self._cost_key is None:
            p = self.pair
            self._cost_key = pair_key(p.target, p.target_settings, p.draft, p.draft_settings)
        return self._cost_key

    def cost_model(self, *, refresh: bool = False, slot: int = 0) -> Costs:
        """The cost model: cached from earlier processes on this machine, else the prior
        (``fly_cpp.kauto.prior``: from the models' headers, nothing measured; the live decodes teach
        it). ``refresh`` (``fly-cpp profile --recalibrate``) measures it on ``slot``'s own caches,
        on the step loop; a task that needs it while another measures it waits."""
        while self._measuring:
            self.steps.pause()
        p = self.pair
        if self._costs is None and not refresh:
            self._costs = (cached(p.target, p.target_settings, p.draft, p.draft_settings, p.mtp)
                           or prior(p.target, p.target_settings, p.draft, p.draft_settings, p.mtp))
        if refresh:
            model = p.target.model
            token = model.bos if model.bos >= 0 else 0
            target, draft = p.views[slot]
            self._measuring = True
            try:
                self._costs = calibrate(target, p.target_settings, draft, p.draft_settings,  # type: ignore[arg-type]
                                        token, refresh=True, mtp=p.mtp,
                                        basis=basis(p.target, p.target_settings, p.draft, p.draft_settings))
            finally:
                self._measuring = False
        return self._costs

    def use(self, costs: Costs) -> None:
        """Price with ``costs`` from now on, with new pacers (what the old ones learned was
        priced otherwise): for measuring the controller itself at chosen costs."""
        self._costs = costs
        self._pacers.clear()

    def slower_note(self, stats: Stats, spec: SpecSettings) -> str | None:
        """One line when a finished generation ran slower than the target alone would have
        here, with the measured reason and what to try, or where k auto drafted nothing, why;
        None otherwise (or when it was too short to tell). Never measures: a note must not cost
        more than the answer, so it reads the costs k auto used, else the cached ones, else says
        nothing."""
        if spec.mode == "target" or stats.n_tokens < 16:
            return None
        p = self.pair
        model = self._costs or cached(p.target, p.target_settings, p.draft, p.draft_settings, p.mtp)
        if model is None:
            return None
        if stats.n_drafted == 0:  # what k auto decided, in words (a first run on the bundled pair shows this)
            if not spec.auto:
                return None
            step = f", a draft step {model.draft(1) / model.target(1):.2f} of one" if model.draft_curve else ""
            return (f"k auto drafted nothing: the target alone is fastest here ({model.target(1) * 1e3:.2f} ms a "
                    f"token{step}); speculation pays where a target decode is dear beside the draft's "
                    "(a real pair: docs/models.md)")
        return worth.slower_note(stats.tokens_per_second, stats.n_drafted / stats.n_rounds, stats.mean_accepted, model, spec.auto)

    # -- what persists ---------------------------------------------------------------------

    def finish(self, pacer: Pacer, stats: Stats) -> None:
        """What a paced generation leaves when it ends, in one slot or several: its pacing in
        the stats, what k auto learned for the next process, and a cached cost curve that its
        live decodes contradicted cached again as they priced it (``store_live``: the next
        process starts from it, measuring nothing), or dropped when that is unfit to cache."""
        p = self.pair
        costs = self._costs
        checked = costs is not None and costs.draft_checked_live and not costs.draft_trusted
        if costs is not None and (costs.disagrees and costs.cached or checked and not costs.cached):
            # cached anew as the live decodes priced them; again once the draft is checked where the
            # target's curve was cached anew before it (else the next process met the draft's
            # contradicted price unchecked: 2-4 in 12 runs of the 10x-dear draft test)
            costs.recached(store_live(self.cost_key(), costs, p.target_settings, p.draft_settings,
                                      head=p.mtp is not None and p.draft is None,
                                      basis=basis(p.target, p.target_settings, p.draft, p.draft_settings)))
        elif checked:
            store_draft_checked(self.cost_key())  # checked once: the next processes need not
        if costs is not None and checked:
            costs.draft_noted()
        stats.pacing = pacer.as_dict()
        if id(pacer) in self._records:  # else a caller's own paced drafter, learning for itself
            self._unsaved.add(id(pacer))  # kept when the step loop runs out of work (``save``)

    def save(self) -> None:
        """What k auto learned, kept for the next process (``recall``): whenever the step loop runs
        out of work (``Scheduler.when_idle``), and when the engine closes. Written at every
        generation's end, the evidence file's read and rewrite took 4.4% of the step loop's time at
        -np 4 on the bundled pair (every slot's decode waited for it); handed over when idle and
        written off the step loop (``recall.store``), it delays no decode and no request."""
        for pacer in self._pacers.values():
            if id(pacer) in self._unsaved:
                recall.store(self._records[id(pacer)], pacer.evidence)
        self._unsaved.clear()

    def close(self) -> None:
        if self._unsaved:
            self.save()
        recall.flush()  # kept before the engine is gone: the next one in this process reads it
