"""The real pair: Qwen2.5-Coder-1.5B-Instruct (target) and -0.5B-Instruct (draft), both Q4_K_M,
the kit's ``qwen-coder``. Marked ``real_pair``: skipped unless the pair is built (or $CI is
set, when the session builds it). Runs in about a minute or two on 2 CPU threads."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from fly_cpp import Engine, Fly, ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.backend.model import Model
from fly_cpp.server import create_app
from fly_cpp.engine.vocab import check_compatible

pytestmark = pytest.mark.real_pair

PROMPTS = ["def fib(n):",
           "Question: A train covers 120 km in 2 hours. What is its average speed?\nAnswer:",
           "# Python: reverse the words of a sentence\n"]
IM_START, IM_END = 151644, 151645
GREEDY = SamplingSettings(temperature=0)


@pytest.fixture(scope="module")
def fly(qwen_pair):
    with Fly(str(qwen_pair.target), str(qwen_pair.draft), n_ctx=1024, draft_n_ctx=1024) as llm:
        yield llm


def test_vocabularies_are_compatible(qwen_pair) -> None:
    with Model(qwen_pair.target) as t, Model(qwen_pair.draft) as d:
        check_compatible(t, d)
        for m in (t, d):
            assert (m.vocab_type, m.n_vocab, m.bos, m.eos, m.add_bos) == ("BPE", 151936, 151643, IM_END, False)
            assert m.meta("general.architecture") == "qwen2" and m.meta("tokenizer.ggml.pre") == "qwen2"
        assert t.meta("general.name") == "Qwen2.5 Coder 1.5B Instruct GGUF" and t.meta("qwen2.block_count") == "28"
        assert d.meta("general.name") == "Qwen2.5 Coder 0.5B Instruct AWQ" and d.meta("qwen2.block_count") == "24"


def test_chat_template_renders_chatml(fly) -> None:
    """System + user + assistant + user, exactly as Qwen's template writes it (ChatML)."""
    assert fly.chat_format.name == "tokenizer.chat_template"
    conversation = [{"role": "system", "content": "You are a terse assistant."},
                    {"role": "user", "content": "Print hello in C."},
                    {"role": "assistant", "content": 'puts("hello");'},
                    {"role": "user", "content": "Now in Go."}]
    assert fly.chat_format.render(conversation) == (
        "<|im_start|>system\nYou are a terse assistant.<|im_end|>\n"
        "<|im_start|>user\nPrint hello in C.<|im_end|>\n"
        '<|im_start|>assistant\nputs("hello");<|im_end|>\n'
        "<|im_start|>user\nNow in Go.<|im_end|>\n"
        "<|im_start|>assistant\n")
    assert fly.chat_format.render(conversation[1:2], add_generation_prompt=False) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nPrint hello in C.<|im_end|>\n")
    tokens = fly.chat_tokens(conversation)
    assert tokens[0] == IM_START and tokens.count(IM_START) == 5 and tokens.count(IM_END) == 4
    # multi-turn KV reuse: the rendered history is a prefix of the next turn's prompt
    assert fly.chat_format.render(conversation).startswith(fly.chat_format.render(conversation[:2]))


def test_greedy_spd_equals_target(qwen_pair) -> None:
    """Exact-match speculation is the target's own greedy text, token for token (n_ubatch=1:
    verified rows are computed exactly as one-token decodes)."""
    target = ModelSettings(str(qwen_pair.target), n_ctx=512, n_ubatch=1)
    with Engine(target, ModelSettings(str(qwen_pair.draft), n_ctx=512)) as engine:
        for prompt in PROMPTS:
            want = engine.generate(prompt, spec=SpecSettings(mode="target"), sampling=GREEDY, max_tokens=32).run()
            got = engine.generate(prompt, spec=SpecSettings(mode="spd", k=8), sampling=GREEDY,
                                  max_tokens=32).run()  # a fixed k drafts
            assert got.tokens == want.tokens, prompt
            assert len(want.tokens) == 32 and got.stats.n_rounds < 32 and got.stats.n_loose == 0


def test_fly_runs_with_sane_stats(fly) -> None:
    gen = fly.engine.generate(PROMPTS[0], spec=SpecSettings(mode="fly", k=8), max_tokens=32).run()
    s = gen.stats
    assert s.mode == "fly" and gen.finish_reason in ("stop", "length") and gen.text.strip()
    assert 0 < len(gen.tokens) == s.n_tokens <= 32 and 1 <= s.n_rounds <= s.n_tokens
    assert 1 <= s.mean_accepted <= 9 and s.n_exact + s.n_loose <= s.n_drafted
    assert s.n_exact + s.n_loose + s.n_rounds >= s.n_tokens  # each round adds its target token
    assert s.n_exact > 0  # a real draft of the same family agrees most of the time
    assert s.prompt_seconds > 0 and s.target_seconds > 0 and s.draft_seconds > 0


def test_server_answers_a_chat_completion(fly) -> None:
    with TestClient(create_app(fly)) as client:
        r = client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Write a Python function that adds two numbers."}],
            "max_tokens": 32, "temperature": 0})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "chat.completion" and out["model"] == fly.model
    choice = out["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] in ("stop", "length")
    assert "def " in choice["message"]["content"] and "<|im_end|>" not in choice["message"]["content"]
    assert 0 < out["usage"]["completion_tokens"] <= 32 and out["usage"]["prompt_tokens"] > 20
