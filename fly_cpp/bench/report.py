"""A benchmark's results on disk: results.json (every record + summary), summary.md, PNG plots.

results.json is replaced atomically (written beside, then renamed), so a run killed while
writing it leaves the previous complete file; ``read`` loads it back for ``--resume``.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from fly_cpp.errors import FlyError

COLUMNS = [  # (header, key, format)
    ("mode", "mode", "{}"),
    ("tok/s", "tokens_per_second", "{:.1f}"),
    ("speedup (geo)", "speedup_geomean", "{:.2f}x"),
    ("speedup (med)", "speedup_median", "{:.2f}x"),
    ("ideal", "ideal_speedup_geomean", "{:.2f}x"),
    ("mean acc.", "mean_accepted", "{:.2f}"),
    ("exact", "n_exact", "{}"),
    ("loose", "n_loose", "{}"),
    ("gate rej.", "n_gate_rejected", "{}"),
    ("guard rej.", "n_guard_rejected", "{}"),
    ("draft ms/rd", "draft_ms_per_round", "{:.2f}"),
    ("target ms/rd", "target_ms_per_round", "{:.2f}"),
    ("host ms/rd", "host_ms_per_round", "{:.3f}"),
    ("host %", "host_share", "{:.1%}"),
    ("agree", "agreement", "{:.3f}"),
    ("identical", "identical", "{:.0%}"),
    ("1st div. (med)", "first_divergence_median", "{:g}"),
    ("NLL", "nll", "{:.3f}"),
    ("NLL / target", "nll_ratio", "{:.3f}"),
    ("cut", "cut", "{:.0%}"),
    ("accuracy", "accuracy", "{:.1%}"),
    ("won", "won", "{}"),
    ("lost", "lost", "{}"),
    ("sign p", "sign_p", "{:.3f}"),
]


def _cell(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return fmt.format(value)


def markdown(result: dict[str, Any]) -> str:
    rows = result["summary"]
    cols = [c for c in COLUMNS if any(r.get(c[1]) is not None for r in rows)]
    meta = result["meta"]
    lines = [
        f"# fly-cpp bench: {meta['dataset']}",
        "",
        f"target `{meta['target']}`, draft `{meta['draft']}`; {meta['n_prompts']} prompts, "
        f"max {meta['max_tokens']} tokens, k = {', '.join(map(str, meta['k']))}, "
        f"{'chat template' if meta['templated'] else 'raw prompts'}, temperature {meta['temperature']:g}"
        f"{', system message' if meta.get('system') else ''}{'' if meta.get('complete', True) else ' (partial run)'}.",
        "",
        "| " + " | ".join(c[0] for c in cols) + " |",
        "|" + "|".join("---" for _ in cols) + "|",
    ]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r.get(key), fmt) for _, key, fmt in cols) + " |")
    paired = [r for r in rows if r.get("n_paired")]
    if paired:
        lines += ["", "Task correctness against the target, problem by problem: " + "; ".join(
            f"{r['mode']} won {r['won']}, lost {r['lost']} of {r['n_paired']} (sign test p = {r['sign_p']:.3f})"
            for r in paired) + "."]
    if result.get("comparisons"):
        lines += ["", "fly-cpp vs llama.cpp (tokens/s ratio per prompt, geometric mean):", ""]
        for c in result["comparisons"]:
            lines.append(f"- {c['ours']} / {c['peer']}: {_cell(c['tokens_per_second_ratio'], '{:.3f}')}")
    lines += [
        "",
        "speedup: tokens/s over `target` on the same prompt (geometric mean, median). ideal: the speedup "
        "the measured acceptance would give with no host time. mean acc.: tokens per target forward pass. "
        "host: loop time outside the draft and target forward passes. agree: share of positions where the "
        "output equals the target's; identical: share of prompts with the target's exact output; NLL: the "
        "target's mean negative log-likelihood of the output (nats/token). llama.cpp rows: their decode speed "
        "(model loading and prompt excluded); identical there compares text (its output starts as the target's). "
        "cut: outputs that ended on the token budget. won / lost: problems this mode passed and the target "
        "failed / the other way round; sign p: two-sided exact sign test on won vs lost.",
        "",
    ]
    return "\n".join(lines)


def plots(result: dict[str, Any], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    cats = result["by_category"]
    modes = [r["mode"] for r in result["summary"] if r["mode"] != "target"]
    if cats and modes:
        fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(cats) * max(1, len(modes)) / 2 + 3), 4))
        width = 0.8 / len(modes)
        names = sorted(cats)
        for j, mode in enumerate(modes):
            values = [cats[c].get(mode) or 0.0 for c in names]
            ax.bar([i + j * width for i in range(len(names))], values, width, label=mode)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names, rotation=30, ha="right")
        ax.set_ylabel("speedup over target (geometric mean)")
        ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(out / "speedup_by_category.png", dpi=100)
        plt.close(fig)
        written.append("speedup_by_category.png")
    hists = [(r["mode"], r["accepted_length_histogram"]) for r in result["summary"]
             if r.get("accepted_length_histogram") and r["mode"] != "target"]
    if hists:
        fig, axes = plt.subplots(len(hists), 1, figsize=(6, 1.8 * len(hists) + 0.6), squeeze=False)
        top = max(int(k) for _, h in hists for k in h)
        for ax, (mode, h) in zip(axes[:, 0], hists):
            ax.bar([int(k) for k in h], list(h.values()))
            ax.set_xlim(0.5, top + 0.5)
            ax.set_ylabel(mode)
        axes[-1, 0].set_xlabel("tokens per round (accepted + correction/bonus)")
        fig.tight_layout()
        fig.savefig(out / "accepted_lengths.png", dpi=100)
        plt.close(fig)
        written.append("accepted_lengths.png")
    return written


def write(result: dict[str, Any], out: Path, *, with_plots: bool = True) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    files = ["results.json", "summary.md"]
    if with_plots:
        files += plots(result, out)
    result["meta"]["files"] = files
    _replace(out / "results.json", json.dumps(result, indent=1, allow_nan=False, default=_json_default) + "\n")
    _replace(out / "summary.md", markdown(result))
    return files


def read(out: Path) -> dict[str, Any] | None:
    """The results.json of an earlier run in ``out`` (None when there is none)."""
    path = out / "results.json"
    if not path.exists():
        return None
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FlyError(f"--resume: cannot read {path}: {e}") from None
    if not isinstance(result, dict) or not isinstance(result.get("records"), list) or "meta" not in result:
        raise FlyError(f"--resume: {path} is not a fly-cpp bench results file")
    return result


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} to JSON")
