"""From tokens to released text: stop strings held back and cut, and incremental UTF-8."""

from __future__ import annotations

from fly_cpp.rounds.step import Step
from fly_cpp.rounds.text import Detokenizer, StopFilter


def step(text: str) -> Step:
    return Step(0, text, False, False, 1)


def test_stop_filter_holds_back_partial_stop_strings():
    f = StopFilter(["END"])
    assert [s.text for s in f.push(step("abc E"))] == []
    assert [s.text for s in f.push(step("N"))] == []
    assert [s.text for s in f.push(step("x"))] == ["abc E", "N", "x"]
    assert [s.text for s in f.push(step("..EN"))] == []
    assert [s.text for s in f.push(step("D tail"))] == [".."]
    assert f.stopped


def test_stop_filter_cuts_inside_a_token():
    f = StopFilter(["\n\n", "Bob"])
    out = f.push(step("Hi Al")) + f.push(step("ice and Bo")) + f.push(step("bby"))
    assert "".join(s.text for s in out) == "Hi Alice and " and f.stopped


def test_stop_filter_records_the_earliest_stop_string():
    f = StopFilter(["zz", "and"])
    f.push(step("cats and dogs zz"))
    assert f.stopped and f.word == "and"


def test_detokenizer_holds_back_an_unfinished_utf8_character():
    pieces = {1: "é".encode()[:1], 2: "é".encode()[1:], 3: b"!"}
    detok = Detokenizer(pieces.__getitem__)
    assert [detok(t) for t in (1, 2, 3)] == ["", "é", "!"]
