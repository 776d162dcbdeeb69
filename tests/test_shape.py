"""Steady verification batches (``fly_cpp.rounds.shape``): the width rule, and padded rounds on real
llama.cpp contexts, which must change nothing but the shape of the target's decodes."""

from __future__ import annotations

import pytest

from fly_cpp import Engine, ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.backend.context import Context
from fly_cpp.rounds.shape import Steady, padded

PROMPTS = ["Once upon a time", "Lily and Tom went to the park", "The little dog was sad because"]
GREEDY = SamplingSettings(temperature=0)


def test_the_width_is_the_widest_recent_round_within_the_room() -> None:
    steady = Steady(span=3)
    assert [steady.width(r, 100) for r in (1, 6, 2, 3, 1, 1)] == [1, 6, 6, 6, 3, 3]
    assert steady.width(9, 100) == 9  # a wider round widens at once
    assert steady.width(2, 4) == 4  # never past what the cache holds still ...
    assert steady.width(5, 4) == 5  # ... and never fewer rows than the round needs
    assert padded([7, 8], 4) == [7, 8, 8, 8] and padded([7], 1) == [7]


@pytest.fixture(scope="module")
def pair(stories, stories_draft):
    # n_ubatch=1: a padded batch's real rows are computed as one-token decodes would compute them
    with Engine(ModelSettings(str(stories), n_ctx=512, n_ubatch=1), ModelSettings(str(stories_draft))) as engine:
        yield engine


@pytest.fixture
def widths(monkeypatch):
    """The number of rows of every target decode that asks for all logits (the verifications)."""
    seen: list[int] = []
    decode = Context.decode

    def spy(self, tokens, logits="last"):
        if logits == "all" and self.model.name.startswith("stories"):
            seen.append(len(tokens))
        return decode(self, tokens, logits)

    monkeypatch.setattr(Context, "decode", spy)
    return seen


@pytest.mark.parametrize("k", [3, "auto"])
def test_padded_rounds_write_the_targets_own_tokens_and_leave_no_row_behind(pair, k) -> None:
    for prompt in PROMPTS:
        target = pair.generate(prompt, spec=SpecSettings(mode="target"), sampling=GREEDY, max_tokens=48).run().tokens
        gen = pair.generate(prompt, spec=SpecSettings(mode="spd", k=k, steady_batches="on"), sampling=GREEDY,
                            max_tokens=48)
        out = gen.run()
        assert out.tokens == target, prompt
        assert pair.target.tokens == list(pair.tokenize(prompt)) + out.tokens[:-1]  # the pads were rolled back


class Cycling:
    """Drafts of lengths 1, 4, 0, 2, 6 in turn, all of token 0 (spd keeps what the target writes anyway)."""

    lengths = (1, 4, 0, 2, 6)

    def __init__(self) -> None:
        self.made: list[int] = []

    def draft(self, committed, limit):
        self.made.append(min(self.lengths[len(self.made) % len(self.lengths)], limit))
        return [0] * self.made[-1]


@pytest.mark.parametrize("steady", ["on", "off"])
def test_padding_holds_the_width_of_the_widest_recent_round(pair, widths, steady) -> None:
    prompt = PROMPTS[0]
    target = pair.generate(prompt, spec=SpecSettings(mode="target"), sampling=GREEDY, max_tokens=24).run().tokens
    widths.clear()
    drafter = Cycling()
    out = pair.generate(prompt, spec=SpecSettings(mode="spd", k=6, steady_batches=steady), sampling=GREEDY,
                        max_tokens=24, drafter=drafter).run()
    assert out.tokens == target
    started = steady == "off"  # unpadded, the first token comes from the prompt's last row, a round of its own
    assert out.stats.n_from_prompt == started and out.stats.n_passes == out.stats.n_rounds - started
    # the last round drafts nothing: a decode of one row, or unpadded, where runs are, a native run of one
    last = started and pair.target.runs_natively
    rows = [n + 1 for n in drafter.made] + [1] * (out.stats.n_rounds - started - len(drafter.made) - last)
    assert widths == ([max(rows[: i + 1]) for i in range(len(rows))] if steady == "on" else rows)


def test_auto_pads_only_where_the_target_runs_on_a_device(pair) -> None:
    assert not pair.control.steady_batches(SpecSettings())  # off unless asked
    assert not pair.control.steady_batches(SpecSettings(steady_batches="auto"))  # this target runs on the CPU
    assert pair.control.steady_batches(SpecSettings(steady_batches="on"))
    assert not pair.control.steady_batches(SpecSettings(steady_batches="off"))
