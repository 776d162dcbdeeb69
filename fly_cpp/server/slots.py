"""``/slots``: each of the engine's slots (``-np/--parallel``) as llama-server shows them, with
the speculative counters of the generation running there (else of its last) and of the slot's
whole life."""

from __future__ import annotations

from typing import Any

from fly_cpp.api.fly import Fly
from fly_cpp.server.timings import timings


def slot_states(fly: Fly) -> list[dict[str, Any]]:
    """One entry per slot: its id, context, whether it is generating now, whether it speculates;
    once it has run a generation, that one's prompt, progress, ``timings`` (llama-server's block:
    draft_n, draft_n_accepted...) and ``fly`` counters; ``totals``: summed over the slot's life."""
    speculative = fly.info.draft_name is not None or fly.spec.ngram
    out = []
    for i, (busy, view) in enumerate(zip(fly.engine.busy_slots(), fly.engine.slot_views())):
        slot: dict[str, Any] = {"id": i, "n_ctx": fly.n_ctx, "is_processing": busy, "speculative": speculative}
        if (s := view.last) is not None:
            slot.update({
                "n_prompt_tokens": s.n_prompt, "n_prompt_tokens_processed": s.n_prompt - s.n_cached,
                "n_prompt_tokens_cache": s.n_cached,
                # as llama-server: an idle slot shows no budget left over from its last task
                "next_token": [{"has_next_token": view.running,
                                "n_remain": view.limit - s.n_tokens if view.running else -1,
                                "n_decoded": s.n_tokens if view.running else 0}],
                "timings": timings(s),
                "fly": {"mode": s.mode, "rounds": s.n_rounds, "drafts": s.n_drafts, "drafted": s.n_drafted,
                        "accepted": s.n_exact + s.n_loose, "loosely_accepted": s.n_loose,
                        "mean_accepted": s.mean_accepted}})
        slot["totals"] = view.totals
        out.append(slot)
    return out
