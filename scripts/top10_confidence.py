"""How far a draft's confidence over its 10 likeliest tokens is from its confidence over the whole
softmax, on real text.

A sampler on the device (llama.cpp's ``--spec-draft-backend-sampling``) hands the host the 10
likeliest tokens of a draft row, not the row, so a confidence taken from them is the top
probability renormalised over those 10. fly-cpp's is over the full softmax (``rows.top_probability``).
This reads the draft model's rows along the given texts (teacher-forced, every position) and
compares the two: k auto's tenth bins, and p-min decisions at a few cut-offs.

    python scripts/top10_confidence.py DRAFT.gguf [--texts scripts/data/warm40.jsonl] [--limit 20]
        [--tokens 400]
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from fly_cpp.backend.context import Context
from fly_cpp.backend.model import Model
from fly_cpp.basics.errors import FlyError
from fly_cpp.kauto.evidence import BINS
from fly_cpp.backend.rows import top_probability_numpy

TOP = 10  # llama.cpp's draft sampler keeps this many on the device


def confidences(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, V) logits -> (full softmax top probability, exact; top probability over the TOP likeliest)."""
    return top_probability_numpy(rows), top_probability_numpy(np.sort(rows, axis=1)[:, -TOP:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("draft")
    ap.add_argument("--texts", default="scripts/data/warm40.jsonl", help="JSON lines with a 'prompt' text each")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=400, help="positions read per text, at most")
    args = ap.parse_args()
    with open(args.texts, encoding="utf-8") as f:
        texts = [json.loads(line)["prompt"] for line in f if line.strip()][: args.limit]
    full, top = [], []
    with Model(args.draft) as model, Context(model, n_ctx=args.tokens + 8, n_threads=2) as ctx:
        for text in texts:
            tokens = model.tokenize(text)[: args.tokens]
            ctx.truncate(0)
            rows = ctx.decode(tokens, logits="all")
            if rows is None:
                continue
            a, b = confidences(np.asarray(rows))
            full.append(a)
            top.append(b)
    pf, pt = np.concatenate(full), np.concatenate(top)
    same = (np.minimum((pf * BINS).astype(int), BINS - 1) == np.minimum((pt * BINS).astype(int), BINS - 1)).mean()
    print(f"{len(pf)} positions of {len(full)} texts; mean confidence: full {pf.mean():.3f}, top {TOP} {pt.mean():.3f}")
    print(f"the same tenth bin: {same:.3f}; top {TOP} - full, quantiles 50/90/99: "
          + " / ".join(f"{q:.4f}" for q in np.quantile(pt - pf, [0.5, 0.9, 0.99])))
    for cut in (0.5, 0.75, 0.9):
        print(f"p-min {cut}: a draft goes on at {(pf >= cut).mean():.3f} of positions (full), "
              f"{(pt >= cut).mean():.3f} (top {TOP}); they disagree at {((pf >= cut) != (pt >= cut)).mean():.3f}")


if __name__ == "__main__":
    try:
        main()
    except (FlyError, OSError) as e:  # a missing model or texts file: one line, not a traceback
        raise SystemExit(f"top10_confidence: {e}") from None
