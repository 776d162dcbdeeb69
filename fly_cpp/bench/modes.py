"""Benchmark modes: a mode is a label and the SpecSettings it runs with (or a peer binary).

``VARIANTS`` maps a name to a function of the base settings (the command line's spec options
and one k); new variants register themselves here, e.g. a cross-round FLy variant as
``VARIANTS["fly+xr"] = lambda s: replace(s, mode="fly", cross_round=True)``. With several k
values, every drafting mode runs once per k and is labelled ``name@kN``; a mode written
``name@kN`` (or ``name@kauto``) in the list runs at that k only (``--modes fly,fly+xr@k5``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fly_cpp.basics.errors import FlyError
from fly_cpp.config import SpecSettings

REFERENCE = "target"  # the mode every other one is compared with
PEER_DEFAULT_K = 3  # llama.cpp's default --spec-draft-n-max (common/common.h; its default p-min is 0)
PEER_USER_KS = (3, 5, 8, 16)  # llama.cpp as its users run it: these draft lengths ...
PEER_USER_P_MINS = (0.0, 0.75)  # ... at these p-mins, and the n-gram lookup chained in front at p-min 0
DRAFT_SIMPLE = "draft-simple"  # llama.cpp's --spec-type of a draft model
NGRAM_CHAIN = "ngram-mod,draft-simple"  # its n-gram lookup first, the draft model where it finds nothing

VARIANTS: dict[str, Callable[[SpecSettings], SpecSettings]] = {
    "target": lambda s: dataclasses.replace(s, mode="target"),
    "spd": lambda s: dataclasses.replace(s, mode="spd"),
    "fly": lambda s: dataclasses.replace(s, mode="fly"),
    # without the n-gram lookup in the drafter: the same drafting as llama.cpp's peer
    "spd-plain": lambda s: dataclasses.replace(s, mode="spd", ngram=False),
    "fly-plain": lambda s: dataclasses.replace(s, mode="fly", ngram=False),
    # FLy ablations: every gated mismatch kept (no window), and no entropy gate
    "fly-nowindow": lambda s: dataclasses.replace(s, mode="fly", window=1),
    "fly-nogate": lambda s: dataclasses.replace(s, mode="fly", entropy_threshold=0.0),
    # FLy with the deferred window carried across rounds (gains for short drafts)
    "fly+xr": lambda s: dataclasses.replace(s, mode="fly", cross_round=True),
    "fly+xr-always": lambda s: dataclasses.replace(s, mode="fly", cross_round=True, cross_round_confidence=0.0),
    # verification batches padded to a steady width (fly_cpp.rounds.shape), or never
    "fly-steady": lambda s: dataclasses.replace(s, mode="fly", steady_batches="on"),
    "fly-ragged": lambda s: dataclasses.replace(s, mode="fly", steady_batches="off"),
    # the published rule exactly, in-round and with the cross-round window
    "fly-paper": lambda s: dataclasses.replace(s, mode="fly", fly_rule="paper"),
    "fly-paper+xr": lambda s: dataclasses.replace(s, mode="fly", fly_rule="paper", cross_round=True),
    # the guarded rule's safeguards one at a time (tests/test_accept.py; the ablation in the README)
    "fly-r20": lambda s: _guarded(s, min_ratio=0.2),
    "fly-r50": lambda s: _guarded(s, min_ratio=0.5),
    "fly-r80": lambda s: _guarded(s, min_ratio=0.8),
    "fly-top2": lambda s: _guarded(s, top_n=2),
    "fly-r50-nocode": lambda s: _guarded(s, min_ratio=0.5, in_code=False),
    "fly-r50-nodigits": lambda s: _guarded(s, min_ratio=0.5, digits=False),
}


def _guarded(s: SpecSettings, *, min_ratio: float = 0.0, top_n: int = 0, in_code: bool = True,
             digits: bool = True) -> SpecSettings:
    """FLy under the guarded rule with exactly these safeguards (whatever the defaults are)."""
    return dataclasses.replace(s, mode="fly", fly_rule="guarded", loose_min_ratio=min_ratio, loose_top_n=top_n,
                               loose_in_code=in_code, loose_digits=digits)


@dataclass(frozen=True)
class Mode:
    label: str
    spec: SpecSettings | None  # None for a peer
    peer: str | None = None  # "speculative" or "target" for llama.cpp's binaries
    k: int | str | None = None  # a number, "auto", or None (no drafting)
    p_min: float = 0.0  # llama.cpp's speculative decoding: its --spec-draft-p-min
    spec_type: str = DRAFT_SIMPLE  # ... and its --spec-type

    @property
    def max_draft(self) -> int:
        """The longest draft a round of this mode may make."""
        if self.spec is not None:
            return self.spec.max_draft if self.spec.mode != "target" else 0
        return int(self.k) if isinstance(self.k, int) else 0

    @property
    def drafts(self) -> bool:
        return self.peer == "speculative" or (self.spec is not None and self.spec.mode != "target")


def parse_modes(text: str, ks: Sequence[int | str], base: SpecSettings, *, peer: bool = False,
                peer_ks: Sequence[int] = (), peer_p_mins: Sequence[float] = (0.0,),
                peer_users: bool = False) -> list[Mode]:
    """Modes from "target,spd,fly" and k values (numbers or "auto"); the reference mode is always
    run first. With ``peer``, llama.cpp's target-only run and its speculative decoding at each of
    ``peer_ks`` (default: the numeric ks, else llama.cpp's default 3) and each of
    ``peer_p_mins``; ``peer_users`` instead: llama.cpp as its users run it (``peer_modes``)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise FlyError("--modes is empty")
    pinned: dict[str, int | str] = {}
    for n in names:
        name, at, k = n.partition("@k")
        if at:
            if not (k == "auto" or k.isdigit() and int(k) >= 1) or name == REFERENCE:
                raise FlyError(f"bad mode {n!r} in --modes: write name@kN with N >= 1 or name@kauto "
                               "(the target drafts nothing)")
            pinned[n] = k if k == "auto" else int(k)
    unknown = [n for n in names if n.partition("@k")[0] not in VARIANTS]
    if unknown:
        raise FlyError(f"unknown mode {unknown[0]!r} in --modes: use some of {', '.join(VARIANTS)}")
    if len(set(names)) != len(names):
        raise FlyError(f"a mode is listed twice in --modes: {text}")
    if not ks:
        ks = [base.k]
    for k in ks:
        if k == 0:  # a mode's k drafts (the target mode is the run that drafts nothing)
            raise FlyError("k must be >= 1 (or 'auto') in a bench: the target mode drafts nothing")
        SpecSettings(k=k)  # checks it
    sweep = len(ks) > 1
    modes = [Mode(REFERENCE, VARIANTS[REFERENCE](base))]
    for name in names:
        if name == REFERENCE:
            continue
        if name in pinned:
            k = pinned[name]
            modes.append(Mode(name, VARIANTS[name.partition("@k")[0]](dataclasses.replace(base, k=k)), k=k))
            continue
        for k in ks:
            spec = VARIANTS[name](dataclasses.replace(base, k=k))
            modes.append(Mode(f"{name}@k{k}" if sweep else name, spec, k=k))
    labels = [m.label for m in modes]
    twice = next((x for x in labels if labels.count(x) > 1), None)
    if twice is not None:
        raise FlyError(f"mode {twice!r} is listed twice in --modes: {text}")
    if peer and peer_users:
        modes += peer_modes()
    elif peer:
        numbers = list(peer_ks) or [k for k in ks if isinstance(k, int)] or [PEER_DEFAULT_K]
        modes.append(Mode("llama.cpp-target", None, peer="target"))
        for p_min in peer_p_mins:
            for k in numbers:
                label = f"llama.cpp-spd@k{k}" if len(numbers) > 1 or sweep else "llama.cpp-spd"
                label += f"p{p_min:g}" if len(peer_p_mins) > 1 or p_min else ""
                modes.append(Mode(label, None, peer="speculative", k=k, p_min=p_min))
    return modes


def peer_modes() -> list[Mode]:
    """llama.cpp as its users run it: target-only, its defaults (k 3, p-min 0), k 3/5/8/16 at
    p-min 0 and 0.75, and its n-gram lookup chained in front of the draft model at each k."""
    modes = [Mode("llama.cpp-target", None, peer="target")]
    for p_min in PEER_USER_P_MINS:
        modes += [Mode(f"llama.cpp-spd@k{k}p{p_min:g}", None, peer="speculative", k=k, p_min=p_min)
                  for k in PEER_USER_KS]
    modes += [Mode(f"llama.cpp-ngram+spd@k{k}p0", None, peer="speculative", k=k, spec_type=NGRAM_CHAIN)
              for k in PEER_USER_KS]
    return modes
