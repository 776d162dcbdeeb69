"""Code-block state of an answer, from token bytes (no model needed)."""

from __future__ import annotations

import numpy as np

from fly_cpp.basics.fences import Fences

PIECES = {0: b"Here:\n", 1: b"```", 2: b"python\n", 3: b"x = 1\n", 4: b"``", 5: b"`\n", 6: b"Done.", 7: b"````",
          9: b"prompt ```"}


def fences(start: int = 0) -> Fences:
    return Fences(PIECES.__getitem__, start)


def test_inside_between_fences_the_opening_fence_outside_the_closing_inside():
    f = fences()
    assert f.inside([], [0, 1, 2, 3, 1, 6]).tolist() == [False, False, True, True, True, False]


def test_a_fence_split_over_two_tokens():
    assert fences().inside([], [1, 3, 4, 5, 6]).tolist() == [False, True, True, True, False]


def test_committed_text_carries_over_and_may_be_cut_back():
    f = fences()
    assert f.inside([0, 1, 2], [3]).tolist() == [True]
    assert f.inside([0, 1, 2, 3, 4], [5, 6]).tolist() == [True, False]  # "``" + "`" closes the block
    assert f.inside([0], [6]).tolist() == [False]  # cut back before the fence
    assert f.inside([0, 1, 2, 3, 4, 5], [6]).tolist() == [False]


def test_only_the_answer_counts_and_four_backticks_are_one_fence():
    assert fences(start=1).inside([9], [3]).tolist() == [False]  # the prompt's fence is not the answer's
    assert fences().inside([7], [3]).tolist() == [True]


def test_empty_draft():
    assert fences().inside([0, 1], []).shape == (0,) and fences().inside([], []).dtype == np.bool_
