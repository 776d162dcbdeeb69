"""From per-prompt records to one summary row per mode.

Speedup is a ratio per prompt (a mode's tokens/s over the target's on the same prompt), then
their median and geometric mean. Times per round split a round into draft, target and host
(Python bookkeeping: everything in the loop outside the two models' forward passes).

Ideal speedup: what the measured acceptance would give with no host time at all, from the
measured forward-pass times: ideal tokens/s = tokens / (draft + target seconds), over the
target-only mode's forward-only speed (tokens / forward seconds) on the same prompt. Runtime
efficiency = speedup / ideal speedup: how close the runtime gets to its own limit.

Task correctness is also compared problem by problem with the target (``paired``): problems won
and lost, and the two-sided exact sign test. ``cut``: the share of outputs that ended on the
token budget rather than by themselves (a checker may then fail an answer that was on its way).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from fly_cpp.bench import paired
from fly_cpp.bench.modes import REFERENCE


def geomean(values: Iterable[float]) -> float | None:
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def add_ratios(records: list[dict[str, Any]]) -> None:
    """Per record: speedup over the target on the same prompt (and, for fly-cpp modes, the
    ideal speedup); for peer records also the speedup over llama.cpp's own target-only run."""
    ref = {r["prompt_id"]: r["stats"] for r in records if r["mode"] == REFERENCE}
    peer_ref = {r["prompt_id"]: r["stats"] for r in records if r["mode"] == "llama.cpp-target"}
    for r in records:
        s, t = r["stats"], ref.get(r["prompt_id"])
        if t is None:
            continue
        r["speedup"] = _ratio(s["tokens_per_second"], t["tokens_per_second"])
        if not r.get("peer"):
            forward = s["draft_seconds"] + s["target_seconds"]
            ideal_tps = s["n_tokens"] / forward if forward > 0 else None
            t_forward = t["draft_seconds"] + t["target_seconds"]  # its "draft" time: the empty-draft call
            target_forward_tps = t["n_tokens"] / t_forward if t_forward > 0 else None
            r["ideal_speedup"] = _ratio(ideal_tps, target_forward_tps)
        elif r["prompt_id"] in peer_ref:
            r["speedup_vs_peer_target"] = _ratio(s["tokens_per_second"], peer_ref[r["prompt_id"]]["tokens_per_second"])


def _mode_summary(recs: list[dict[str, Any]], ref_nll: dict[str, float], ref_passed: dict[str, bool]) -> dict[str, Any]:
    stats = [r["stats"] for r in recs]
    total = lambda key: sum(s.get(key, 0) or 0 for s in stats)  # noqa: E731
    n_tokens, seconds, rounds = total("n_tokens"), total("seconds"), total("n_rounds")
    out: dict[str, Any] = {
        "mode": recs[0]["mode"], "k": recs[0].get("k"), "peer": bool(recs[0].get("peer")), "n_prompts": len(recs),
        "n_tokens": n_tokens, "seconds": seconds,
        "tokens_per_second": n_tokens / seconds if seconds > 0 else None,
        "speedup_median": median(r.get("speedup") for r in recs),
        "speedup_geomean": geomean(r.get("speedup") for r in recs),
        "n_rounds": rounds, "mean_accepted": (n_tokens + total("n_eog")) / rounds if rounds else None,
        # per target pass after the prompt (``Stats.n_passes``; a peer's rounds are such passes already)
        "tokens_per_pass": _ratio(n_tokens + total("n_eog"),
                                  sum(s.get("n_passes", s.get("n_rounds", 0)) for s in stats)),
        "n_drafted": total("n_drafted"),
    }
    if out["peer"]:
        accepted = total("n_accept")
        same = [r["same_start_as_target"] for r in recs if "same_start_as_target" in r]
        out.update(n_accepted=accepted, accept_rate=accepted / out["n_drafted"] if out["n_drafted"] else None,
                   n_exact=accepted, n_loose=0,  # exact-match acceptance only
                   identical=sum(same) / len(same) if same else None,  # from text: its output starts as the target's
                   speedup_vs_peer_target_geomean=geomean(r.get("speedup_vs_peer_target") for r in recs))
        if not rounds:
            out["mean_accepted"] = None
        return out
    draft_s, target_s = total("draft_seconds"), total("target_seconds")
    host_s = total("host_seconds")
    per_round = lambda x: 1000.0 * x / rounds if rounds else None  # noqa: E731
    hist = Counter(n for s in stats for n in s.get("accepted_lengths", []))
    drafts: Counter[int] = Counter()
    for s in stats:
        drafts.update({int(k): v for k, v in (s.get("draft_lengths") or {}).items()})
    loose = Counter(s["accepted_lengths"][r - 1] for s in stats for r in s.get("loose_rounds", []))
    nll = mean(r.get("nll") for r in recs)
    out.update(
        n_exact=total("n_exact"), n_loose=total("n_loose"), n_gate_rejected=total("n_gate_rejected"),
        n_guard_rejected=total("n_guard_rejected"),
        draft_ms_per_round=per_round(draft_s), target_ms_per_round=per_round(target_s),
        host_ms_per_round=per_round(host_s), host_share=host_s / seconds if seconds > 0 else None,
        ideal_speedup_geomean=geomean(r.get("ideal_speedup") for r in recs),
        agreement=mean(r.get("agreement") for r in recs),
        identical=mean(float(r["first_divergence"] is None) for r in recs if "first_divergence" in r),
        first_divergence_median=median(r.get("first_divergence") for r in recs if r.get("first_divergence") is not None),
        nll=nll, nll_ratio=_ratio(mean(r.get("nll") for r in recs if r["prompt_id"] in ref_nll),
                                  mean(ref_nll[r["prompt_id"]] for r in recs if r["prompt_id"] in ref_nll)),
        accepted_length_histogram={str(k): hist[k] for k in sorted(hist)},
        accepted_length_histogram_loose={str(k): loose[k] for k in sorted(loose)},  # rounds with a loose accept
        draft_length_histogram={str(k): drafts[k] for k in sorted(drafts)},  # tokens drafted -> rounds
        mean_draft_length=total("n_drafted") / rounds if rounds else None,
    )
    out["efficiency"] = _ratio(out["speedup_geomean"], out["ideal_speedup_geomean"])
    out.update(_rollbacks(stats, rounds, seconds))
    ends = [r["finish_reason"] for r in recs if r.get("finish_reason")]
    out["cut"] = sum(e == "length" for e in ends) / len(ends) if ends else None
    passed = {r["prompt_id"]: bool(r["check"]["passed"]) for r in recs if "check" in r}
    out["accuracy"] = sum(passed.values()) / len(passed) if passed else None
    if passed and ref_passed and out["mode"] != REFERENCE:
        won, lost, n = paired.won_lost(passed, ref_passed)
        out.update(won=won, lost=lost, n_paired=n, sign_p=paired.sign_test(won, lost))
    return out


