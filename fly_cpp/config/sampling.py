"""llama.cpp's sampling chain, the seed, grammars and logit bias."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fly_cpp.config.checks import DRAWS, MAX_SEED, _help, _integer, _number, _require


@dataclass(frozen=True)
class SamplingSettings:
    """llama.cpp's sampling chain: penalties, top-k, top-p, min-p, temperature.

    The defaults are llama.cpp's (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, a fresh
    seed per generation); temperature 0 is greedy decoding. The entropy gate always reads the
    raw, untempered target logits.
    """

    temperature: float = field(default=0.8, metadata=_help("0 = greedy (llama.cpp's default 0.8)", aliases=("--temp",)))
    top_k: int = field(default=40, metadata=_help("keep the k most likely tokens; 0 = all"))
    top_p: float = field(default=0.95, metadata=_help("nucleus sampling; 1 = off"))
    min_p: float = field(default=0.05, metadata=_help("drop tokens below min_p times the top probability; 0 = off"))
    repeat_penalty: float = field(default=1.0, metadata=_help("penalise recent tokens; 1 = off"))
    repeat_last_n: int = field(default=64, metadata=_help("how many recent tokens the penalties look at"))
    presence_penalty: float = field(default=0.0, metadata=_help("subtract once from every recent token; 0 = off"))
    frequency_penalty: float = field(default=0.0, metadata=_help("subtract per occurrence of a recent token; 0 = off"))
    seed: int | None = field(default=None, metadata=_help("random seed; unset = a fresh one per generation",
                                                          aliases=("-s",)))
    draw: str = field(default="shared", metadata=_help(
        "how a sampled token is drawn: shared (noise keyed by seed, position and token, which the draft "
        "draws with too, so its drafts match more often) or llama (llama.cpp's sampler: a seed writes "
        "llama-server's text; the draft then drafts its argmax)"))
    draft_temp_scale: float = field(default=1.0, metadata=_help(
        "shared draw: the draft draws its tokens at this fraction of the temperature (a small draft is less "
        "sure than its target, so a cooler draw meets the target's more often); 1 = the target's own, 0 = the "
        "draft's argmax; every emitted token stays the target's draw whatever this is"))
    logit_bias: tuple[tuple[int, float], ...] = field(default=(), metadata=_help(
        "add to token logits, target and draft alike: TOKEN+BIAS or TOKEN-BIAS, comma-separated "
        "(e.g. 15043+1.5,2-inf; -inf bans the token)", aliases=("-l",)))
    ignore_eos: bool = field(default=False, metadata=_help(
        "never end the text with an end-of-generation token (they are banned); it ends at max tokens"))
    grammar: str = field(default="", metadata=_help(
        "GBNF grammar (llama.cpp's) every generated token obeys, exact, loosely accepted or the target's own"))
    json_schema: str = field(default="", metadata=_help(
        "JSON schema the answer follows (converted to a grammar); {} = any JSON object", aliases=("-j",)))
    grammar_trigger: str = field(default="", metadata=_help(
        "a lazy grammar: the text is free until it writes this word, and the grammar (or schema) constrains "
        "what follows the word (tool calls use <tool_call>)"))
    preserved_tokens: tuple[str, ...] = field(default=(), metadata=_help(
        "special tokens written into the text when generated (others render as nothing), as a tool call's "
        "[TOOL_CALLS] or <|python_tag|> must be to be read"))

    def __post_init__(self) -> None:
        for name in ("grammar", "json_schema"):
            _require(isinstance(getattr(self, name), str), f"{name} must be a string, got {getattr(self, name)!r}")
        _require(not (self.grammar and self.json_schema), "give grammar or json_schema, not both")
        _require(isinstance(self.grammar_trigger, str), f"grammar_trigger must be a string, got {self.grammar_trigger!r}")
        _require(not self.grammar_trigger or (self.constrained and len(self.grammar_trigger) >= 2),
                 "grammar_trigger needs a grammar or json_schema, and at least 2 characters")
        _require(isinstance(self.preserved_tokens, tuple) and all(isinstance(t, str) and t for t in self.preserved_tokens),
                 f"preserved_tokens must be a list of token texts, got {self.preserved_tokens!r}")
        _require(self.draw in DRAWS, f"draw must be one of {', '.join(DRAWS)}, got {self.draw!r}")
        _number("temperature", self.temperature, 0)
        _number("draft_temp_scale", self.draft_temp_scale, 0, 4)
        _integer("top_k", self.top_k, 0)
        _number("top_p", self.top_p, 0.0, 1.0, above=True)
        _number("min_p", self.min_p, 0.0, 1.0)
        _number("repeat_penalty", self.repeat_penalty, 0.0, above=True)
        _integer("repeat_last_n", self.repeat_last_n, 0)
        _number("presence_penalty", self.presence_penalty)
        _number("frequency_penalty", self.frequency_penalty)
        _require(self.seed is None or (isinstance(self.seed, int) and 0 <= self.seed <= MAX_SEED),
                 f"seed must be >= 0 and < 2**64, got {self.seed}")
        for pair in self.logit_bias:
            _require(isinstance(pair, tuple) and len(pair) == 2, f"logit_bias entries must be (token, bias) pairs, got {pair!r}")
            _integer("logit_bias token", pair[0], 0)
            bias = pair[1]
            if bias != -math.inf:
                _number(f"logit_bias of token {pair[0]}", bias)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def shares_draws(self) -> bool:
        """Whether the draft draws its tokens with the target's own chain and noise (``draw``
        shared at T > 0), instead of drafting its argmax."""
        return self.temperature > 0 and self.draw == "shared"

    @property
    def biased(self) -> bool:
        """Whether logits are changed before the sampler chain (logit_bias, ignore_eos)."""
        return bool(self.logit_bias) or self.ignore_eos

    @property
    def constrained(self) -> bool:
        """Whether a grammar or a JSON schema constrains the output."""
        return bool(self.grammar or self.json_schema)

    @property
    def penalised(self) -> bool:
        return self.repeat_last_n > 0 and (
            self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
        )
