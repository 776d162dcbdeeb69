"""Settings are validated once, where they are made: every numeric setting finite and in range;
the accept policy each mode and rule gives."""

from __future__ import annotations

import math

import pytest

from fly_cpp.rounds.accept import AcceptPolicy
from fly_cpp.config import MAX_THREADS, ModelSettings, SamplingSettings, ServerSettings, SpecSettings, max_threads
from fly_cpp.basics.errors import FlyError

BAD = [
    (SamplingSettings, {"presence_penalty": math.nan}, "presence_penalty must be a finite number"),
    (SamplingSettings, {"presence_penalty": math.inf}, "presence_penalty must be a finite number"),
    (SamplingSettings, {"frequency_penalty": -math.inf}, "frequency_penalty must be a finite number"),
    (SamplingSettings, {"repeat_penalty": math.inf}, "repeat_penalty must be a finite number"),
    (SamplingSettings, {"temperature": math.nan}, "temperature must be a finite number"),
    (SamplingSettings, {"top_p": math.nan}, "top_p must be a finite number"),
    (SamplingSettings, {"min_p": 1.5}, "min_p must be in [0, 1]"),
    (SamplingSettings, {"seed": 2**64}, "seed must be >= 0 and < 2**64"),
    (SamplingSettings, {"logit_bias": ((5, math.nan),)}, "logit_bias of token 5 must be a finite number"),
    (SamplingSettings, {"logit_bias": ((-1, 1.0),)}, "logit_bias token must be >= 0"),
    (SpecSettings, {"entropy_threshold": math.nan}, "entropy_threshold must be a number (or inf) >= 0"),
    (SpecSettings, {"p_min": math.nan}, "p_min must be in [0, 1]"),
    (SpecSettings, {"cross_round_confidence": math.nan}, "cross_round_confidence must be in [0, 1)"),
    (SpecSettings, {"k_gpu": -1}, "k_gpu must be"),
    (ModelSettings, {"n_threads": MAX_THREADS + 1}, "n_threads must be at most"),
    (ModelSettings, {"n_threads": 100000}, "n_threads must be at most"),
    (ModelSettings, {"n_batch": 0}, "n_batch must be in [1, "),
    (ModelSettings, {"n_batch": 2**40}, "n_batch must be in [1, "),
    (ModelSettings, {"n_ctx": 1099511627776}, "n_ctx must be in [0, "),
    (ModelSettings, {"tensor_split": (1.0, math.nan)}, "tensor_split entries must be a finite number"),
    (ServerSettings, {"api_key": ""}, "the API key is empty"),
    (ServerSettings, {"api_key": "   "}, "the API key is empty"),
    (ServerSettings, {"api_key": "a b"}, "printable ASCII without spaces"),
    (ServerSettings, {"port": 70000}, "port must be in [0, 65535]"),
    (ServerSettings, {"header_timeout": math.inf}, "header_timeout must be a finite number"),
    (ServerSettings, {"max_body": 10}, "max_body must be in [1024, "),
]


@pytest.mark.parametrize("cls,values,message", BAD, ids=[m for _, _, m in BAD])
def test_bad_settings_are_refused_where_they_are_made(cls, values, message):
    args = {"path": "model.gguf"} if cls is ModelSettings else {}
    with pytest.raises(FlyError) as e:
        cls(**args, **values)
    assert message in str(e.value)


def test_threads_are_bounded_by_the_machine_and_ggml():
    assert 1 <= max_threads() <= MAX_THREADS
    assert ModelSettings("m.gguf", n_threads=max_threads()).threads == max_threads()


def test_bad_thread_environment_is_one_error(monkeypatch):
    monkeypatch.setenv("FLY_CPP_THREADS", "lots")
    with pytest.raises(FlyError, match="FLY_CPP_THREADS must be an integer"):
        ModelSettings("m.gguf")
    monkeypatch.setenv("FLY_CPP_THREADS", "100000")
    with pytest.raises(FlyError, match="FLY_CPP_THREADS must be at most"):
        ModelSettings("m.gguf")


def test_api_key_is_stripped_and_hidden():
    s = ServerSettings(api_key="  secret\n")
    assert s.api_key == "secret" and "secret" not in repr(s)


def test_good_values_pass():
    SamplingSettings(presence_penalty=-1.5, frequency_penalty=2.0, logit_bias=((3, -math.inf), (4, 2.5)), ignore_eos=True)
    SpecSettings(entropy_threshold=math.inf, p_min=0.0)
    ServerSettings(api_key="k", max_body=1024, grace=0)




def test_paper_rule_is_the_published_window_and_gate_whatever_the_safeguards_say():
    spec = SpecSettings(fly_rule="paper", window=4, entropy_threshold=0.5, loose_min_ratio=0.9, loose_top_n=1,
                        loose_in_code=False)
    assert spec.policy() == AcceptPolicy(4, 0.5) and not spec.policy().guarded


def test_guarded_rule_carries_the_safeguards_and_the_support_guard():
    spec = SpecSettings(fly_rule="guarded", loose_min_ratio=0.25, loose_top_n=3, loose_in_code=False)
    assert spec.policy() == AcceptPolicy(6, 0.3, top_n=3, min_ratio=0.25, supported=True, loose_in_code=False,
                                         own_only=True)


def test_exact_modes_ignore_the_rule():
    for mode in ("spd", "target"):
        assert SpecSettings(mode=mode, fly_rule="guarded").policy() == AcceptPolicy.exact()
    assert SpecSettings(entropy_threshold=math.inf).policy().loosens is False


@pytest.mark.parametrize("kwargs, message", [
    ({"fly_rule": "loose"}, "fly_rule must be one of guarded, paper"),
    ({"loose_min_ratio": -0.1}, "loose_min_ratio must be in [0, 1]"),
    ({"loose_min_ratio": 1.5}, "loose_min_ratio must be in [0, 1]"),
    ({"loose_top_n": -1}, "loose_top_n must be >= 0"),
])
def test_bad_safeguards(kwargs, message):
    with pytest.raises(FlyError, match=message.replace("[", r"\[").replace("]", r"\]")):
        SpecSettings(**kwargs)


def test_parallel_auto_shares_one_cache_as_llama_server():
    assert ServerSettings(parallel="auto").n_slots == 4 and ServerSettings(parallel="auto").unified
    assert not ServerSettings(parallel=4).unified
    assert ServerSettings(parallel=4, kv_unified=True).unified


def test_k_slots_must_be_a_count():
    with pytest.raises(ValueError, match="k_slots"):
        SpecSettings(k_slots=-1)


def test_all_layers_offload_by_default_where_a_gpu_or_rpc_server_is():
    """-ngl defaults to every layer, as llama.cpp's tools do on a GPU build; without a GPU and
    rpc servers that is none, so a CPU-only build runs as it always did."""
    s = ModelSettings("t.gguf")
    assert s.n_gpu_layers == -1
    assert s.placed(local_gpus=True).n_gpu_layers == -1
    assert s.placed(local_gpus=False).n_gpu_layers == 0 and s.placed(local_gpus=False).offloaded_layers == 0
    remote = ModelSettings("t.gguf", rpc=("127.0.0.1:50052",))
    assert remote.placed(local_gpus=False).offloaded_layers == -1
    assert ModelSettings("t.gguf", n_gpu_layers=7).placed(local_gpus=False).n_gpu_layers == 7
