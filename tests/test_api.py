"""The Python API on real llama.cpp contexts: OpenAI-shaped completions and chat, streamed
and not, stop strings, chat templates, multi-turn KV reuse, argument errors."""

from __future__ import annotations

import threading

import pytest

from fly_cpp import Fly, FlyError, SamplingSettings, SpecSettings, Step
from fly_cpp.backend.cache import common_prefix
from fly_cpp.backend.context import Context
from fly_cpp.models import make

ONE_THREAD = {"n_threads": 1, "draft_n_threads": 1}  # the test machines are shared and busy
GREEDY = SamplingSettings(temperature=0)
LLAMA3_STYLE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{% if m['role'] == 'user' and loop.previtem is defined and loop.previtem['role'] == 'user' %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
CHAT = [{"role": "system", "content": "You tell stories."}, {"role": "user", "content": "Tell me a story."}]


@pytest.fixture(scope="module")
def templated(stories, tmp_path_factory):
    """stories260K with a Llama-3-style chat template in its GGUF."""
    out = tmp_path_factory.mktemp("chat") / "stories-llama3-template.gguf"
    return make.with_metadata(stories, out, **{"tokenizer.chat_template": LLAMA3_STYLE})


@pytest.fixture(scope="module")
def fly(stories, stories_draft):
    # a fixed k: FLy's text then does not depend on the draft lengths a busy machine makes k auto pick; greedy
    with Fly(stories, stories_draft, n_ctx=512, k=15, temperature=0, **ONE_THREAD) as f:
        yield f


@pytest.fixture(scope="module")
def fly_templated(templated, stories_draft):
    with Fly(templated, stories_draft, n_ctx=512, **ONE_THREAD) as f:
        yield f


def test_completion_is_openai_shaped(fly):
    out = fly.create_completion("Once upon a time", max_tokens=20)
    assert out["object"] == "text_completion" and out["id"].startswith("cmpl-")
    assert out["model"] == "stories260K.gguf" and isinstance(out["created"], int)
    (choice,) = out["choices"]
    assert choice["index"] == 0 and choice["logprobs"] is None and choice["finish_reason"] == "length"
    assert choice["text"].startswith(", there was")
    assert out["usage"] == {"prompt_tokens": len(fly.tokenize("Once upon a time")), "completion_tokens": 20,
                            "total_tokens": len(fly.tokenize("Once upon a time")) + 20}
    stats = out["fly"]
    assert stats["mode"] == "fly" and stats["n_tokens"] == 20 and stats["n_rounds"] >= 1
    assert stats["mean_accepted"] == pytest.approx(20 / stats["n_rounds"])
    assert {"n_exact", "n_loose", "n_gate_rejected", "tokens_per_second", "context_full"} <= stats.keys()


def test_completion_is_built_on_steps(fly):
    gen = fly.generate("Lily and Tom went to the park", max_tokens=30)
    steps = list(gen)
    assert all(isinstance(s, Step) for s in steps) and len(steps) == 30
    assert "".join(s.text for s in steps) == gen.text
    assert gen.stats.n_loose == sum(s.loose for s in steps)
    out = fly.create_completion("Lily and Tom went to the park", max_tokens=30)
    assert out["choices"][0]["text"] == gen.text
    assert fly("Lily and Tom went to the park", 30)["choices"][0]["text"] == gen.text  # __call__, like Llama
    assert fly.create_completion(fly.tokenize("Lily and Tom went to the park"), 30)["choices"][0]["text"] == gen.text


def test_streamed_completion_equals_whole(fly):
    whole = fly.create_completion("The little dog was sad because", max_tokens=40)
    chunks = list(fly.create_completion("The little dog was sad because", max_tokens=40, stream=True))
    assert len({c["id"] for c in chunks}) == 1 and all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "length" and last["usage"] == whole["usage"]
    assert last["fly"]["n_tokens"] == 40 and "usage" not in chunks[0]


def test_stop_strings(fly):
    full = fly.create_completion("Once upon a time", max_tokens=40)["choices"][0]["text"]
    assert "Lily" in full
    for stop in ("Lily", ["zzz", "Lily"]):
        out = fly.create_completion("Once upon a time", max_tokens=40, stop=stop)
        assert out["choices"][0]["text"] == full[: full.index("Lily")]
        assert out["choices"][0]["finish_reason"] == "stop"
        streamed = list(fly.create_completion("Once upon a time", max_tokens=40, stop=stop, stream=True))
        assert "".join(c["choices"][0]["text"] for c in streamed) == full[: full.index("Lily")]
        assert streamed[-1]["choices"][0]["finish_reason"] == "stop"


def test_chat_completion_streamed_and_not(fly):
    out = fly.create_chat_completion(CHAT, max_tokens=30)
    assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-")
    (choice,) = out["choices"]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert out["usage"]["prompt_tokens"] == len(fly.chat_tokens(CHAT))
    chunks = list(fly.create_chat_completion(CHAT, max_tokens=30, stream=True))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}  # as OpenAI sends it
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == choice["message"]["content"]
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None,
                                        "finish_reason": choice["finish_reason"]}
    assert chunks[-1]["usage"] == out["usage"]


