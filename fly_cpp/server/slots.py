"""``/slots``: each of the engine's slots (``-np/--parallel``) as llama-server shows them."""

from __future__ import annotations

from typing import Any

from fly_cpp.api import Fly


def slot_states(fly: Fly) -> list[dict[str, Any]]:
    """One entry per slot: its id, context, whether it is generating now, whether it speculates."""
    speculative = fly.info.draft_name is not None or fly.spec.ngram
    return [{"id": i, "n_ctx": fly.n_ctx, "is_processing": busy, "speculative": speculative}
            for i, busy in enumerate(fly.engine.busy_slots())]
