"""N-gram prompt lookup on hand-built token lists."""

from __future__ import annotations

import random

from fly_cpp.drafters.ngram import Index, lookup, match


def test_longest_ngram_wins_and_the_continuation_follows_it():
    #          0  1  2  3  4  5  6  7  8
    tokens = [5, 1, 2, 3, 9, 1, 2, 7, 1, 2]
    # "1 2" occurs at 1 and 5: the earliest (authors' choice) continues with 3 9 1 ...
    assert lookup(tokens, max_n=2, n_pred=3) == [3, 9, 1]
    assert lookup(tokens, max_n=2, n_pred=3, earliest=False) == [7, 1, 2]  # the latest earlier "1 2", at 5
    # no earlier "8 0 2" or "0 2": the unigram "2" (at 2) is the longest match
    assert lookup([4, 1, 2, 8, 0, 2], max_n=3, n_pred=2) == [8, 0]


def test_no_match_and_tiny_contexts():
    assert lookup([1, 2, 3, 4], max_n=4) == []
    assert lookup([7], max_n=4) == []
    assert lookup([], max_n=4) == []


def test_prediction_is_cut_at_the_end_of_the_context():
    assert lookup([1, 2, 1], max_n=1, n_pred=6) == [2, 1]


def test_match_says_how_long_the_ngram_is_that_the_guess_continues():
    assert match([5, 1, 2, 3, 9, 1, 2, 7, 1, 2], max_n=4, n_pred=3) == (2, [3, 9, 1])
    assert match([4, 1, 2, 8, 0, 2], max_n=3, n_pred=2) == (1, [8, 0])
    assert match([1, 2, 3, 4], max_n=4) == (0, [])


def test_the_index_matches_as_a_scan_does_while_the_context_grows_and_is_cut_back():
    rng = random.Random(0)
    for _ in range(200):
        index, tokens = Index(rng.choice([1, 2, 4])), []
        for _ in range(40):
            if tokens and rng.random() < 0.3:  # a rejected draft, or a new prompt sharing a prefix
                tokens = tokens[: rng.randrange(len(tokens))]
            tokens = tokens + [rng.randrange(6) for _ in range(rng.randrange(1, 5))]
            assert index.match(tokens, 5) == match(tokens, index.max_n, 5)


def test_a_walk_judges_each_position_as_a_lookup_there_would():
    """A rest's rounds look nothing up; walking their tokens into the index finds, at each
    position, the match a lookup there would have found, and whether its guess was the token
    written (``PairDrafter._learn_rest``), and leaves the index as lookups would."""
    rng = random.Random(1)
    for _ in range(200):
        index = Index(rng.choice([1, 2, 4]))
        tokens = [rng.randrange(6) for _ in range(rng.randrange(5, 60))]
        start = rng.randrange(len(tokens))
        if rng.random() < 0.5:  # the index already held another text, or part of this one
            index.match(tokens[: rng.randrange(len(tokens))] + [rng.randrange(6) for _ in range(5)])
        expected = []
        for i in range(start, len(tokens)):
            n, guess = match(tokens[:i], index.max_n, 1)
            if n:
                expected.append((n, guess[0] == tokens[i]))
        assert index.walk(tokens, start) == expected
        assert index.match(tokens, 5) == match(tokens, index.max_n, 5)
