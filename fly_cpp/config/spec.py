"""Which decoding mode runs and how drafts are made and judged (k, k auto's bounds, FLy's rule)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fly_cpp.config.checks import AUTO, FLY_RULES, LOOSEN, MODES, SPEC_TYPES, STEADY, _help, _integer, _number, _require
from fly_cpp.config.policy import AcceptPolicy


@dataclass(frozen=True)
class SpecSettings:
    """Which decoding mode runs and how drafts are made and judged.

    ``window`` counts the positions of the deferred window *including the mismatch itself*,
    as the authors' released code does: window 6 keeps a mismatch only when the target then
    agrees with the next 5 drafted tokens. (vLLM's ``fly_window_size`` counts only the tokens
    after the mismatch: vLLM's 5 is our 6.) ``window`` 1 keeps every mismatch the entropy gate
    lets through; ``window`` 0 switches loose acceptance off (exact-match decoding).

    ``fly_rule`` "paper" is the published rule exactly (window and gate); "guarded" adds the
    ``loose_*`` safeguards of ``fly_cpp.rounds.accept`` and never loosens a token the target's own
    sampler could not produce.
    """

    mode: str = field(default="fly", metadata=_help("fly (loose acceptance), spd (exact match) or target (no drafting)"))
    spec_type: str = field(default="auto", metadata=_help(
        "who drafts: 'draft-mtp' = the target's own MTP head (a model that keeps its MTP layers, loaded without -d); "
        "'auto' = the draft model when -d is given, else the MTP head when the target has one, else n-gram lookup"))
    k: int | str = field(default=AUTO, metadata=_help(
        "tokens drafted per round: a number (0 = none: the target alone, as --mode target), or 'auto' (each round "
        "drafts what pays most on this machine, by the costs it learns: none where nothing pays)",
        aliases=("--draft-max", "--draft-n", "--spec-draft-n-max")))
    window: int = field(default=6, metadata=_help("deferred window, counting the mismatch itself; 0 = no loose accepts"))
    entropy_threshold: float = field(default=0.3, metadata=_help(
        "entropy gate in nats: a mismatch may be loosely accepted only where the target's top-3 entropy is at "
        "least this (the target was unsure); top-3 entropy is at most ln 3 = 1.10, so a higher value, or 'inf', "
        "switches loose accepts off"))
    fly_rule: str = field(default="guarded", metadata=_help(
        "fly: 'paper' = the published rule (deferred window and entropy gate only); 'guarded' = also the "
        "--loose-* safeguards, and never a token the target's sampler could not produce"))
    loosen: str = field(default="auto", metadata=_help(
        "fly: 'auto' = loose acceptance, except under k auto where it does not pay on this pair "
        "(priced once per pair and machine at the pair's costs, nothing measured, then kept: fly then "
        "matches exactly), with one slot or several alike; 'on' = always; "
        "'off' = never (fly's text is then spd's)"))
    loose_min_ratio: float = field(default=0.5, metadata=_help(
        "fly, guarded: loosen a mismatch only where the target finds the drafted token at least this fraction "
        "as likely as its own top token, p(d)/p(top); 0 = any (docs/fly-rule.md: the measurements behind 0.5)"))
    loose_top_n: int = field(default=0, metadata=_help(
        "fly, guarded: loosen a mismatch only where the drafted token is among the target's n most likely; 0 = any"))
    loose_in_code: bool = field(default=True, metadata=_help(
        "fly, guarded: loosen mismatches inside ``` code blocks of the answer too"))
    loose_digits: bool = field(default=True, metadata=_help(
        "fly, guarded: loosen mismatches where the drafted or the target's token holds a digit too"))
    ngram: bool = field(default=True, metadata=_help("speed up the drafter with n-gram lookup"))
    ngram_max: int = field(default=4, metadata=_help("longest n-gram looked up"))
    ngram_tokens: int = field(default=6, metadata=_help("tokens proposed per n-gram hit"))
    p_min: float = field(default=0.0, metadata=_help(
        "stop a draft when the draft's top probability falls below this",
        aliases=("--draft-p-min", "--spec-draft-p-min")))
    n_min: int = field(default=0, metadata=_help(
        "drop drafts shorter than this (the target then decodes one token alone that round); a round that "
        "may draft fewer (near the end of -n or of the context) keeps a draft of that length",
        aliases=("--draft-min", "--draft-n-min", "--spec-draft-n-min")))
    cross_round: bool | None = field(default=None, metadata=_help(
        "fly: keep a gated mismatch near the end of a draft provisionally and finish its window in the next round "
        "[default: on under the guarded rule, off under the published one]",
        flag="cross-round-window"))
    k_max: int = field(default=16, metadata=_help("with k auto: the longest draft a round may make"))
    k_gpu: int | str = field(default=AUTO, metadata=_help(
        "with k auto on a target whose every layer is on a GPU, where a decode costs more when the batch's shape "
        "changes (measured on an H100, docs/benchmarks.md): 'auto' = every round of a generation drafts the one "
        "length k auto's measured costs and the draft's acceptance pick at its start; a number = draft that many "
        "every round; 0 = plan each round there too"))
    k_slots: int = field(default=3, metadata=_help(
        "with k auto and several slots generating at once: the draft length of their rounds, drafted for every "
        "slot together (one draft-model batch a step, every slot's rows in one target batch), as llama-server's "
        "slots draft; 0 = under load, draft only what fly's windows need"))
    cross_round_confidence: float = field(default=0.5, metadata=_help(
        "cross-round under --fly-rule paper: keep a tail mismatch only when the draft's running agreement makes "
        "completing its window at least this likely; 0 = always (the guarded rule always finishes a window, so "
        "that its text does not depend on how the rounds went)"))
    steady_batches: str = field(default="off", metadata=_help(
        "pad the target's verification batches to the widest of the recent rounds, so that their shape stays "
        "steady (a GPU reruns a decode of the shape it ran last faster; on an H100 it recovered part of planned "
        "rounds' loss, a fixed k more: --k-gpu); "
        "auto = on when the target is offloaded to a GPU or rpc server"))

    draft_tree: int = field(default=0, metadata=_help(
        "with a fixed k and exact verification (spd): each round drafts a tree of k tokens, a chain and one "
        "branch of 1 + this many where the draft was torn between two tokens, verified in one target pass; "
        "0 = a chain (docs/sampling.md: where it pays)"))

    def __post_init__(self) -> None:
        _require(self.mode in MODES, f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.spec_type == "mtp":
            object.__setattr__(self, "spec_type", "draft-mtp")
        _require(self.spec_type in SPEC_TYPES,
                 f"spec_type must be one of {', '.join(SPEC_TYPES)} (or mtp), got {self.spec_type!r}")
        if self.k == 0 and not isinstance(self.k, bool):  # nothing drafted: the target alone (llama.cpp's --draft-max 0)
            object.__setattr__(self, "mode", "target")
            object.__setattr__(self, "k", AUTO)
        _require(self.k == AUTO or (isinstance(self.k, int) and not isinstance(self.k, bool) and self.k >= 1),
                 f"k must be >= 0 (or 'auto'), got {self.k!r}")
        _integer("k_max", self.k_max, 1)
        _require(self.k_gpu == AUTO or (isinstance(self.k_gpu, int) and not isinstance(self.k_gpu, bool)
                                        and self.k_gpu >= 0), f"k_gpu must be >= 0 (or 'auto'), got {self.k_gpu!r}")
        _integer("k_slots", self.k_slots, 0)
        _integer("window", self.window, 0)
        _number("entropy_threshold", self.entropy_threshold, 0, inf=True)
        _require(self.fly_rule in FLY_RULES, f"fly_rule must be one of {', '.join(FLY_RULES)}, got {self.fly_rule!r}")
        _require(self.loosen in LOOSEN, f"loosen must be one of {', '.join(LOOSEN)}, got {self.loosen!r}")
        _number("loose_min_ratio", self.loose_min_ratio, 0, 1)
        _integer("loose_top_n", self.loose_top_n, 0)
        _integer("ngram_max", self.ngram_max, 1)
        _integer("ngram_tokens", self.ngram_tokens, 1)
        _require(isinstance(self.p_min, (int, float)) and 0.0 <= self.p_min <= 1.0,
                 f"p_min must be in [0, 1], got {self.p_min}")
        _require(self.n_min >= 0, f"n_min must be >= 0, got {self.n_min}")
        _require(self.n_min <= self.max_draft, f"n_min ({self.n_min}) must be <= "
                 + (f"k ({self.k})" if self.k != AUTO else f"k_max ({self.k_max})"))
        _require(isinstance(self.cross_round_confidence, (int, float)) and 0.0 <= self.cross_round_confidence < 1.0,
                 f"cross_round_confidence must be in [0, 1), got {self.cross_round_confidence}")
        _integer("draft_tree", self.draft_tree, 0)
        if self.draft_tree and self.mode != "target":
            _require(not self.auto, f"draft_tree needs a fixed k (k {self.draft_tree + 2} or more), not k auto")
            _require(int(self.k) > self.draft_tree + 1,
                     f"draft_tree {self.draft_tree} needs k >= {self.draft_tree + 2} (a chain beside the branch), got k {self.k}")
            _require(not self.policy().loosens, "draft_tree needs exact verification: --mode spd (or fly with --loosen off)")
        _require(self.steady_batches in STEADY,
                 f"steady_batches must be one of {', '.join(STEADY)}, got {self.steady_batches!r}")

    @property
    def auto(self) -> bool:
        """Whether each round's draft length is chosen by the cost-aware controller."""
        return self.k == AUTO

    @property
    def max_draft(self) -> int:
        """The longest draft of a round: k, or k_max with k auto."""
        return self.k_max if self.k == AUTO else int(self.k)

    @property
    def cross_round_window(self) -> bool:
        """Whether the cross-round window is on: as set, else with the guarded rule (the
        published rule stays the paper's bit for bit unless asked)."""
        return self.cross_round if self.cross_round is not None else self.fly_rule == "guarded"

    def policy(self) -> AcceptPolicy:
        """The accept rule's knobs for this mode: FLy's window and gate (with the safeguards
        unless the rule is the paper's), or exact matching."""
        if self.mode != "fly" or self.loosen == "off":
            return AcceptPolicy.exact()
        if self.fly_rule == "paper":
            return AcceptPolicy(self.window, self.entropy_threshold)
        return AcceptPolicy(self.window, self.entropy_threshold, top_n=self.loose_top_n,
                            min_ratio=self.loose_min_ratio, supported=True, loose_in_code=self.loose_in_code,
                            loose_digits=self.loose_digits, own_only=self.cross_round_window)

    @property
    def reproducible(self) -> bool:
        """Whether the text depends on the request alone (the prompt, the settings and the seed),
        not on how far each round drafted, which k auto decides from live timings: always for
        spd and target, and for fly under the guarded rule with the cross-round window (the
        defaults); not under the published rule, whose window must fit in one draft."""
        return self.mode != "fly" or not self.policy().loosens or self.policy().own_only
