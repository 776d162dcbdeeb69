"""The native hot path equals its numpy reference: argmax exactly, entropies and probabilities to
1e-6 (the top probability, a draft's confidence, to 1e-4), and the same sampled token for the
same uniform number. Also: without the library the numpy path runs (FLY_CPP_NO_NATIVE=1)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from fly_cpp.backend import native, rows
from fly_cpp.config import SamplingSettings
from fly_cpp.backend.sampling import Sampler

needs_native = pytest.mark.skipif(not native.available(), reason=f"native library not in use: {native.status()}")

VOCABS = (1, 2, 3, 7, 512, 32000, 151936)


def logits(rng: np.random.Generator, n_rows: int, n_vocab: int, style: str) -> np.ndarray:
    """(n_rows, n_vocab) float32 in one of several shapes of distribution."""
    if style == "normal":
        x = rng.normal(0.0, 3.0, (n_rows, n_vocab))
    elif style == "peaked":
        x = rng.normal(0.0, 1.0, (n_rows, n_vocab))
        x[np.arange(n_rows), rng.integers(0, n_vocab, n_rows)] += 30.0
    elif style == "ties":  # few distinct values: every row full of ties, the maximum included
        x = rng.integers(0, 4, (n_rows, n_vocab)).astype(np.float64)
    elif style == "ninf":  # -inf entries, at least one finite value per row
        x = rng.normal(0.0, 5.0, (n_rows, n_vocab))
        x[rng.random((n_rows, n_vocab)) < 0.4] = -np.inf
        x[np.arange(n_rows), rng.integers(0, n_vocab, n_rows)] = 0.5
    elif style == "huge":
        x = rng.normal(0.0, 1.0, (n_rows, n_vocab)) * 1e4 + 1e5
    elif style == "tiny":
        x = rng.normal(0.0, 1e-6, (n_rows, n_vocab))
    else:
        raise ValueError(style)
    return x.astype(np.float32)


STYLES = ("normal", "peaked", "ties", "ninf", "huge", "tiny")


@needs_native
@pytest.mark.parametrize("n_vocab", VOCABS)
def test_row_reductions_match_numpy(n_vocab: int) -> None:
    rng = np.random.default_rng(n_vocab)
    for style in STYLES:
        for n_rows in (1, 2, 5, 16) if n_vocab < 32000 else (1, 16):
            x = logits(rng, n_rows, n_vocab, style)
            assert np.array_equal(native.argmax(x), rows.argmax_numpy(x)), style
            np.testing.assert_allclose(native.top_entropy(x), rows.top_entropy_numpy(x), rtol=1e-6, atol=1e-12,
                                       err_msg=style)
            np.testing.assert_allclose(native.top_probability(x), rows.top_probability_numpy(x), rtol=1e-4,
                                       err_msg=style)  # rough exps, as fly_top_probability says


@needs_native
def test_views_are_read_in_place() -> None:
    """Row strides wider than the row (``logits[:, :n]``, as the drafter slices) and row subsets."""
    rng = np.random.default_rng(1)
    base = logits(rng, 9, 1000, "ties")
    for view in (base[:, :777], base[2:7], base[::2], base[3:4, 10:]):
        assert native.accepts(view)
        assert np.array_equal(rows.argmax(view), rows.argmax_numpy(view))
        np.testing.assert_allclose(rows.top_entropy(view), rows.top_entropy_numpy(view), rtol=1e-6)
    for other in (base.astype(np.float64), base[:, ::2], base[0], base.T):
        assert not native.accepts(other)  # falls back to numpy
    assert np.array_equal(rows.argmax(base[:, ::2]), rows.argmax_numpy(base[:, ::2]))
    assert rows.argmax(base[:0]).shape == (0,)


@needs_native
def test_entropy_other_tops() -> None:
    x = logits(np.random.default_rng(2), 4, 512, "normal")
    for top in (1, 2, 5, native.MAX_TOP):
        np.testing.assert_allclose(native.top_entropy(x, top), rows.top_entropy_numpy(x, top), rtol=1e-6)
    np.testing.assert_allclose(rows.top_entropy(x, 40), rows.top_entropy_numpy(x, 40))  # numpy only


def test_minus_inf_contributes_nothing() -> None:
    x = np.full((1, 10), -np.inf, dtype=np.float32)
    x[0, 3] = 1.0
    assert rows.top_entropy_numpy(x)[0] == 0.0
    x[0, 7] = 1.0
    np.testing.assert_allclose(rows.top_entropy_numpy(x)[0], np.log(2.0))
    np.testing.assert_allclose(rows.top_entropy(x)[0], np.log(2.0))


CHAINS = (
    SamplingSettings(temperature=0.8),  # the defaults: top-k 40, top-p 0.95, min-p 0.05
    SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),  # everything kept
    SamplingSettings(temperature=0.5, top_k=0, top_p=0.9, min_p=0.0),
    SamplingSettings(temperature=1.3, top_k=0, top_p=1.0, min_p=0.1),
    SamplingSettings(temperature=0.7, top_k=1000, top_p=0.8, min_p=0.0),
    SamplingSettings(temperature=2.0, top_k=5, top_p=1.0, min_p=0.0),
    SamplingSettings(temperature=1.0, top_k=1, top_p=0.5, min_p=0.2),
)


@needs_native
@pytest.mark.parametrize("n_vocab", (1, 2, 3, 7, 512, 32000, 151936))
def test_sampling_matches_numpy(n_vocab: int) -> None:
    rng = np.random.default_rng(100 + n_vocab)
    for settings in CHAINS:
        sampler = Sampler(settings, seed=0)
        for style in ("normal", "peaked", "ties", "ninf") if n_vocab < 151936 else ("normal", "ties"):
            row = logits(rng, 1, n_vocab, style)[0]
            ids, probs = sampler.distribution(row, [])
            ref_ids, ref_probs = sampler.distribution_numpy(row, [])
            assert np.array_equal(ids, ref_ids), (settings, style)
            np.testing.assert_allclose(probs, ref_probs, rtol=1e-9, atol=1e-15)
            for u in rng.random(40 if n_vocab < 32000 else 8):
                token = native.sample(row, settings.temperature, settings.top_k, settings.top_p, settings.min_p, u)
                assert token == ref_ids[native.draw(ref_probs, u)], (settings, style, u)
                assert token == _draw_numpy(ref_ids, ref_probs, u), (settings, style, u)


@needs_native
@pytest.mark.parametrize("n_vocab", (1, 2, 7, 512, 151936))
def test_the_shared_draw_is_the_samplers(n_vocab: int) -> None:
    """``fly_shared_draw`` (what a sampled native draft run drafts) takes the token the sampler's
    shared draw takes from the same row at the same position and seed."""
    rng = np.random.default_rng(300 + n_vocab)
    for settings in CHAINS:
        for seed in (0, 12345, 2**63 + 7):
            sampler = Sampler(dataclasses.replace(settings, draw="shared"), seed)
            for style in ("normal", "peaked", "ties", "ninf") if n_vocab < 151936 else ("normal",):
                row = logits(rng, 1, n_vocab, style)[0]
                for position in rng.integers(0, 2**33, 6 if n_vocab < 151936 else 2):
                    want = sampler.draw(*sampler.distribution(row, []), int(position))
                    got = native.shared_draw(row, settings.temperature, settings.top_k, settings.top_p, settings.min_p,
                                             seed, int(position))
                    assert got == want, (settings, seed, style, position)


def _draw_numpy(ids: np.ndarray, probs: np.ndarray, u: float) -> int:
    cdf = np.cumsum(probs)
    return int(ids[min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), ids.shape[0] - 1)])


@needs_native
def test_sampler_streams_agree() -> None:
    """A Sampler with the library and one without draw the same tokens from the same seed."""
    rng = np.random.default_rng(7)
    x = logits(rng, 30, 2000, "normal")
    settings = SamplingSettings(temperature=0.9, repeat_penalty=1.3, seed=5)
    with native.enabled(True):
        fast = Sampler(settings, 5)
        a = [fast.sample(x[i], [1, 2, 3, int(i)]) for i in range(30)]
        ga = fast.greedy(x, lambda i: [4, 5, i])
    with native.enabled(False):
        slow = Sampler(settings, 5)
        b = [slow.sample(x[i], [1, 2, 3, int(i)]) for i in range(30)]
        gb = slow.greedy(x, lambda i: [4, 5, i])
    assert a == b
    assert np.array_equal(ga, gb)


def test_fallback_generation_without_native() -> None:
    """The package works with the library switched off: `fly-cpp generate --json` on the bundled
    pair, greedy and sampled, gives the same tokens with and without it."""
    script = """if True:
        import contextlib, io, json, sys
        from fly_cpp.backend import native
        from fly_cpp.cli.main import main
        runs = []
        for extra in (["--temperature", "0"], ["--temperature", "0.8", "--seed", "3"]):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                assert main(["generate", "-p", "Once upon a time", "-n", "20", "-t", "1", "--k", "15", "--json",
                             *extra]) == 0
            runs.append(json.loads(out.getvalue())["tokens"])
        print(json.dumps({"native": native.available(), "runs": runs}))
    """
    outputs = []
    for no_native in ("1", "0"):
        env = {**os.environ, "FLY_CPP_NO_NATIVE": no_native}
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        assert result["native"] == (no_native == "0" and native.available())
        assert all(len(tokens) > 0 for tokens in result["runs"])
        outputs.append(result["runs"])
    assert outputs[0] == outputs[1]


def test_missing_library_is_not_an_error(tmp_path) -> None:
    env = {**os.environ, "FLY_CPP_NATIVE_LIB": str(tmp_path / "nothing.so")}
    env.pop("FLY_CPP_NO_NATIVE", None)
    code = ("from fly_cpp.backend import native, rows; import numpy as np; "
            "assert not native.available(); print(native.status()); "
            "print(rows.argmax(np.eye(3, dtype=np.float32)).tolist())")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "not found" in proc.stdout and "[0, 1, 2]" in proc.stdout