def test_plain_fallback_format(fly):
    assert fly.chat_format.name == "plain" and fly.chat_format.stop == ("\nUser:",)
    assert fly.chat_format.render(CHAT) == "You tell stories.\n\nUser: Tell me a story.\nAssistant:"
    assert fly.chat_tokens(CHAT) == fly.tokenize(fly.chat_format.render(CHAT))  # with BOS, as the model wants


def test_gguf_template_is_used_with_one_bos(fly_templated):
    fmt = fly_templated.chat_format
    assert fmt.name == "tokenizer.chat_template" and fmt.bos_token == "<s>" and fmt.eos_token == "</s>"
    text = fmt.render(CHAT)
    assert text.startswith("<s><|start_header_id|>system<|end_header_id|>\n\nYou tell stories.<|eot_id|>")
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    tokens = fly_templated.chat_tokens(CHAT)
    bos = fly_templated.engine.target_model.bos
    assert tokens[0] == bos and bos not in tokens[1:]  # the template wrote BOS: it is not added again
    with pytest.raises(FlyError, match="roles must alternate"):
        fly_templated.chat_tokens([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_chat_format_override(stories):
    with Fly(stories, chat_format="chatml", n_ctx=256, n_threads=1) as f:
        assert f.chat_format.render([{"role": "user", "content": "hi"}]) == \
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    with Fly(stories, chat_format="{% for m in messages %}[{{ m.content }}]{% endfor %}", n_ctx=256, n_threads=1) as f:
        assert f.chat_format.render(CHAT) == "[You tell stories.][Tell me a story.]"


def _spy_decodes(monkeypatch) -> list[tuple[Context, int]]:
    calls: list[tuple[Context, int]] = []
    real = Context.decode

    def spy(self, tokens, logits="last"):
        # a draft's catch-up shares one decode with its first draft step (the last rows, with
        # logits): count the tokens that catch the cache up
        calls.append((self, len(tokens) - logits if isinstance(logits, int) else len(tokens)))
        return real(self, tokens, logits)

    def spy_run(self, hist, n_hist, rules, n_vocab, *rest, **kw):  # a native draft run: its catch-up likewise
        calls.append((self, n_hist - 1 - len(self.tokens)))
        return real_run(self, hist, n_hist, rules, n_vocab, *rest, **kw)

    real_run = Context.draft_run
    monkeypatch.setattr(Context, "decode", spy)
    monkeypatch.setattr(Context, "draft_run", spy_run)
    return calls


@pytest.mark.parametrize("which", ["plain", "template"])
def test_multi_turn_reuses_the_cache_and_equals_a_fresh_run(which, stories, templated, stories_draft, monkeypatch):
    path = stories if which == "plain" else templated
    # one-row micro-batches: a prompt decoded in one batch and the same tokens decoded over the
    # rounds then give the same bits (llama.cpp's kernels differ between batch sizes), so that
    # FLy's gate and safeguards see the same numbers in both runs
    exact = {**ONE_THREAD, "n_ubatch": 1, "draft_n_ubatch": 1}
    with Fly(path, stories_draft, n_ctx=512, k=15, temperature=0, **exact) as f:  # a fixed k: the draft drafts every round
        first = f.create_chat_completion(CHAT, max_tokens=40)["choices"][0]["message"]["content"]
        conversation = [*CHAT, {"role": "assistant", "content": first.strip()},
                        {"role": "user", "content": "What happened next?"}]
        kv_before = {"target": list(f.engine.target.tokens), "draft": list(f.engine.draft_ctx.tokens)}
        prompt1, prompt2 = f.chat_tokens(CHAT), f.chat_tokens(conversation)
        assert prompt2[: len(prompt1)] == prompt1  # the rendered conversation only grows

        calls = _spy_decodes(monkeypatch)
        second = f.generate(prompt2, max_tokens=40).run()
        for name, ctx in (("target", f.engine.target), ("draft", f.engine.draft_ctx)):
            kept = common_prefix(kv_before[name], prompt2[:-1])
            assert kept >= len(prompt1)  # the whole first turn stayed in the cache
            prompt_decode = next(n for c, n in calls if c is ctx)  # the first decode is the prompt's
            # only the new turn was decoded: the target's through its last token, whose row may give the
            # first token (``Runs.start``); the draft's up to what was committed when it began, all but
            # its last token: the prompt's, or the first token where it came before (the target sure there)
            new = len(prompt2) - kept
            assert prompt_decode == new if name == "target" else prompt_decode in (new - 1, new)
        monkeypatch.undo()

    with Fly(path, stories_draft, n_ctx=512, k=15, temperature=0, **exact) as fresh:
        again = fresh.generate(fresh.chat_tokens(conversation), max_tokens=40).run()
        assert again.tokens == second.tokens
        assert fresh.create_chat_completion(conversation, max_tokens=40)["choices"][0]["message"]["content"] == \
            second.text.lstrip()


def test_defaults_and_per_call_settings(stories, stories_draft):
    with Fly(stories, stories_draft, n_ctx=512, mode="spd", k=4, temperature=0, **ONE_THREAD) as f:
        assert f.spec == SpecSettings(mode="spd", k=4)
        assert f.create_completion("Sam liked to eat", 20)["fly"]["mode"] == "spd"
        out = f.create_completion("Sam liked to eat", 20, mode="target")["fly"]
        assert out["mode"] == "target" and out["n_rounds"] == 20
        assert f.create_completion("Sam liked to eat", 20, fly={"mode": "fly", "window": 1})["fly"]["mode"] == "fly"
        assert f.create_completion("Sam liked to eat", 20, fly=SpecSettings(mode="target"))["fly"]["mode"] == "target"
        greedy = f.create_completion("Sam liked to eat", 20, mode="target")["choices"][0]["text"]
        assert f.create_completion("Sam liked to eat", 20, ngram=False)["choices"][0]["text"] == greedy  # spd is exact
        sampled = [f.create_completion("Sam liked to eat", 20, temperature=0.9, seed=7)["choices"][0]["text"]
                   for _ in range(2)]
        assert sampled[0] == sampled[1]
        assert f.create_completion("Sam liked to eat", None)["choices"][0]["finish_reason"] in ("stop", "length")


def test_bad_arguments_raise_clear_errors(fly, stories, tmp_path):
    with pytest.raises(TypeError, match="unknown setting 'temprature'; did you mean 'temperature'"):
        fly.create_completion("hi", temprature=0.5)
    with pytest.raises(TypeError, match="unknown setting 'n_ctxx'"):
        Fly(stories, n_ctxx=128)
    with pytest.raises(TypeError, match="unknown setting 'max_tokns'; 'max_tokens' is an argument of a request"):
        Fly(stories, max_tokns=3)
    with pytest.raises(FlyError, match="temperature must be >= 0"):
        fly.create_completion("hi", temperature=-1)
    with pytest.raises(FlyError, match="mode must be one of"):
        fly.create_chat_completion(CHAT, mode="fast")
    with pytest.raises(FlyError, match="k must be >= 0"):
        fly.create_completion("hi", fly={"k": -1})
    with pytest.raises(TypeError, match="unknown setting 'top_k'"):
        fly.create_completion("hi", fly={"top_k": 3})
    with pytest.raises(TypeError, match="prompt must be a string or a list of token ids"):
        fly.create_completion(3.5)
    with pytest.raises(TypeError, match="stop must be a string or a list of strings"):
        fly.create_completion("hi", stop=[1])
    with pytest.raises(TypeError, match="max_tokens must be an int"):
        fly.create_completion("hi", max_tokens="10")
    with pytest.raises(FlyError, match="max_tokens must be >= 0"):
        fly.create_completion("hi", max_tokens=-1)
    with pytest.raises(FlyError, match="longer than the context"):
        fly.create_completion("Once upon a time " * 200)
    with pytest.raises(FlyError, match="the prompt is empty"):
        fly.create_completion([])
    with pytest.raises(TypeError, match="messages must be a list"):
        fly.create_chat_completion("hello")
    with pytest.raises(FlyError, match=r"messages\[0\]: role must be one of"):
        fly.create_chat_completion([{"role": "robot", "content": "hi"}])
    with pytest.raises(FlyError, match=r"messages\[0\]: content must be a string"):
        fly.create_chat_completion([{"role": "user", "content": None}])
    with pytest.raises(FlyError, match="messages is empty"):
        fly.create_chat_completion([])
    with pytest.raises(FlyError, match="model file not found"):
        Fly(tmp_path / "missing.gguf")
    with pytest.raises(FlyError, match="unknown chat format 'llama9'"):
        Fly(stories, chat_format="llama9", n_ctx=128)
    with pytest.raises(FlyError, match="not valid Jinja"):
        Fly(stories, chat_format="{% for %}", n_ctx=128)
    with pytest.raises(TypeError, match="not both"):
        Fly(stories, model_path=stories)
    with pytest.raises(FlyError, match="needs a target"):
        Fly(draft=stories)
    with pytest.raises(FlyError, match="hf_file needs hf_repo"):
        Fly(hf_file="model.gguf")
    with pytest.raises(TypeError, match="not both"):
        Fly(stories, hf_repo="owner/name", hf_file="model.gguf")


def test_text_content_parts_are_joined(fly):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Tell me"}, {"type": "text", "text": "a story."}]}]
    assert fly.chat_tokens(parts) == fly.chat_tokens([{"role": "user", "content": "Tell me\na story."}])
    with pytest.raises(FlyError, match="only text content parts"):
        fly.chat_tokens([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])


def test_calls_from_threads_are_serialised(fly):
    prompts = ["Once upon a time", "Mom said,", "The sun was hot and", "Sam liked to eat"]
    expected = [fly.create_completion(p, 40)["choices"][0]["text"] for p in prompts]
    results: dict[int, str] = {}

    def work(i: int) -> None:
        if i % 2:
            results[i] = "".join(c["choices"][0]["text"] for c in fly.create_completion(prompts[i], 40, stream=True))
        else:
            results[i] = fly.create_completion(prompts[i], 40)["choices"][0]["text"]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [results[i] for i in range(len(prompts))] == expected


def test_close_with_an_open_stream_and_after(stories, stories_draft):
    f = Fly(stories, stories_draft, n_ctx=512, **ONE_THREAD)
    stream = f.create_completion("Once upon a time", 100, stream=True)
    next(stream)
    next(stream)
    f.close()  # closes the stream (which holds the engine) instead of waiting for it forever
    with pytest.raises(FlyError, match="closed"):
        f.create_completion("Once upon a time")
    f.close()  # twice is fine


def test_abandoned_stream_leaves_a_usable_instance(fly):
    expected = fly.create_completion("Mom said,", 30)["choices"][0]["text"]
    stream = fly.create_completion("Once upon a time", 200, stream=True)
    for _, _ in zip(range(3), stream):
        pass
    stream.close()
    assert fly.create_completion("Mom said,", 30)["choices"][0]["text"] == expected


def test_draft_follows_the_target_settings(stories, stories_draft):
    with Fly(stories, stories_draft, n_ctx=256, n_threads=2, type_k="f32", type_v="f32", flash_attn="off") as f:
        info = f.engine.info()
        assert info.n_threads == 2 and info.draft_n_threads == 2  # the draft's context got the target's threads
        assert (info.draft.type_k, info.draft.type_v, info.draft.flash_attn) == ("f32", "f32", "off")
        assert f.create_completion("Once", max_tokens=4)["usage"]["completion_tokens"] == 4
    with Fly(stories, stories_draft, n_ctx=256, n_threads=2, draft_n_threads=1, draft_type_k="f32") as f:
        info = f.engine.info()
        assert info.n_threads == 2 and info.draft_n_threads == 1 and info.draft.type_k == "f32"
        assert info.target.type_k == "f16"


def test_llama_cpp_python_habits(stories, capfd):
    """verbose= is accepted (True echoes llama.cpp's log); chat_format names llama-cpp-python knows."""
    with Fly(stories, n_ctx=256, n_threads=1, verbose=False, chat_format="llama-3", use_mmap=False,
             flash_attn=True) as f:
        assert f.chat_format.name == "llama-3"
        assert f.info.target.mmap is False and f.info.target.flash_attn == "on"
    assert "llama_model_loader" not in capfd.readouterr().err
    from fly_cpp.backend.lib import set_verbose

    try:
        with Fly(stories, n_ctx=256, n_threads=1, verbose=True):
            pass
        assert "llama_model_loader" in capfd.readouterr().err
    finally:
        set_verbose(False)


def test_draft_min_drops_short_drafts(fly):
    class TwoTokens:
        """Always drafts two tokens (the last one, twice)."""

        def draft(self, committed, limit):
            return [committed[-1]] * min(2, limit)

    prompt = fly.tokenize("Once upon a time")
    spec = SpecSettings(mode="spd", k=4, n_min=3)
    dropped = fly.engine.generate(prompt, spec=spec, sampling=GREEDY, max_tokens=12, drafter=TwoTokens()).run()
    # every draft is too short, except in the last two rounds: there the token budget leaves room for only
    # 2 and 1 drafted tokens, and a draft as long as the round allows is kept
    assert dropped.stats.n_drafted == 2 + 1 and dropped.stats.n_rounds == 12
    kept = fly.engine.generate(prompt, spec=SpecSettings(mode="spd", k=4, n_min=2), sampling=GREEDY, max_tokens=12,
                               drafter=TwoTokens()).run()
    assert kept.stats.n_drafted > 0 and kept.tokens == dropped.tokens  # spd: the target's text either way
    with pytest.raises(FlyError, match=r"n_min \(5\) must be <= k \(4\)"):
        SpecSettings(k=4, n_min=5)


def test_small_context_is_honoured(stories):
    with Fly(stories, n_ctx=64, n_threads=1) as f:  # llama.cpp allocates 256; the context still holds 64
        assert f.n_ctx == 64
        gen = f.generate("Once upon a time", max_tokens=None)
        gen.run()
        assert gen.context_full and gen.stats.n_prompt + gen.stats.n_tokens == 64


def test_bundled_pair_by_default():
    with Fly(n_threads=1, draft_n_threads=1) as f:
        assert f.model == "stories260K.gguf" and f.n_ctx == 512 and f.engine.draft_model is not None
        assert "Fly(target='stories260K.gguf'" in repr(f)
        assert f.create_completion("Once upon a time", 5)["usage"]["completion_tokens"] == 5


def test_a_draft_longer_than_the_engine_was_loaded_for_is_refused_not_a_crash(stories, stories_draft):
    """llama.cpp's buffers hold logits for the longest round the engine was loaded for (as
    llama-server's --draft-max sizes them; past it llama.cpp asserts and the process dies): a
    longer k is a clear error, and an engine loaded for it drafts it."""
    with Fly(stories, stories_draft, n_ctx=256) as fly:
        with pytest.raises(FlyError, match="drafts more than this engine was loaded for"):
            fly.create_completion("Once upon a time", max_tokens=8, mode="spd", k=24)
        assert fly.engine.target.n_outputs == 17
    with Fly(stories, stories_draft, n_ctx=256, k=24, mode="spd") as fly:
        out = fly.create_completion("Once upon a time", max_tokens=40, temperature=0)
        assert out["usage"]["completion_tokens"] == 40 and fly.engine.target.n_outputs == 25
