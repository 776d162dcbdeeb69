"""Output: releasing, holding, confirming and refuting committed tokens, and recording how the
text ends (no model needed: tokens spell their own number)."""

from __future__ import annotations

from fly_cpp.config import SamplingSettings, SpecSettings
from fly_cpp.rounds.output import Finish, Output
from fly_cpp.rounds.request import Request
from fly_cpp.rounds.rules import RoundRules

EOG = 0


def output(max_tokens: int = 10, stop: tuple[str, ...] = ()) -> Output:
    request = Request((1, 2), RoundRules.of(SpecSettings()), SamplingSettings(), max_tokens, stop, seed=0)
    return Output(request, piece=lambda t: f"<{t}>".encode(), is_eog=lambda t: t == EOG)


def test_release_counts_and_spells():
    out = output()
    out.add(5, drafted=True, loose=False, round=1)
    out.add(6, drafted=False, loose=False, round=1)
    steps = out.take()
    assert [(s.token, s.text, s.drafted, s.round) for s in steps] == [(5, "<5>", True, 1), (6, "<6>", False, 1)]
    assert out.stats.n_tokens == 2 and out.stats.n_prompt == 2 and out.finish is None


def test_held_tokens_wait_for_confirm_or_vanish_on_refute():
    out = output()
    out.add(5, drafted=True, loose=True, round=1, hold=True)
    assert out.take() == [] and out.stats.n_tokens == 0
    out.confirm()
    assert [s.token for s in out.take()] == [5] and out.stats.n_tokens == 1
    out.add(7, drafted=True, loose=False, round=2, hold=True)
    out.refute()
    out.confirm()
    assert out.take() == [] and out.stats.n_tokens == 1


def test_finish_kinds_are_recorded_when_they_happen():
    out = output(max_tokens=2)
    out.add(5, True, False, 1)
    out.add(6, True, False, 1)
    out.add(7, True, False, 1)  # past the limit: ignored
    assert out.finish == Finish("length", "limit") and [s.token for s in out.take()] == [5, 6]

    out = output()
    out.add(5, True, False, 1)
    out.add(EOG, False, False, 1)
    assert out.finish == Finish("stop", "eos") and out.stats.n_tokens == 1

    out = output(stop=("<6>",))
    out.add(5, True, False, 1)
    out.add(6, True, False, 1)
    assert out.finish == Finish("stop", "word", "<6>") and "".join(s.text for s in out.take()) == "<5>"

    out = output()
    out.end("length", "limit", context_full=True)
    out.end("stop", "eos")  # the first ending stays
    assert out.finish == Finish("length", "limit", "", True)


def test_zero_max_tokens_is_finished_before_any_token():
    out = output(max_tokens=0)
    assert out.finish == Finish("length", "limit")
    out.add(5, True, False, 1)
    assert out.take() == [] and out.stats.n_tokens == 0


def test_a_one_token_answer_counts_its_end_token_per_round():
    out = output()
    out.stats.n_rounds = 1
    out.add(5, drafted=False, loose=False, round=1)
    out.stats.n_rounds = 2
    out.add(EOG, drafted=False, loose=False, round=2)  # the second round committed the end of the text
    assert out.stats.n_tokens == 1 and out.stats.n_eog == 1
    assert out.stats.mean_accepted == 1.0  # two tokens in two rounds, not "0.50"
    assert out.stats.summary().startswith("fly: 1 token in ") and ", 2 rounds," in out.stats.summary()
