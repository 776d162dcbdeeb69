"""``GET /metrics``: Prometheus counters of the server's life (text exposition format 0.0.4).

Two families side by side: llama-server's ``llamacpp:`` names, so dashboards built for it
work unchanged (its throughput gauges cover the time since the previous scrape, as there), and fly-cpp's own ``fly_cpp_`` counters (loose accepts, gate rejections,
aborted requests, errors, ...).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from fly_cpp.engine.ledger import COUNTERS as SLOT_COUNTERS
from fly_cpp.rounds.step import Stats

COUNTERS = {
    "requests": "generation requests started",
    "requests_aborted": "generations abandoned because the client went away",
    "requests_refused": "generation requests refused with 503 (queue full, shutting down)",
    "errors": "responses with an error status (4xx/5xx), and errors inside streams",
    "prompt_tokens": "prompt tokens of finished generations",
    "tokens_predicted": "tokens generated",
    "rounds": "target forward passes (rounds)",
    "drafted": "tokens drafted",
    "accepted": "drafted tokens the target kept (exactly or loosely)",
    "loosely_accepted": "drafted tokens kept by FLy's loose acceptance",
    "gate_rejected": "mismatches refused by the entropy gate",
    "guard_rejected": "mismatches refused by a safeguard of the accept rule",
}

LLAMACPP_COUNTERS = {
    "prompt_tokens_total": "Number of prompt tokens processed, excluding cached tokens.",
    "prompt_tokens_cached_total": "Number of prompt tokens reused from the cache.",
    "prompt_seconds_total": "Prompt process time",
    "tokens_predicted_total": "Number of generation tokens processed.",
    "tokens_predicted_seconds_total": "Predict process time",
    "n_decode_total": "Total number of llama_decode() calls",
    "n_tokens_max": "Largest observed n_tokens.",
    "spec_decode_num_drafts_total": "Number of speculative drafts verified.",
    "spec_decode_num_draft_tokens_total": "Number of drafted tokens.",
    "spec_decode_num_accepted_tokens_total": "Number of drafted tokens accepted (fly-cpp: exactly or loosely).",
}


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.values = dict.fromkeys(COUNTERS, 0)
        self.llamacpp: dict[str, float] = dict.fromkeys(LLAMACPP_COUNTERS, 0)
        self.per_position: list[int] = []  # drafted tokens accepted at each draft position
        # since the last scrape (llama-server's throughput buckets): prompt tokens, their seconds,
        # generated tokens, theirs
        self.window = [0.0, 0.0, 0.0, 0.0]

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.values[name] += n

    def record(self, stats: Stats) -> None:
        """Add a finished (or abandoned) generation's counters."""
        with self._lock:
            for name, n in (("prompt_tokens", stats.n_prompt), ("tokens_predicted", stats.n_tokens),
                            ("rounds", stats.n_rounds), ("drafted", stats.n_drafted),
                            ("accepted", stats.n_exact + stats.n_loose), ("loosely_accepted", stats.n_loose),
                            ("gate_rejected", stats.n_gate_rejected), ("guard_rejected", stats.n_guard_rejected)):
                self.values[name] += n
            processed = stats.n_prompt - stats.n_cached
            m = self.llamacpp
            m["prompt_tokens_total"] += processed
            w = self.window
            w[0] += processed
            w[1] += stats.prompt_seconds
            w[2] += stats.n_tokens
            w[3] += stats.seconds
            m["prompt_tokens_cached_total"] += stats.n_cached
            m["prompt_seconds_total"] += stats.prompt_seconds
            m["tokens_predicted_total"] += stats.n_tokens
            m["tokens_predicted_seconds_total"] += stats.seconds
            m["n_decode_total"] += stats.n_rounds + (processed > 1)
            m["n_tokens_max"] = max(m["n_tokens_max"], stats.n_prompt + stats.n_tokens)
            m["spec_decode_num_drafts_total"] += stats.n_drafts
            m["spec_decode_num_draft_tokens_total"] += stats.n_drafted
            m["spec_decode_num_accepted_tokens_total"] += stats.n_exact + stats.n_loose
            for length in stats.accepted_lengths:  # drafted tokens kept + the target's own
                if length - 1 > len(self.per_position):
                    self.per_position += [0] * (length - 1 - len(self.per_position))
                for i in range(length - 1):
                    self.per_position[i] += 1

    def render(self, gauges: dict[str, tuple[str, float]], slots: Sequence[dict[str, int]] = (),
               sharing: dict[str, tuple[int, int, int]] | None = None) -> str:
        """``gauges``: name -> (help, value); ``slots``: each slot's counters over its life
        (``fly_cpp.engine.ledger``), as ``fly_cpp_slot_<name>_total{slot="i"}``; ``sharing``: with
        several slots, each model's shared decodes, the sequences and rows they held
        (``Engine.sharing``)."""
        sharing = sharing or {}
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, value: float) -> None:
            lines.extend((f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value:g}"))

        with self._lock:
            m = dict(self.llamacpp)
            for name, help_text in LLAMACPP_COUNTERS.items():
                metric(f"llamacpp:{name}", "counter", help_text, m[name])
            name = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
            lines += [f"# HELP {name} Number of drafted tokens accepted at each draft position.",
                      f"# TYPE {name} counter"]
            lines += [f'{name}{{position="{i}"}} {n}' for i, n in enumerate(self.per_position)]
            for name, help_text in COUNTERS.items():
                metric(f"fly_cpp_{name}_total", "counter", help_text, self.values[name])
            w, self.window = self.window, [0.0, 0.0, 0.0, 0.0]  # each scrape starts a new window
        prompt_rate = w[0] / w[1] if w[1] else 0.0
        predicted_rate = w[2] / w[3] if w[3] else 0.0
        metric("llamacpp:prompt_tokens_seconds", "gauge",
               "Average prompt throughput in tokens/s since the previous scrape.", prompt_rate)
        metric("llamacpp:predicted_tokens_seconds", "gauge",
               "Average generation throughput in tokens/s since the previous scrape.", predicted_rate)
        if "target" in sharing:  # several slots: the target's shared decodes
            decodes, seqs, _ = sharing["target"]
            busy = seqs / decodes if decodes else 0.0
        else:  # one slot: every decode had one busy slot
            busy = 1.0 if m["n_decode_total"] else 0.0
        metric("llamacpp:n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call.", busy)
        for role, (decodes, _, rows) in sharing.items():
            metric(f"fly_cpp_{role}_rows_per_decode", "gauge", f"Average rows of the {role} model's shared decodes "
                   "(several slots).", rows / decodes if decodes else 0.0)
        for name, (help_text, value) in gauges.items():
            metric(f"llamacpp:{name}", "gauge", help_text, value)
            metric(f"fly_cpp_{name}", "gauge", help_text, value)
        for name, (help_text, _) in SLOT_COUNTERS.items() if slots else ():
            family = f"fly_cpp_slot_{name}_total"
            lines += [f"# HELP {family} {help_text}, per slot (-np/--parallel)", f"# TYPE {family} counter"]
            lines += [f'{family}{{slot="{i}"}} {counters[name]}' for i, counters in enumerate(slots)]
        return "\n".join(lines) + "\n"


class CountErrors:
    """Pure ASGI middleware counting responses whose status is 4xx or 5xx (not 499: the client
    left, counted as an aborted request)."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counting(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400 and message["status"] != 499:
                self.metrics.count("errors")
            await send(message)

        await self.app(scope, receive, counting)
