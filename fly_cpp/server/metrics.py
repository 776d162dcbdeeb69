"""``GET /metrics``: Prometheus counters of the server's life (text exposition format 0.0.4)."""

from __future__ import annotations

import threading
from typing import Any

from fly_cpp.step import Stats

COUNTERS = {
    "requests": "generation requests started",
    "requests_aborted": "generations abandoned because the client went away",
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


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.values = dict.fromkeys(COUNTERS, 0)

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

    def render(self, gauges: dict[str, tuple[str, float]]) -> str:
        lines = []
        with self._lock:
            for name, help_text in COUNTERS.items():
                lines += [f"# HELP fly_cpp_{name}_total {help_text}", f"# TYPE fly_cpp_{name}_total counter",
                          f"fly_cpp_{name}_total {self.values[name]}"]
        for name, (help_text, value) in gauges.items():
            lines += [f"# HELP fly_cpp_{name} {help_text}", f"# TYPE fly_cpp_{name} gauge", f"fly_cpp_{name} {value:g}"]
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
