"""The benchmark's parts on their own: datasets, checkers, agreement, NLL, summary maths."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from fly_cpp.backend.context import Context
from fly_cpp.backend.model import Model
from fly_cpp.bench import checkers, datasets, fidelity, paired, report, summary
from fly_cpp.bench.modes import parse_modes
from fly_cpp.config import SpecSettings
from fly_cpp.basics.errors import FlyError

HUMANEVAL_META = {
    "prompt": 'def add(a, b):\n    """Return a + b."""\n',
    "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
    "entry_point": "add",
}


@pytest.mark.parametrize("name, checker, n", [
    ("spec_bench", None, 480), ("mt_bench", None, 80), ("gsm8k", "gsm8k", 1319),
    ("humaneval", "humaneval", 164), ("mbpp", "mbpp", 974),
])
def test_shipped_datasets(name: str, checker: str | None, n: int) -> None:
    data = datasets.load(name)
    assert data.checker == checker and len(data.prompts) == n
    assert all(p.text.strip() for p in data.prompts)
    assert len({p.id for p in data.prompts}) == n


def test_select_spreads_over_categories() -> None:
    prompts = datasets.load("spec_bench").prompts
    picked = datasets.select(prompts, 13)
    assert len({p.category for p in picked}) == 13
    assert datasets.select(prompts, 26)[:13] == picked
    assert datasets.select(prompts, None) == prompts
    # --offset: the same order, split into parts
    assert datasets.select(prompts, 13, offset=13) == datasets.select(prompts, 26)[13:]
    assert datasets.select(prompts, None, offset=470) == datasets.select(prompts, None)[470:]
    assert datasets.select(prompts, 5, offset=480) == []


@pytest.mark.parametrize("text, number", [
    ("The answer is 18.", "18"), ("#### 1,234", "1234"), ("costs $3.50 then 7.0", "7"),
    ("-5 degrees", "-5"), ("no digits here", None), ("1. first 2. second: 42!", "42"),
])
def test_last_number(text: str, number: str | None) -> None:
    assert checkers.last_number(text) == number


def test_gsm8k_check() -> None:
    meta = {"answer": "She makes 9 * 2 = $<<9*2=18>>18.\n#### 18"}
    assert checkers.check_gsm8k("So she makes $18 every day.", meta)["passed"]
    assert not checkers.check_gsm8k("So she makes $16 every day.", meta)["passed"]
    assert not checkers.check_gsm8k("I do not know.", meta)["passed"]


def test_humaneval_correct_wrong_and_chat_answers() -> None:
    assert checkers.check_humaneval("    return a + b\n", HUMANEVAL_META)["status"] == "passed"
    wrong = checkers.check_humaneval("    return a - b\n", HUMANEVAL_META)
    assert wrong["status"] == "failed" and "AssertionError" in wrong["error"]
    chat = "Here you go:\n```python\ndef add(a, b):\n    return b + a\n```\nDone."
    assert checkers.check_humaneval(chat, HUMANEVAL_META)["passed"]
    assert checkers.check_humaneval("    return (\n", HUMANEVAL_META)["status"] == "failed"  # syntax error


def test_chat_answers_are_checked_on_their_definitions() -> None:
    """An instruct model's own example calls and asserts are not the task; an answer cut by the
    token limit keeps the whole lines that parse."""
    own_tests = ("```python\nimport math\n\ndef add(a, b):\n    return a + b\n\nLIMIT = 3\n\n"
                 "def check_solution():\n    assert add(1, 1) == 3  # the model's own mistake\n\n"
                 "check_solution()\nprint(add(2, 2))\nif __name__ == '__main__':\n    raise SystemExit(1)\n```")
    assert checkers.check_humaneval(own_tests, HUMANEVAL_META)["passed"]
    cut = "Sure:\n```python\ndef add(a, b):\n    return a + b\n\n# Test\nassert add(2, 2) == (4 if"
    assert checkers.check_humaneval(cut, HUMANEVAL_META)["passed"]
    assert checkers.check_mbpp(cut.replace("add", "square").replace("a + b", "a * a").replace("(a, b)", "(a)"),
                               {"tests": ["assert square(3) == 9"], "setup": ""})["passed"]
    assert checkers.sanitize("x = (") == "x = ("  # nothing parses: left for the check to report
    wrong = checkers.check_humaneval("```python\ndef add(a, b):\n    return a - b\n```", HUMANEVAL_META)
    assert wrong["status"] == "failed" and "AssertionError" in wrong["error"]


def test_timeout_is_a_failure() -> None:
    result = checkers.check_humaneval("    while True:\n        pass\n", HUMANEVAL_META, timeout=1.0)
    assert result == {"passed": False, "status": "timeout", "error": "timed out after 1s"}


def test_mbpp_check() -> None:
    meta = {"tests": ["assert square(3) == 9", "assert square(0) == 0"], "setup": ""}
    assert checkers.check_mbpp("```python\ndef square(x):\n    return x * x\n```", meta)["passed"]
    assert not checkers.check_mbpp("def square(x):\n    return x + x\n", meta)["passed"]


def test_checked_code_cannot_see_the_benchmark(tmp_path: Path) -> None:
    result = checkers.run_python("import os, sys\nassert os.getcwd() != %r\nassert 'FLY' not in ''.join(os.environ)\n"
                                 % str(Path.cwd()))
    assert result["passed"], result


@pytest.mark.parametrize("a, b, rate, first", [
    ([1, 2, 3], [1, 2, 3], 1.0, None), ([1, 2, 4], [1, 2, 3], 2 / 3, 2), ([1, 2], [1, 2, 3], 2 / 3, 2),
    ([1, 2, 3, 4], [1, 2], 0.5, 2), ([], [], 1.0, None), ([5], [], 0.0, 0), ([9, 2, 3], [1, 2, 3], 2 / 3, 0),
])
def test_agreement(a: list[int], b: list[int], rate: float, first: int | None) -> None:
    assert fidelity.agreement(a, b) == (pytest.approx(rate), first)


def test_geomean_median_and_modes() -> None:
    assert summary.geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert summary.geomean([None, 0.0, math.inf]) is None
    assert summary.median([3.0, None, 1.0, 2.0]) == 2.0
    modes = parse_modes("fly,spd", [4], SpecSettings())
    assert [m.label for m in modes] == ["target", "fly", "spd"] and modes[1].spec.k == 4
    modes = parse_modes("target,fly-plain", [2, 3], SpecSettings(), peer=True)
    assert [m.label for m in modes] == ["target", "fly-plain@k2", "fly-plain@k3", "llama.cpp-target",
                                        "llama.cpp-spd@k2", "llama.cpp-spd@k3"]
    assert modes[1].spec.ngram is False and modes[4].peer == "speculative"
    with pytest.raises(FlyError, match="listed twice"):
        parse_modes("fly,fly", [3], SpecSettings())


def test_modes_pinned_to_one_k() -> None:
    modes = parse_modes("fly-paper,fly-paper+xr@k5", [15], SpecSettings())
    assert [(m.label, m.k, m.spec.k) for m in modes[1:]] == [("fly-paper", 15, 15), ("fly-paper+xr@k5", 5, 5)]
    assert modes[2].spec.cross_round and modes[2].spec.fly_rule == "paper"
    sweep = parse_modes("fly,spd@k2", [3, 4], SpecSettings())
    assert [m.label for m in sweep] == ["target", "fly@k3", "fly@k4", "spd@k2"]
    for text, message in (("fly@k0", "bad mode"), ("fly@kx", "bad mode"), ("target@k3", "bad mode"),
                          ("warp@k3", "unknown mode"), ("fly,fly@k3", "listed twice")):
        with pytest.raises(FlyError, match=message):
            parse_modes(text, [3, 4], SpecSettings())


def test_guarded_variants_set_every_safeguard() -> None:
    base = SpecSettings(loose_min_ratio=0.3, loose_top_n=4, loose_in_code=False)
    r50 = parse_modes("fly-r50", [15], base)[1].spec
    assert (r50.fly_rule, r50.loose_min_ratio, r50.loose_top_n, r50.loose_in_code) == ("guarded", 0.5, 0, True)
    assert parse_modes("fly-paper", [15], base)[1].spec.policy() == SpecSettings(fly_rule="paper").policy()


@pytest.mark.parametrize("won, lost, p", [
    (0, 0, 1.0), (1, 0, 1.0), (5, 0, 0.0625), (0, 6, 0.03125), (3, 3, 1.0), (8, 2, 0.109375), (10, 0, 2 / 1024),
])
def test_sign_test(won: int, lost: int, p: float) -> None:
    assert paired.sign_test(won, lost) == pytest.approx(p)


def test_paired_summary_won_lost_cut_and_nll_on_common_prompts() -> None:
    def rec(prompt: str, mode: str, passed: bool, nll: float, finish: str = "stop") -> dict:
        stats = {"n_tokens": 10, "seconds": 1.0, "n_rounds": 5, "n_drafted": 8, "n_exact": 4, "n_loose": 1,
                 "n_gate_rejected": 0, "n_guard_rejected": 0, "draft_seconds": 0.2, "target_seconds": 0.5,
                 "host_seconds": 0.3, "tokens_per_second": 10.0, "accepted_lengths": [2] * 5}
        return {"prompt_id": prompt, "mode": mode, "category": "c", "stats": stats, "nll": nll,
                "check": {"passed": passed}, "finish_reason": finish}

    target = [rec("a", "target", True, 1.0), rec("b", "target", False, 1.0), rec("c", "target", True, 2.0),
              rec("d", "target", True, 4.0)]
    fly = [rec("a", "fly", False, 1.5), rec("b", "fly", True, 1.5), rec("c", "fly", False, 3.0, "length")]
    rows = {r["mode"]: r for r in summary.summarize(target + fly, ["target", "fly"])}
    assert (rows["fly"]["won"], rows["fly"]["lost"], rows["fly"]["n_paired"]) == (1, 2, 3)
    assert rows["fly"]["sign_p"] == pytest.approx(1.0) and "won" not in rows["target"]
    assert rows["fly"]["cut"] == pytest.approx(1 / 3) and rows["target"]["cut"] == 0.0
    assert rows["fly"]["nll_ratio"] == pytest.approx(2.0 / (4 / 3))  # "d" is not the fly's: left out


def test_rollbacks_of_recurrent_caches_are_summed_per_round_and_reported() -> None:
    def rec(prompt: str, rollback: dict | None) -> dict:
        stats = {"n_tokens": 10, "seconds": 0.5, "n_rounds": 4, "n_drafted": 8, "draft_seconds": 0.1,
                 "target_seconds": 0.3, "host_seconds": 0.1, "tokens_per_second": 20.0, "rollback": rollback}
        return {"prompt_id": prompt, "mode": "spd", "category": "c", "stats": stats}

    def way(name: str, **spent: float) -> dict:
        return {"way": name, "copies": 0, "copy_ms": 0.0, "restores": 0, "restore_ms": 0.0, "native": 0,
                "rebuilds": 0, "redecoded": 0, "split_ms": 0.0, **spent}

    hybrid = {"target": way("snapshots", native=3), "draft": way("checkpoints", copies=4, copy_ms=1.0, restores=2,
                                                                   restore_ms=2.0, split_ms=5.0)}
    row = summary.summarize([rec("a", hybrid), rec("b", hybrid)], ["spd"])[0]
    assert row["rollback_ways"] == {"target": "snapshots", "draft": "checkpoints"} and row["rollbacks"] == 10
    assert row["rollback_ms_per_round"] == pytest.approx(16.0 / 8) and row["rollback_ms_each"] == pytest.approx(1.6)
    assert row["rollback_share"] == pytest.approx(0.016)
    text = report.terminal({"meta": {"dataset": "d", "target": "t", "draft": "d", "n_prompts": 2, "max_tokens": 8,
                                     "k": [3], "templated": False, "temperature": 0.0}, "summary": [row]})
    assert "spd: target by snapshots, draft by checkpoints; 10 rollbacks, 1.600 ms each" in text
    assert "rollback_ways" not in summary.summarize([rec("a", None)], ["spd"])[0]


def test_auto_and_peer_sweeps() -> None:
    modes = parse_modes("fly", ["auto", 5], SpecSettings(), peer=True, peer_ks=[3, 16], peer_p_mins=[0.0, 0.75])
    assert [m.label for m in modes] == ["target", "fly@kauto", "fly@k5", "llama.cpp-target", "llama.cpp-spd@k3p0",
                                        "llama.cpp-spd@k16p0", "llama.cpp-spd@k3p0.75", "llama.cpp-spd@k16p0.75"]
    assert modes[1].spec.auto and modes[1].max_draft == 16 and modes[2].max_draft == 5
    assert modes[-1].k == 16 and modes[-1].p_min == 0.75 and modes[3].max_draft == 0
    only_auto = parse_modes("spd", ["auto"], SpecSettings(), peer=True)
    assert [m.label for m in only_auto] == ["target", "spd", "llama.cpp-target", "llama.cpp-spd"]
    assert only_auto[-1].k == 3  # llama.cpp's default draft length
    with pytest.raises(FlyError, match="k must be >= 1"):
        parse_modes("spd", [0], SpecSettings())
    pinned = parse_modes("fly,fly+xr@k3,spd@kauto", ["auto"], SpecSettings())
    assert [(m.label, m.k) for m in pinned] == [("target", None), ("fly", "auto"), ("fly+xr@k3", 3),
                                               ("spd@kauto", "auto")]
    assert pinned[2].spec.cross_round and pinned[2].spec.k == 3
    with pytest.raises(FlyError, match="bad mode"):
        parse_modes("fly@kx", ["auto"], SpecSettings())


TEMPLATE = ("{{ bos_token }}{% for m in messages %}User: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}Story:{% endif %}")


@pytest.fixture(scope="module")
def templated(stories: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fly_cpp.models import make

    return make.with_metadata(stories, tmp_path_factory.mktemp("tpl") / "stories-chat.gguf",
                              **{"tokenizer.chat_template": TEMPLATE})


def test_chat_template_applied_once_with_one_bos(templated: Path, stories: Path) -> None:
    from fly_cpp import Engine, ModelSettings
    from fly_cpp.bench.prompting import PromptRenderer

    with Engine(ModelSettings(str(templated), n_ctx=128)) as engine:
        r = PromptRenderer(engine).render("Tell me about a cat.")
        assert r.templated and r.text == "User: Tell me about a cat.\nStory:"  # BOS left to the tokenizer
        assert r.tokens == engine.tokenize(r.text) and r.tokens.count(engine.target_model.bos) == 1
        system = PromptRenderer(engine, system="Be brief.").render("Tell me about a cat.")
        assert system.text == "User: Be brief.\nUser: Tell me about a cat.\nStory:"  # this template prints no roles
        raw = PromptRenderer(engine, template=False).render("Tell me about a cat.")
        assert not raw.templated and raw.text == "Tell me about a cat."
        long = PromptRenderer(engine, reserve=64).render("The dog ran and ran. " * 100)
        assert long.truncated and len(long.tokens) <= engine.n_ctx - 64 and long.text.startswith("User: The dog ran")
        assert long.text.endswith("\nStory:")
        with pytest.raises(FlyError, match="--system needs the chat template: drop --no-template"):
            PromptRenderer(engine, template=False, system="Be brief.")
    with Engine(ModelSettings(str(stories), n_ctx=128)) as engine:
        assert not PromptRenderer(engine).render("Hi").templated
        with pytest.raises(FlyError, match="--system needs a chat template: the target GGUF has none"):
            PromptRenderer(engine, system="Be brief.")


def test_bench_with_templated_model(templated: Path, stories_draft: Path, tmp_path: Path) -> None:
    import json

    from fly_cpp.cli.main import main

    out = tmp_path / "out"
    assert main(["bench", "-m", str(templated), "-d", str(stories_draft), "-c", "256", "--dataset", "mt_bench",
                 "--limit", "1", "-n", "8", "--out", str(out), "--no-plots", "--no-warmup", "--no-progress"]) == 0
    result = json.loads((out / "results.json").read_text())
    assert result["meta"]["templated"] and result["meta"]["n_ctx"] == 256
    assert "chat template" in (out / "summary.md").read_text()


def test_llama_cpp_as_its_users_run_it_and_its_best():
    from fly_cpp.bench.summary import best_peer, comparisons
    modes = parse_modes("fly", ["auto"], SpecSettings(), peer=True, peer_users=True)
    peers = [m for m in modes if m.peer == "speculative"]
    assert ("llama.cpp-spd@k3p0" in [m.label for m in peers]  # its defaults: k 3, p-min 0
            and {(m.k, m.p_min) for m in peers if m.spec_type == "draft-simple"}
            == {(k, p) for k in (3, 5, 8, 16) for p in (0.0, 0.75)}
            and {m.k for m in peers if m.spec_type == "ngram-mod,draft-simple"} == {3, 5, 8, 16})
    rows = [{"mode": "target", "peer": False, "tokens_per_second": 3.0},
            {"mode": "fly", "peer": False, "tokens_per_second": 6.0},
            {"mode": "llama.cpp-target", "peer": True, "tokens_per_second": 3.1},
            {"mode": "llama.cpp-spd@k3p0", "peer": True, "tokens_per_second": 4.0},
            {"mode": "llama.cpp-ngram+spd@k5p0", "peer": True, "tokens_per_second": 5.0}]
    tps = {"target": 3.0, "fly": 6.0, "llama.cpp-target": 3.1, "llama.cpp-spd@k3p0": 4.0,
           "llama.cpp-ngram+spd@k5p0": 5.0}
    records = [{"prompt_id": p, "mode": m, "stats": {"tokens_per_second": v}} for p in ("a", "b") for m, v in tps.items()]
    assert best_peer(rows) == "llama.cpp-ngram+spd@k5p0" and best_peer(rows[:2]) is None
    best = [c for c in comparisons(rows, records) if c["best"]]
    assert [(c["ours"], c["peer"]) for c in best] == [("fly", "llama.cpp-ngram+spd@k5p0")]
    assert best[0]["tokens_per_second_ratio"] == pytest.approx(1.2)
