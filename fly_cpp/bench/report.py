"""A benchmark's results on disk: results.json (every record + summary), summary.md, PNG plots.

results.json is replaced atomically (written beside, then renamed), so a run killed while
writing it leaves the previous complete file; ``read`` loads it back for ``--resume``.
"""

from __future__ import annotations

import json
import math
import os
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fly_cpp.basics.errors import FlyError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLUMNS = [  # (header, key, format): summary.md's table, every number
    ("mode", "mode", "{}"),
    ("tok/s", "tokens_per_second", "{:.1f}"),
    ("speedup (geo)", "speedup_geomean", "{:.2f}x"),
    ("speedup (med)", "speedup_median", "{:.2f}x"),
    ("ideal", "ideal_speedup_geomean", "{:.2f}x"),
    ("mean acc.", "mean_accepted", "{:.2f}"),
    ("tok/pass", "tokens_per_pass", "{:.2f}"),
    ("exact", "n_exact", "{}"),
    ("loose", "n_loose", "{}"),
    ("gate rej.", "n_gate_rejected", "{}"),
    ("guard rej.", "n_guard_rejected", "{}"),
    ("draft ms/rd", "draft_ms_per_round", "{:.2f}"),
    ("target ms/rd", "target_ms_per_round", "{:.2f}"),
    ("host ms/rd", "host_ms_per_round", "{:.3f}"),
    ("host %", "host_share", "{:.1%}"),
    ("rollback ms/rd", "rollback_ms_per_round", "{:.3f}"),
    ("rollback %", "rollback_share", "{:.1%}"),
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
WIDTH = 100  # the terminal's text fits this many columns
# the terminal's table: the headline numbers, narrow enough for WIDTH columns (the rest: summary.md)
TERMINAL = ("mode", "tok/s", "speedup (geo)", "mean acc.", "exact", "loose", "agree", "NLL / target", "accuracy")
LEGEND = ("speedup: tokens/s over `target` on the same prompt (geometric mean, median). ideal: the speedup the "
          "measured acceptance would give with no host time. mean acc.: tokens per round (a round: a target forward "
          "pass; a first token from the prompt's own pass counts as a round too, which fly does not have where its "
          "first round verifies the first token, a loose accept possible there). tok/pass: tokens per target pass "
          "after the prompt (compare fly with spd by this). host: "
          "loop time outside the draft and target forward passes. rollback: on recurrent and hybrid models, the time "
          "spent taking caches back (state copies, restores, catch-up decodes of their own), per round and as a share "
          "of the decoding time. agree: share of positions where the output "
          "equals the target's; identical: share of prompts with the target's exact output; NLL: the target's "
          "mean negative log-likelihood of the output (nats/token). cut: outputs that ended on the token budget. "
          "won / lost: problems this mode passed and the target failed / the other way round; sign p: the "
          "two-sided exact sign test on won vs lost.")
PEER_LEGEND = (" llama.cpp rows: their decode speed (model loading and prompt excluded); identical there compares "
               "text (its output starts as the target's).")


def _cell(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return fmt.format(value)


def _table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> list[str]:
    cols = [c for c in columns if any(r.get(c[1]) is not None for r in rows)]
    lines = ["| " + " | ".join(c[0] for c in cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r.get(key), fmt) for _, key, fmt in cols) + " |")
    return lines


def _head(result: dict[str, Any]) -> list[str]:
    meta = result["meta"]
    return [
        f"# fly-cpp bench: {meta['dataset']}",
        "",
        f"target `{meta['target']}`, draft `{meta['draft']}`; {meta['n_prompts']} prompts, "
        f"max {meta['max_tokens']} tokens, k = {', '.join(map(str, meta['k']))}, "
        f"{'chat template' if meta['templated'] else 'raw prompts'}, temperature {meta['temperature']:g}"
        f"{', system message' if meta.get('system') else ''}"
        + "".join(f"; {who} on rpc-servers {', '.join(meta[key])}"
                  for who, key in (("target", "rpc"), ("draft", "draft_rpc")) if meta.get(key))
        + f"{'' if meta.get('complete', True) else ' (partial run)'}.",
        "",
    ]


def _has_peer(result: dict[str, Any]) -> bool:
    return any(r.get("peer") for r in result["summary"])


def notes(result: dict[str, Any]) -> list[str]:
    """Findings about the run as a whole, under the table (here and in summary.md)."""
    lines = []
    paired = [r for r in result["summary"] if r.get("n_paired")]
    if paired:
        lines += ["", "Task correctness against the target, problem by problem (won / lost, sign test):", ""]
        lines += [f"- {r['mode']}: won {r['won']}, lost {r['lost']} of {r['n_paired']}, p = {r['sign_p']:.3f}"
                  for r in paired]
    rows = {r["mode"]: r for r in result["summary"]}
    target = rows.get("target")
    slow = [r for r in result["summary"] if not r["peer"] and r["mode"] != "target"
            and (r.get("speedup_geomean") or 1.0) < 1.0]
    if slow and target and target.get("target_ms_per_round"):
        lines += ["", "Slower than the target alone, measured:", ""]
        for r in slow:
            lines.append(f"- {r['mode']}: {r['speedup_geomean']:.2f}x. {slower_reason(r, target)}")
    for r in (r for r in result["summary"] if r.get("k") == "auto"):
        hist = ", ".join(f"{k}: {v}" for k, v in (r.get("draft_length_histogram") or {}).items())
        lines += ["", f"{r['mode']} (k auto) drafted per round (length: rounds): {hist}"]
    hybrid = [r for r in result["summary"] if r.get("rollback_ways")]
    if hybrid:
        lines += ["", "Rollbacks of the recurrent caches (state copies, restores, catch-up decodes of their own):", ""]
        for r in hybrid:
            ways = ", ".join(f"{role} by {way}" for role, way in r["rollback_ways"].items())
            lines.append(f"- {r['mode']}: {ways}; {r['rollbacks']} rollbacks, "
                         f"{_cell(r.get('rollback_ms_each'), '{:.3f}')} ms each, "
                         f"{_cell(r.get('rollback_ms_per_round'), '{:.3f}')} ms a round "
                         f"({_cell(r.get('rollback_share'), '{:.1%}')} of the decoding time)")
    if result.get("comparisons"):
        lines += ["", "fly-cpp vs llama.cpp (tokens/s ratio per prompt, geometric mean):", ""]
        for c in result["comparisons"]:
            best = " (llama.cpp's best here)" if c.get("best") else ""
            lines.append(f"- {c['ours']} / {c['peer']}{best}: {_cell(c['tokens_per_second_ratio'], '{:.3f}')}")
    return lines


def slower_reason(row: dict[str, Any], target: dict[str, Any]) -> str:
    """Why a mode was slower than the target, from the bench's own per-round times."""
    t1 = target["target_ms_per_round"]  # the target alone: one decode per token
    drafted = row.get("mean_draft_length") or 0.0
    per_draft = row["draft_ms_per_round"] / drafted if drafted else 0.0
    verify = row["target_ms_per_round"]
    return (f"A round spent {row['draft_ms_per_round']:.1f} ms drafting ({per_draft / t1:.2f} of a target "
            f"token per drafted token) and {verify:.1f} ms verifying {drafted + 1:.1f} rows "
            f"({verify / t1:.1f} target tokens) for {row['mean_accepted']:.2f} tokens. "
            + ("k auto was trying whether drafting pays on these texts: more tokens let it settle; a cheaper "
               "draft, or the target alone (--mode target)." if row.get("k") == "auto" else
               "Try k auto (it drafts only where that pays), a cheaper draft, or the target alone."))


def markdown(result: dict[str, Any]) -> str:
    """summary.md: every column, the notes and the legend."""
    legend = LEGEND + (PEER_LEGEND if _has_peer(result) else "")
    return "\n".join([*_head(result), *_table(result["summary"], COLUMNS), *notes(result), "", legend, ""])


def terminal(result: dict[str, Any]) -> str:
    """What ``fly-cpp bench`` prints: the headline columns and the notes (details: summary.md)."""
    cols = [c for c in COLUMNS if c[0] in TERMINAL]
    legend = ("speedup: tokens/s over `target` on the same prompt; mean acc.: tokens per round (a first token from "
              "the prompt's pass counts as one); "
              "agree: share of positions equal to the target's output. Every column and its meaning: summary.md.")
    lines = [*_head(result), *_table(result["summary"], cols), *notes(result), "", legend, ""]
    return "\n".join(textwrap.fill(line, WIDTH) if not line.startswith("|") else line for line in lines)


def _title(result: dict[str, Any], what: str) -> str:
    meta = result["meta"]
    return (f"{what}: {meta['dataset']}, {meta['n_prompts']} prompts, max {meta['max_tokens']} tokens\n"
            f"target {meta['target']}, draft {meta['draft'] or 'none (n-gram lookup)'}")


def _save(fig: Figure, path: Path, title: str) -> None:
    """Title on the figure, and in the PNG's metadata (what tests and other tools read back)."""
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Title": title, "Software": "fly-cpp bench"})


def plots(result: dict[str, Any], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    written = []
    cats = result["by_category"]
    modes = [r["mode"] for r in result["summary"] if r["mode"] != "target"]
    if cats and modes:
        fig, ax = plt.subplots(figsize=(max(7.0, 0.9 * len(cats) * max(1, len(modes)) / 2 + 3), 4.6))
        width = 0.8 / len(modes)
        names = sorted(cats)
        for j, mode in enumerate(modes):
            values = [cats[c].get(mode) or 0.0 for c in names]
            ax.bar([i + j * width for i in range(len(names))], values, width, label=mode)
        top = max([1.0, *(v or 0.0 for c in names for v in cats[c].values())])
        ax.set_ylim(0, 1.2 * top)
        ax.axhline(1.0, color="black", linewidth=0.9, linestyle="--")
        ax.annotate("1.0x: the target alone", (0.0, 1.0), xycoords=("axes fraction", "data"), xytext=(4, 3),
                    textcoords="offset points", ha="left", va="bottom", fontsize="small")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names, rotation=30, ha="right")
        ax.set_ylabel("speedup over target (geometric mean)")
        ax.legend(fontsize="small", loc="upper right", ncols=len(modes))
        _save(fig, out / "speedup_by_category.png", _title(result, "Speedup by category"))
        plt.close(fig)
        written.append("speedup_by_category.png")
    hists = [(r["mode"], r["accepted_length_histogram"], r.get("accepted_length_histogram_loose") or {})
             for r in result["summary"] if r.get("accepted_length_histogram") and r["mode"] != "target"]
    if hists:
        fig, axes = plt.subplots(len(hists), 1, figsize=(7, 1.9 * len(hists) + 1.2), squeeze=False)
        top = max(int(k) for _, h, _ in hists for k in h)
        for ax, (mode, h, loose) in zip(axes[:, 0], hists):
            lengths = [int(k) for k in h]
            with_loose = [loose.get(k, 0) for k in h]
            exact_only = [n - m for n, m in zip(h.values(), with_loose)]
            ax.bar(lengths, exact_only, color="tab:green", label="exact matches only")
            if any(with_loose):
                ax.bar(lengths, with_loose, bottom=exact_only, color="gold", label="with a loose accept")
            ax.set_xlim(0.5, top + 0.5)
            ax.set_ylim(0, 1.35 * max(h.values()))  # room for the legend above the bars
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylabel(f"{mode}\nrounds")
            ax.legend(fontsize="x-small", loc="upper center", ncols=2)
        axes[-1, 0].set_xlabel("tokens per round (accepted + correction/bonus)")
        _save(fig, out / "accepted_lengths.png", _title(result, "Tokens per round"))
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


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


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