def _rollbacks(stats: list[dict[str, Any]], rounds: int, seconds: float) -> dict[str, Any]:
    """Recurrent and hybrid models (``Stats.rollback``): how each cache went back and what that
    cost, all told (state copies, restores, and catch-up decodes of their own), per round, per
    rollback and as a share of the decoding time. With snapshots a drop costs microseconds, and
    the rows a restore defers ride in the next decode's batch (timed there, not here)."""
    spent = [s["rollback"] for s in stats if s.get("rollback")]
    if not spent:
        return {}
    ms = events = 0.0
    ways = {}
    for role in ("target", "draft"):
        parts = [x[role] for x in spent if x.get(role)]
        if not parts:
            continue
        ways[role] = parts[0]["way"]
        ms += sum(p["copy_ms"] + p["restore_ms"] + p["split_ms"] for p in parts)
        events += sum(p["restores"] + p["native"] + p["rebuilds"] for p in parts)
    return {"rollback_ways": ways, "rollbacks": int(events),
            "rollback_ms_per_round": ms / rounds if rounds else None,
            "rollback_ms_each": ms / events if events else None,
            "rollback_share": ms / 1000.0 / seconds if seconds > 0 else None}


def summarize(records: list[dict[str, Any]], modes: Sequence[str]) -> list[dict[str, Any]]:
    """One row per mode, in the order given. NLL / target and won/lost compare each mode with
    the target on the prompts both ran."""
    ref_nll = {r["prompt_id"]: r["nll"] for r in records if r["mode"] == REFERENCE and r.get("nll") is not None}
    ref_passed = {r["prompt_id"]: bool(r["check"]["passed"]) for r in records if r["mode"] == REFERENCE and "check" in r}
    rows = []
    for label in modes:
        recs = [r for r in records if r["mode"] == label]
        if recs:
            rows.append(_mode_summary(recs, ref_nll, ref_passed))
    return rows


def by_category(records: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """category -> mode -> geometric-mean speedup over the target."""
    out: dict[str, dict[str, float | None]] = {}
    for r in records:
        out.setdefault(r["category"], {}).setdefault(r["mode"], None)
    for cat, modes in out.items():
        for mode in modes:
            modes[mode] = geomean(r.get("speedup") for r in records if r["category"] == cat and r["mode"] == mode)
    return out


def comparisons(rows: list[dict[str, Any]], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """fly-cpp against llama.cpp at the same k: per-prompt tokens/s ratios, geometric mean."""
    def tps(label: str) -> dict[str, float]:
        return {r["prompt_id"]: r["stats"]["tokens_per_second"] for r in records if r["mode"] == label}

    labels = {row["mode"] for row in rows}
    pairs = [(REFERENCE, "llama.cpp-target")]
    for row in rows:
        if row["peer"] and row["mode"] != "llama.cpp-target":
            suffix = row["mode"][len("llama.cpp-spd"):]
            pairs += [(f"{name}{suffix}", row["mode"]) for name in ("spd", "spd-plain", "fly")]
    best = best_peer(rows)
    if best is not None:
        pairs += [(row["mode"], best) for row in rows if not row["peer"] and row["mode"] != REFERENCE]
    out = []
    for ours, theirs in dict.fromkeys(pairs):
        if ours in labels and theirs in labels:
            a, b = tps(ours), tps(theirs)
            ratio = geomean(_ratio(a[p], b[p]) for p in a if p in b)
            out.append({"ours": ours, "peer": theirs, "tokens_per_second_ratio": ratio, "best": theirs == best})
    return out


def best_peer(rows: list[dict[str, Any]]) -> str | None:
    """llama.cpp's best configuration on this prompt set: the peer mode (target-only included)
    with the most tokens per second over all its prompts; None without peer rows."""
    peers = [r for r in rows if r["peer"] and r.get("tokens_per_second")]
    return max(peers, key=lambda r: r["tokens_per_second"])["mode"] if peers else None
