"""``timings``: llama-server's per-response timing block, plus fly-cpp's draft counters.

llama-server's fields: ``cache_n`` (prompt tokens the cache already held), ``prompt_n`` /
``prompt_ms`` (prompt tokens processed and the time it took), ``predicted_n`` /
``predicted_ms`` (tokens generated and the decoding time after the prompt), their per-token and
per-second forms (over the tokens after the first, as llama-server counts them), and ``draft_n`` / ``draft_n_accepted`` (drafted tokens, and those the target kept).
fly-cpp adds ``draft_n_loose`` (kept by FLy's loose acceptance, counted in draft_n_accepted)
and ``mean_accepted`` (tokens per target pass). Every /completion and /v1/* response and
final chunk carries it.
"""

from __future__ import annotations

from typing import Any

from fly_cpp.rounds.step import Progress, Stats


def timings(s: Stats, progress: Progress | None = None) -> dict[str, Any]:
    """The block for ``s``; with ``progress`` (a prompt batch's report), the prompt as far as
    that report and nothing generated yet."""
    if progress is not None:
        s = Stats(s.mode, n_prompt=progress.processed, n_cached=progress.cache, prompt_seconds=progress.seconds)
    prompt_n = s.n_prompt - s.n_cached
    # llama-server's split: the prompt until the decode that finishes it (with a draft, the
    # first round's), the generation after it, whose rate leaves out the first token (it came
    # from that decode)
    prompt_ms = (s.prompt_seconds + s.first_seconds) * 1e3
    predicted_ms = max(s.seconds - s.first_seconds, 0.0) * 1e3
    steps = max(s.n_tokens - 1, 0)
    return {
        "cache_n": s.n_cached,
        "prompt_n": prompt_n, "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": 1e3 / prompt_ms * prompt_n if prompt_ms > 0 else 0.0,
        "predicted_n": s.n_tokens, "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / steps if steps else 0.0,
        "predicted_per_second": 1e3 / predicted_ms * steps if predicted_ms > 0 else 0.0,
        "draft_n": s.n_drafted, "draft_n_accepted": s.n_exact + s.n_loose, "draft_n_loose": s.n_loose,
        "mean_accepted": s.mean_accepted,
    }
