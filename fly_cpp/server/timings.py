"""``timings``: llama-server's per-response timing block, plus fly-cpp's draft counters.

llama-server's fields: ``cache_n`` (prompt tokens the cache already held), ``prompt_n`` /
``prompt_ms`` (prompt tokens processed and the time it took), ``predicted_n`` /
``predicted_ms`` (tokens generated and the decoding time), their per-token and per-second
forms, and ``draft_n`` / ``draft_n_accepted`` (drafted tokens, and those the target kept).
fly-cpp adds ``draft_n_loose`` (kept by FLy's loose acceptance, counted in draft_n_accepted)
and ``mean_accepted`` (tokens per target pass). Every /completion and /v1/* response and
final chunk carries it.
"""

from __future__ import annotations

from typing import Any

from fly_cpp.step import Progress, Stats


def timings(s: Stats, progress: Progress | None = None) -> dict[str, Any]:
    """The block for ``s``; with ``progress`` (a prompt batch's report), the prompt as far as
    that report and nothing generated yet."""
    if progress is not None:
        s = Stats(s.mode, n_prompt=progress.processed, n_cached=progress.cache, prompt_seconds=progress.seconds)
    prompt_n = s.n_prompt - s.n_cached
    prompt_ms = s.prompt_seconds * 1e3
    return {
        "cache_n": s.n_cached,
        "prompt_n": prompt_n, "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": prompt_n / s.prompt_seconds if s.prompt_seconds > 0 else 0.0,
        "predicted_n": s.n_tokens, "predicted_ms": s.seconds * 1e3,
        "predicted_per_token_ms": s.seconds * 1e3 / s.n_tokens if s.n_tokens else 0.0,
        "predicted_per_second": s.tokens_per_second,
        "draft_n": s.n_drafted, "draft_n_accepted": s.n_exact + s.n_loose, "draft_n_loose": s.n_loose,
        "mean_accepted": s.mean_accepted,
    }
