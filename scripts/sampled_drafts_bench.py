"""How often sampled drafts keep: the draft's argmax (llama.cpp's draw) against the draft drawing
with the target's own chain and noise (the shared draw), at fixed k and several temperatures.

No clock: per configuration, tokens per target pass (what a pass yields, the gain where a
pass's rows are nearly free, as on a GPU) and the share of drafted tokens the target kept.
Lossless (``--mode spd``), so every emitted token is the target's own draw; ``--check N`` also
runs the first N prompts with ``--mode target`` under n_ubatch 1 and says whether each text
equals the speculative one with the same seed. Configurations are interleaved per prompt; each
prompt's seed is its index.

    python scripts/sampled_drafts_bench.py -m target.gguf -md draft.gguf \\
        --prompts scripts/data/warm40.jsonl -n 128 --k 16 --temps 0.8
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from fly_cpp import Engine, ModelSettings, SamplingSettings, SpecSettings
from fly_cpp.bench.datasets import load
from fly_cpp.bench.prompting import PromptRenderer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", required=True)
    ap.add_argument("-md", required=True)
    ap.add_argument("--prompts", default="scripts/data/warm40.jsonl")
    ap.add_argument("--limit", type=int, default=0, help="first N prompts of each category (0: all)")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--k", default="16")
    ap.add_argument("--temps", default="0.8")
    ap.add_argument("--check", type=int, default=0)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    prompts = load(a.prompts).prompts
    if a.limit:
        seen: dict[str, int] = defaultdict(int)
        chosen = []
        for p in prompts:
            if seen[p.category] < a.limit:
                seen[p.category] += 1
                chosen.append(p)
        prompts = chosen
    ks, temps = [int(k) for k in a.k.split(",")], [float(t) for t in a.temps.split(",")]
    configs = [(t, k, draw) for t in temps for k in ks for draw in ("llama", "shared")]
    sums: dict[tuple[float, int, str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    records = []
    with Engine(ModelSettings(a.m, n_ctx=4096), ModelSettings(a.md, n_ctx=4096)) as e:
        renderer = PromptRenderer(e)
        for i, p in enumerate(prompts):
            tokens = renderer.render(p.text).tokens
            for j in range(len(configs)):
                t, k, draw = configs[(i + j) % len(configs)]  # rotate which runs first
                s = SamplingSettings(temperature=t, seed=i, draw=draw)
                g = e.generate(tokens, spec=SpecSettings(mode="spd", k=k), sampling=s, max_tokens=a.n).run()
                st = g.stats
                row = sums[(t, k, draw, p.category)]
                for n, v in enumerate((st.n_tokens, st.n_passes, st.n_drafted, st.n_exact)):
                    row[n] += v
                records.append({"prompt": p.id, "category": p.category, "T": t, "k": k, "draw": draw,
                                "tokens": st.n_tokens, "passes": st.n_passes, "drafted": st.n_drafted,
                                "kept": st.n_exact, "text": g.text})
            print(f"{i + 1}/{len(prompts)} {p.id}", flush=True)
    print("\n| T | k | category | draft's argmax: tokens/pass | kept | shared draw: tokens/pass | kept | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    cats = sorted({p.category for p in prompts}) + ["all"]
    for t in temps:
        for k in ks:
            for c in cats:
                def tot(draw: str) -> list[int]:
                    keys = [key for key in sums if key[:3] == (t, k, draw) and (c == "all" or key[3] == c)]
                    return [sum(sums[key][n] for key in keys) for n in range(4)]
                lo, sh = tot("llama"), tot("shared")
                tpp = [x[0] / x[1] for x in (lo, sh)]
                kept = [x[3] / max(x[2], 1) for x in (lo, sh)]
                print(f"| {t} | {k} | {c} | {tpp[0]:.3f} | {kept[0]:.3f} | {tpp[1]:.3f} | {kept[1]:.3f} | "
                      f"{tpp[1] / tpp[0]:.3f} |")
    if a.check:
        same = []
        with Engine(ModelSettings(a.m, n_ctx=4096, n_ubatch=1), ModelSettings(a.md, n_ctx=4096, n_ubatch=1)) as e:
            renderer = PromptRenderer(e)
            for i, p in enumerate(prompts[: a.check]):
                tokens = renderer.render(p.text).tokens
                t, k = temps[0], ks[-1]
                s = SamplingSettings(temperature=t, seed=i, draw="shared")
                ref = e.generate(tokens, spec=SpecSettings(mode="target"), sampling=s, max_tokens=a.n).run().text
                spec = e.generate(tokens, spec=SpecSettings(mode="spd", k=k), sampling=s, max_tokens=a.n).run().text
                same.append(ref == spec)
        print(f"\nn_ubatch 1, T {temps[0]}, k {ks[-1]}, shared draw: spd text == target text on "
              f"{sum(same)}/{len(same)} prompts")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(records, f)


if __name__ == "__main__":
    main()
