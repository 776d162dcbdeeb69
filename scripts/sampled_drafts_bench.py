"""How often sampled drafts keep: the draft's argmax (under llama.cpp's draw, as llama.cpp drafts)
against the draft drawing with the target's own chain and noise (the shared draw), at fixed k
and several temperatures.

No clock. Lossless speculative decoding (``--mode spd``) at a fixed k writes the target's own
text, and a round keeps the drafted tokens up to the first one that is not the target's draw
there; a draft's token at a position depends only on the text before it (and, drawn, on the
seed's noise at that position). So one target-alone generation per prompt, then one pass of
the draft over that text (teacher-forced, logits at every generated position), give whether
the draft's token equals the target's at each position, for both ways of drafting on the same
text (paired), and from that every k's rounds: tokens
per target pass (what a pass yields, the gain where a pass's rows are nearly free, as on a GPU)
and the share of drafted tokens kept. ``--scales`` drafts the shared draw at several fractions of
the temperature (``SamplingSettings.draft_temp_scale``), each a column on the same texts.
``--tree B,..`` also judges trees of the same k verified tokens under the shared draw, a column
for each B and each ``--fork-gap`` G: a chain of k - 1 - B tokens and one branch of 1 + B, the
draft's second candidate (its second-highest noised score) at the first chain position where
the two candidates' scores lie within G nats, then B draws of the draft after it; where no
position forks, the chain takes all k. Its tokens and its choice of fork are the draft's alone,
so a tree keeps the chain's tokens up to the fork, and past a mismatch there the branch's where
the target drew the second candidate: along the target's own text the branch's draws are the
chain's draws there. Draft decodes a kept token count what drafting costs where decodes are
sequential (the chain: k a round; the tree: k - 1).
``--engine N`` also runs the first N prompts through the engine's own ``--mode spd`` at each k
under n_ubatch 1 (at the default scale; with ``--tree``, its trees too, forking at its own gap)
and checks that its text is the target's and its passes those counted here. Each prompt's seed is its index.

    python scripts/sampled_drafts_bench.py -m target.gguf -md draft.gguf \\
        --prompts scripts/data/warm40.jsonl -n 128 --k 4,8,16 --temps 0.8 --scales 0.5,1 --engine 2
    python scripts/sampled_drafts_bench.py -m target.gguf -md draft.gguf -n 128 --k 16 --tree 2,4 --fork-gap 0.5,1
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from fly_cpp import Engine, ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.bench.datasets import load
from fly_cpp.bench.prompting import PromptRenderer
from fly_cpp.backend.sampling import Sampler, draft_sampler
from fly_cpp.drafters.tree import FORK_GAP

CHUNK = 16  # rows with logits per teacher-forced decode (the contexts' bound)


def rows_over(ctx, prompt: Sequence[int], text: Sequence[int]) -> np.ndarray:  # type: ignore[no-untyped-def]
    """(len(text), V) the logits that predict each token of ``text`` after ``prompt``."""
    ctx.truncate(0)
    ctx.decode(list(prompt[:-1]), logits="none")
    feed = [prompt[-1], *text[:-1]]
    out = []
    for lo in range(0, len(feed), CHUNK):
        out.append(np.array(ctx.decode(feed[lo:lo + CHUNK], logits=len(feed[lo:lo + CHUNK]))))
    ctx.truncate(0)
    return np.concatenate(out)


def matches(engine: Engine, prompt: list[int], sampling: SamplingSettings, seed: int, n: int,
            scales: Sequence[float], tree: bool = False) -> tuple[list[int], dict[str, np.ndarray]]:
    """The target's text alone, and by drafting method ("argmax": the draft's argmax, as llama.cpp
    drafts; "shared S": drawn with the target's chain and noise at S times its temperature)
    whether the draft's token equals it at each position. Every method is judged on the same
    text, a sample of the target's own: a draft's agreement does not depend on how the target
    drew it, and the pairing takes the texts' variance out of the comparison. ``tree``: also
    "fork alt" (the draft's second candidate is the target's token) and "fork gap" (the two
    candidates' scores apart), at the default scale."""
    text = engine.generate(prompt, spec=SpecSettings(mode="target"), sampling=sampling, max_tokens=n).run().tokens
    names = ["argmax", *(f"shared {x:g}" for x in scales)]
    if not text:
        return [], {d: np.zeros(0, dtype=bool) for d in names}
    target, draft = engine.target, engine.draft_ctx  # the engine's own contexts, between its generations
    assert draft is not None, "a draft model is needed"
    n_vocab = min(target.model.n_vocab, draft.model.n_vocab)
    rows = rows_over(draft, prompt, text)[:, :n_vocab]
    want = np.asarray(text)
    found = {"argmax": rows.argmax(axis=1) == want}
    for x in scales:
        draws = draft_sampler(dataclasses.replace(sampling, draw="shared", draft_temp_scale=x), seed)
        found[f"shared {x:g}"] = (rows.argmax(axis=1) if draws is None else draws.drafts(rows, prompt, text[:-1])) == want
    if tree:
        draws = draft_sampler(dataclasses.replace(sampling, draw="shared"), seed)
        if draws is not None:
            first, second, gap = candidates(draws, rows, prompt, text)
        else:  # greedy: the draft's two best logits
            first = rows.argmax(axis=1)
            masked = rows.copy()
            masked[np.arange(len(first)), first] = -np.inf
            second = masked.argmax(axis=1)
            gap = rows[np.arange(len(first)), first] - masked[np.arange(len(first)), second]
        assert (first == want).tolist() == found[f"shared {SamplingSettings().draft_temp_scale:g}"].tolist()
        found["fork alt"], found["fork gap"] = second == want, gap
    return text, found


def candidates(draws: Sampler, rows: np.ndarray, prompt: Sequence[int], text: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per position of ``text``: the draft's shared draw there, its runner-up (-1 where only one
    token survives the chain) and the gap between their scores (``Sampler.ranked``), each after
    the target's text before it."""
    ranked = [draws.ranked(rows[i], [*prompt, *text[:i]]) for i in range(len(text))]
    first, second, gap = (np.array(column) for column in zip(*ranked)) if ranked else (np.zeros(0),) * 3
    return first.astype(np.int64), second.astype(np.int64), gap.astype(np.float64)


def tree_passes(match: np.ndarray, alt: np.ndarray, gap: np.ndarray, k: int, branch: int,
                fork_gap: float) -> tuple[int, int, int, int]:
    """(target passes, tokens verified, drafted tokens kept, draft decodes) of spd at a fixed k with
    a tree (``--tree``): ``alt`` says where the draft's second candidate is the target's token."""
    i, n, count, verified, kept, decodes = 0, len(match), 0, 0, 0, 0
    chain = k - 1 - branch
    while i < n:
        fork = next((f for f in range(i, min(i + chain, n)) if gap[f] < fork_gap), None)
        length = k if fork is None else chain
        run = 0
        while run < length and i + run < n and match[i + run]:
            run += 1
        if fork is not None and i + run == fork and fork < n and alt[fork]:  # the branch: its first token, then its draws
            run += 1
            extra = 0
            while extra < branch and i + run < n and match[i + run]:
                run, extra = run + 1, extra + 1
        count += 1
        verified += min(k, n - i)
        decodes += min(k if fork is None else k - 1, n - i)
        kept += run
        i += run + 1
    return count, verified, kept, decodes


def passes(match: np.ndarray, k: int) -> tuple[int, int, int]:
    """(target passes, tokens drafted, drafted tokens kept) of spd at a fixed k over the text."""
    i, n, count, drafted, kept = 0, len(match), 0, 0, 0
    while i < n:
        run = 0
        while run < k and i + run < n and match[i + run]:
            run += 1
        count += 1
        drafted += min(k, n - i)  # what the round drafted (fewer where the text ends)
        kept += run
        i += run + 1
    return count, drafted, kept


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", required=True)
    ap.add_argument("-md", required=True)
    ap.add_argument("--prompts", default="scripts/data/warm40.jsonl")
    ap.add_argument("--limit", type=int, default=0, help="first N prompts of each category (0: all)")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--k", default="4,8,16")
    ap.add_argument("--temps", default="0.8")
    ap.add_argument("--scales", default="1", help="draft temperature scales of the shared draw, one column each")
    ap.add_argument("--tree", default="", help="judge trees whose branch drafts B tokens after its fork, a column per B (B,B,..)")
    ap.add_argument("--fork-gap", default="1", help="a tree forks where the draft's two candidates lie within this many nats (G,G,..)")
    ap.add_argument("--engine", type=int, default=0, help="check the first N prompts against the engine's own spd")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    prompts = load(a.prompts).prompts
    if a.limit:
        by: dict[str, list] = defaultdict(list)
        for p in prompts:
            by[p.category].append(p)
        prompts = [p for p in prompts if p in by[p.category][: a.limit]]
    ks, temps = [int(k) for k in a.k.split(",")], [float(t) for t in a.temps.split(",")]
    default = SamplingSettings().draft_temp_scale
    scales = sorted({float(x) for x in a.scales.split(",")} | {default})
    sums: dict[tuple[float, int, str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    decodes: dict[tuple[float, int, str, str], int] = defaultdict(int)  # the draft's decodes, for its cost
    trees = [(int(b), float(g)) for b in a.tree.split(",") if b for g in a.fork_gap.split(",")]
    tree_names = {shape: f"tree 1+{shape[0]} at {shape[1]:g}" for shape in trees}
    records, checks = [], []
    settings = {"n_ctx": 4096, "n_ubatch": 1}  # verification exact (a batch's rows as one-row decodes)
    with Engine(ModelSettings(a.m, **settings), ModelSettings(a.md, **settings), branches=bool(trees)) as e:
        renderer = PromptRenderer(e)
        for i, p in enumerate(prompts):
            tokens = renderer.render(p.text).tokens
            for t in temps:
                s = SamplingSettings(temperature=t, seed=i)
                text, found = matches(e, tokens, s, i, a.n, scales, tree=bool(trees))
                forks = (found.pop("fork alt"), found.pop("fork gap")) if trees else None
                for method, match in found.items():
                    records.append({"prompt": p.id, "category": p.category, "T": t, "draw": method,
                                    "match": match.astype(int).tolist()})
                    if forks is not None and method == f"shared {default:g}":  # what a tree's judgement reads
                        records[-1].update(alt=forks[0].astype(int).tolist(), gap=[min(float(g), 1e9) for g in forks[1]])
                    for k in ks:
                        count, drafted, kept = passes(match, k)
                        row = sums[(t, k, method, p.category)]
                        for j, v in enumerate((len(text), count, drafted, kept)):
                            row[j] += v
                        decodes[(t, k, method, p.category)] += drafted
                if forks is not None:
                    for k in ks:
                        for (branch, fork_gap), name in tree_names.items():
                            count, verified, kept, used = tree_passes(found[f"shared {default:g}"], *forks, k, branch, fork_gap)
                            row = sums[(t, k, name, p.category)]
                            for j, v in enumerate((len(text), count, verified, kept)):
                                row[j] += v
                            decodes[(t, k, name, p.category)] += used
                if i < a.engine:  # the engine drafting each way, on the text it writes that way
                    for draw, method in (("llama", "argmax"), ("shared", f"shared {default:g}")):
                        own = dataclasses.replace(s, draw=draw)
                        own_text, own_found = matches(e, tokens, own, i, a.n, ()) if draw == "llama" else (text, found)
                        for k in ks:
                            count = passes(own_found[method], k)[0]
                            g = e.generate(tokens, spec=SpecSettings(mode="spd", k=k, ngram=False), sampling=own,
                                           max_tokens=a.n).run()
                            checks.append((g.tokens == own_text, g.stats.n_passes == count, p.id, t, draw, k,
                                           g.stats.n_passes, count))
                    for k in ks:  # the engine's trees (``--draft-tree``), which fork at its own gap
                        for branch in sorted({b for b, _ in trees if k > b + 1}):
                            count = tree_passes(found[f"shared {default:g}"], *forks, k, branch, FORK_GAP)[0]
                            g = e.generate(tokens, spec=SpecSettings(mode="spd", k=k, ngram=False, draft_tree=branch),
                                           sampling=s, max_tokens=a.n).run()
                            checks.append((g.tokens == text, g.stats.n_passes == count, p.id, t, f"tree 1+{branch}", k,
                                           g.stats.n_passes, count))
            print(f"{i + 1}/{len(prompts)} {p.id}", flush=True)
    methods = ["argmax", *(f"shared {x:g}" for x in scales), *tree_names.values()]
    print("\nTokens per target pass (kept of drafted), and each shared scale's (and the tree's) ratio to the draft's argmax:\n")
    print("| T | k | prompts | " + " | ".join(methods) + " |")
    print("|---|---|---|" + "---|" * len(methods))
    cats = sorted({p.category for p in prompts}) + ["all"]
    for t in temps:
        for k in ks:
            for c in cats:
                def tot(method: str) -> list[int]:
                    keys = [key for key in sums if key[:3] == (t, k, method) and (c == "all" or key[3] == c)]
                    return [sum(sums[key][j] for key in keys) for j in range(4)]
                cells, base = [], None
                for m in methods:
                    x = tot(m)
                    tpp, kept = x[0] / max(x[1], 1), x[3] / max(x[2], 1)
                    base = tpp if base is None else base
                    cells.append(f"{tpp:.3f} ({kept:.3f})" + ("" if m == "argmax" else f" {tpp / base:.3f}x"))
                print(f"| {t} | {k} | {c} | " + " | ".join(cells) + " |")
    if trees:
        print("\nDraft decodes a kept token (drafting's cost where decodes are sequential):\n")
        print("| T | k | " + " | ".join(methods) + " |")
        print("|---|---|" + "---|" * len(methods))
        for t in temps:
            for k in ks:
                cells = []
                for m in methods:
                    keys = [key for key in sums if key[:3] == (t, k, m)]
                    cells.append(f"{sum(decodes[key] for key in keys) / max(sum(sums[key][3] for key in keys), 1):.3f}")
                print(f"| {t} | {k} | " + " | ".join(cells) + " |")
    for t in temps:
        share = {}
        for m in methods[: len(methods) - len(trees)]:
            rs = [r for r in records if r["T"] == t and r["draw"] == m]
            share[m] = sum(sum(r["match"]) for r in rs) / max(sum(len(r["match"]) for r in rs), 1)
        print(f"\nT {t}: the draft's token is the target's at " + ", ".join(f"{v:.3f} ({m})" for m, v in share.items())
              + " of positions")
    if checks:
        same, counted = sum(c[0] for c in checks), sum(c[1] for c in checks)
        print(f"\nengine's spd (n_ubatch 1, no n-gram) on {a.engine} prompts x {len(temps)} T x {len(ks)} k, each draw"
              f"{' and tree' if trees else ''}: "
              f"text == target alone {same}/{len(checks)}, passes == counted here {counted}/{len(checks)}")
        for c in checks:
            if not (c[0] and c[1]):
                print("  differs:", c[2:])
    if a.out:
        with open(a.out, "w") as f:
            json.dump(records, f)


if __name__ == "__main__":
    main()
