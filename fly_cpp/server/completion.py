"""llama-server's ``POST /completion``: one prompt answered whole or as a stream of per-token
events, or several prompts (``prompts.split``) answered as a list, one result each (``index``:
the prompt's place), generated one after another. ``response_fields`` keeps only the fields
named (``"a/b"``: field ``b`` of ``a``, under that name), as llama-server does.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from fly_cpp.api.fly import Fly
from fly_cpp.api.oai import step_flags
from fly_cpp.backend.sampling import LogitBias
from fly_cpp.basics.errors import FlyError
from fly_cpp.engine.generation import Generation
from fly_cpp.rounds.step import Progress, Step
from fly_cpp.server import prompts, sse
from fly_cpp.server.compat import OFF
from fly_cpp.server.fields import GenerationBody, settings_dict
from fly_cpp.server.prepare import Defaults, Prepared, generation, limit, prepare, slot_of
from fly_cpp.server.probs import entries, raw_needed
from fly_cpp.server.runs import Runs
from fly_cpp.server.timings import timings


async def complete(fly: Fly, runs: Runs, request: Request, body: Any, n_predict: int,
                   defaults: Defaults = Defaults()) -> Response:
    """Answer a /completion body (already checked for unused fields)."""
    asked = prompts.split(body.prompt)
    if len(asked) > 1 and body.stream:
        raise FlyError("stream: one prompt per streamed request (several prompts are answered whole)")
    results = []
    for index, prompt in enumerate(asked):
        result = await _start(fly, runs, body, prompt, index, n_predict, defaults)
        if body.stream:
            return sse.response(runs.events(result.stream()))
        got = await runs.collect(request, result.items)
        if got is None:
            return Response(status_code=499)
        results.append(result.fields(result.final(result.gen.text, result.gen.tokens, result.gen.probs)))
    return JSONResponse(results[0] if len(asked) == 1 else results)


async def _start(fly: Fly, runs: Runs, body: GenerationBody, prompt: Any, index: int, n_predict: int,
                 defaults: Defaults) -> _Result:
    max_tokens = limit(body.n_predict, body.max_tokens, default=n_predict)
    n_probs = body.n_probs
    if n_probs and body.post_sampling_probs:  # the chain runs on the raw top entries (``probs``)
        n_probs = raw_needed(n_probs, body.settings().get("top_k", fly.sampling.top_k), fly.info.n_vocab)
    prepared = await prepare(lambda: generation(fly, body, prompt=prompt, n_probs=n_probs, max_tokens=max_tokens,
                                                chat=defaults))
    gen = prepared.gen

    def steps() -> Iterator[Step | Progress | None]:
        try:
            yield from gen.events() if body.stream and body.return_progress else gen
        finally:
            gen.close()
            runs.metrics.record(gen.stats)
        yield None  # the end: the final result follows

    try:
        items = runs.start(steps, gen.interrupt, pinned=slot_of(body) is not None)
    except BaseException:
        gen.close()
        raise
    return _Result(fly, prepared, body, index, items)


class _Result:
    """One prompt's answer: per-token stream events and the final result."""

    def __init__(self, fly: Fly, prepared: Prepared, body: Any, index: int, items: Any) -> None:
        self.fly, self.gen, self.truncated, self.body = fly, prepared.gen, prepared.truncated, body
        self.index, self.items = index, items
        self.piece = fly.engine.piece
        self.post = self.gen.sampling if body.post_sampling_probs else None  # probabilities after the chain

    async def stream(self) -> AsyncIterator[bytes]:
        gen, body = self.gen, self.body
        pending: list[Step] = []
        sent = 0  # tokens so far (the generation itself may be ahead of this stream)
        async for step in self.items:
            if step is None:
                break
            if isinstance(step, Progress):
                yield sse.event(self.fields(self._progress(step)))
                continue
            pending.append(step)
            sent += 1
            if not step.text:
                continue  # its text comes with a later token; so do its probabilities
            event: dict[str, Any] = {
                "index": self.index, "content": step.text, "tokens": [s.token for s in pending], "stop": False,
                "id_slot": gen.stats.slot, "tokens_predicted": sent, "tokens_evaluated": len(gen.request.prompt),
                "fly_token": step_flags(step)}
            if body.n_probs:
                event["completion_probabilities"] = self._probs(pending)
            if body.timings_per_token:
                event["timings"] = timings(gen.stats)
            pending = []
            yield sse.event(self.fields(event))
        yield sse.event(self.fields(self.final("", [s.token for s in pending], [s.probs for s in pending])))

    def _progress(self, done: Progress) -> dict[str, Any]:
        """A stream's event for one batch of the prompt (``return_progress``)."""
        gen = self.gen
        event: dict[str, Any] = {"index": self.index, "content": "", "tokens": [], "stop": False,
                                 "id_slot": gen.stats.slot, "tokens_predicted": 0, "tokens_evaluated": done.total,
                                 "prompt_progress": done.as_dict()}
        if self.body.timings_per_token:
            event["timings"] = timings(gen.stats, done)
        return event

    def _probs(self, steps: list[Step]) -> list[dict[str, Any]]:
        return entries(self.piece, [s.token for s in steps], [s.probs for s in steps], self.body.n_probs, self.post)

    def fields(self, out: dict[str, Any]) -> dict[str, Any]:
        """``out`` with only the ``response_fields`` asked for (all when none)."""
        wanted = self.body.response_fields
        if not wanted:
            return out
        kept: dict[str, Any] = {}
        for path in wanted:
            value: Any = out
            for key in path.split("/"):
                if not isinstance(value, dict) or key not in value:
                    break
                value = value[key]
            else:
                kept[path] = value
        return kept

    def final(self, content: str, tokens: list[int], probs: list[Any]) -> dict[str, Any]:
        """The last answer: whole (``content``: the text) or a stream's last event (``content``
        "", and the tokens not yet sent)."""
        gen, body = self.gen, self.body
        out: dict[str, Any] = {
            "index": self.index, **outcome(self.fly, gen), "content": content,
            "tokens": tokens if body.return_tokens or body.stream else [],
            # llama-server's: the prompt lost a middle part, or the text filled the context
            "truncated": self.truncated or gen.context_full or gen.stats.n_shifts > 0,
            "generation_settings": {**OFF, **settings_dict(gen.spec, gen.sampling), "seed": gen.seed,
                                    "n_predict": gen.max_tokens, "stop": list(gen.stop), "n_probs": body.n_probs,
                                    "n_keep": body.n_keep, "n_discard": body.n_discard, "cache_prompt": body.cache_prompt,
                                    "logit_bias": _bias(gen.request.bias)},
            "fly": {**gen.stats.as_dict(pacing=False), "context_full": gen.context_full,
                    "interrupted": gen.finish is not None and gen.finish.interrupted},
        }
        if body.n_probs:
            out["completion_probabilities"] = entries(self.piece, tokens, probs, body.n_probs, self.post)
        return out


def outcome(fly: Fly, gen: Generation) -> dict[str, Any]:
    """What /completion tells of a finished generation whatever its body asked: the text, the
    prompt as the model read it, the counts, how it ended, the timings. OpenAI's endpoints add it
    as ``__verbose`` (``verbose``, or the server's --verbose), as llama-server does."""
    finish = gen.finish
    return {"id_slot": gen.stats.slot, "content": gen.text, "stop": True, "model": fly.model,
            "tokens_predicted": len(gen.tokens), "tokens_evaluated": len(gen.request.prompt),
            "prompt": fly.engine.detokenize(gen.request.prompt, special=True), "has_new_line": "\n" in gen.text,
            "stop_type": finish.kind if finish is not None else "none",
            "stopping_word": finish.word if finish is not None else "", "finish_reason": gen.finish_reason,
            "timings": timings(gen.stats)}


def _bias(bias: LogitBias) -> list[dict[str, Any]]:
    """The biases the generation applied (``ignore_eos``'s bans of the end-of-generation tokens
    included), as llama-server lists them: ``{"token", "bias"}``, a ban's bias null (-inf)."""
    return [{"token": int(t), "bias": None if math.isinf(v) else float(v)} for t, v in zip(bias.ids, bias.values)]
