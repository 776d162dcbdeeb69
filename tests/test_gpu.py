"""On a GPU build of llama.cpp (``-DGGML_CUDA=on`` and the like), with every layer offloaded:
exact-match speculation is still the target's own greedy output, and k auto prices the GPU's
decodes from its own measurement. Skipped where llama.cpp has no GPU to offload to (CI)."""

from __future__ import annotations

import pytest

from fly_cpp import Engine, ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.backend.lib import gpu_names

GREEDY = SamplingSettings(temperature=0)  # the texts compared are greedy ones

pytestmark = pytest.mark.skipif(not gpu_names(), reason="llama.cpp was built without a GPU backend, or sees no GPU")

PROMPTS = ["Once upon a time", "Lily and Tom went to the park", "The little dog was sad because", "Sam liked to eat"]


@pytest.fixture(scope="module")
def gpu_pair(stories, stories_draft):
    # n_ubatch=1: each verified row is computed as a one-token decode would compute it (the
    # GPU's batched kernels, like the CPU's, are not bit-identical to single-row ones)
    with Engine(ModelSettings(str(stories), n_ctx=512, n_ubatch=1, n_gpu_layers=-1),
                ModelSettings(str(stories_draft), n_gpu_layers=-1)) as engine:
        yield engine


@pytest.mark.parametrize("k", [4, "auto"])
def test_offloaded_spd_is_the_offloaded_targets_greedy_output(gpu_pair, k) -> None:
    for prompt in PROMPTS:
        target = gpu_pair.generate(prompt, spec=SpecSettings(mode="target"), sampling=GREEDY,
                                   max_tokens=48).run().tokens
        spd = gpu_pair.generate(prompt, spec=SpecSettings(mode="spd", k=k), sampling=GREEDY, max_tokens=48).run()
        assert spd.tokens == target, prompt
        assert spd.stats.n_drafted > 0 or k == "auto"  # k auto may find drafting a tiny pair not worth it


def test_k_auto_drafts_a_steady_k_on_a_gpu(gpu_pair) -> None:
    assert gpu_pair.control.on_gpu()
    gen = gpu_pair.generate(PROMPTS[1], spec=SpecSettings(mode="spd", k="auto", k_gpu=4), sampling=GREEDY,
                            max_tokens=48).run()
    lengths = gen.stats.draft_lengths
    assert max(lengths) == 4 and lengths[4] >= sum(lengths.values()) // 2, lengths  # shorter only near the end
    assert not gen.stats.pacing


def test_k_auto_drafts_steady_rounds_on_a_gpu_by_default(gpu_pair) -> None:
    """Every round of a generation drafts one length (``Pacer.steady``), or, where drafting
    cannot pay on this tiny pair, the rounds are planned."""
    first = gpu_pair.generate(PROMPTS[0], spec=SpecSettings(mode="spd"), sampling=GREEDY, max_tokens=48).run()
    gen = gpu_pair.generate(PROMPTS[1], spec=SpecSettings(mode="spd"), sampling=GREEDY, max_tokens=48).run()
    before, after = first.stats.pacing["plans"], gen.stats.pacing["plans"]  # the pacer's, over its generations
    plans = {kind: after[kind] - before[kind] for kind in after}  # this generation's
    if plans["steady"]:
        lengths = gen.stats.draft_lengths
        assert plans["draft"] == plans["explore"] == 0, plans
        assert max(lengths.values()) >= sum(lengths.values()) // 2, lengths  # one length, shorter only near the end


def test_k_auto_prices_offloaded_decodes_when_it_plans_rounds(gpu_pair) -> None:
    gen = gpu_pair.generate(PROMPTS[0], spec=SpecSettings(mode="fly", k="auto", k_gpu=0), sampling=GREEDY,
                            max_tokens=48).run()
    costs = gen.stats.pacing["costs"]
    assert costs["target_ms"] and costs["draft_ms"]
    assert all(ms > 0 for ms in costs["target_ms"].values())


def test_a_gpu_build_offloads_every_layer_with_no_flag(stories, stories_draft) -> None:
    """As llama.cpp's tools do: `fly-cpp generate -m T -d D` runs wholly on the GPU, and the
    stats line says so."""
    import subprocess
    import sys

    with Engine(str(stories), str(stories_draft)) as engine:
        for model in (engine.target_model, engine.draft_model):
            assert model is not None and model.offloaded == model.n_layer + 1
        assert "layers on" in engine.info().placement and "CPU" not in engine.info().placement
    done = subprocess.run([sys.executable, "-m", "fly_cpp.cli.main", "generate", "-m", str(stories), "-d",
                           str(stories_draft), "-p", PROMPTS[0], "-n", "8"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "target 6/6 layers on" in done.stderr, done.stderr
