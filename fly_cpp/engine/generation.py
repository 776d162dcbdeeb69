"""One generation as its caller sees it: iterate it for Steps; afterwards its text, tokens,
stats and the way it ended are final."""

from __future__ import annotations

from collections.abc import Iterator

from fly_cpp.config import SamplingSettings, SpecSettings
from fly_cpp.rounds.output import Finish, Output
from fly_cpp.rounds.request import Request
from fly_cpp.rounds.step import Progress, Stats, Step, TokenProbs


class Generation:
    """Iterate it for Steps as they are committed (or ``run()`` it to the end); then ``text``,
    ``tokens``, ``stats`` and ``finish`` (``finish_reason``: "stop" or "length") are final, and
    with ``n_probs`` ``probs`` (one TokenProbs per token). ``close()`` abandons it early; both
    caches stay consistent."""

    def __init__(self, request: Request, spec: SpecSettings, out: Output, steps: Iterator[Step | Progress]) -> None:
        self.request, self._spec = request, spec
        self.out = out
        self.text = ""
        self.tokens: list[int] = []
        self.probs: list[TokenProbs | None] = []
        self._steps = steps

    def __iter__(self) -> Iterator[Step]:
        for item in self.events():
            if isinstance(item, Step):
                yield item

    def events(self) -> Iterator[Step | Progress]:
        """The Steps, and before the first one a ``Progress`` per batch of the prompt (what
        llama-server's ``return_progress`` streams)."""
        keep = self.request.n_probs > 0
        for step in self._steps:
            if isinstance(step, Progress):
                yield step
                continue
            self.text += step.text
            self.tokens.append(step.token)
            if keep:
                self.probs.append(step.probs)
            yield step

    def run(self) -> Generation:
        """Generate to the end without streaming."""
        for _ in self:
            pass
        return self

    def close(self) -> None:
        self._steps.close()

    def interrupt(self) -> None:
        """Ask a running generation, from any thread, to end after its current round; it ends
        like a limit (``finish_reason`` "length") with ``finish.interrupted`` set."""
        self.out.interrupt()

    # the request and the outcome, by name
    @property
    def prompt(self) -> list[int]:
        return list(self.request.prompt)

    @property
    def spec(self) -> SpecSettings:
        return self._spec

    @property
    def sampling(self) -> SamplingSettings:
        return self.request.sampling

    @property
    def max_tokens(self) -> int:
        return self.request.max_tokens

    @property
    def stop(self) -> tuple[str, ...]:
        return self.request.stop

    @property
    def seed(self) -> int:
        return self.request.seed

    @property
    def stats(self) -> Stats:
        return self.out.stats

    @property
    def finish(self) -> Finish | None:
        return self.out.finish

    @property
    def finish_reason(self) -> str | None:
        return self.out.finish.reason if self.out.finish is not None else None

    @property
    def context_full(self) -> bool:
        return self.out.finish is not None and self.out.finish.context_full
