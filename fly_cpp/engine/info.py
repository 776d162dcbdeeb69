"""What an engine has loaded, for display and for the outer layers' decisions."""

from __future__ import annotations

from dataclasses import dataclass

from fly_cpp.config import ModelSettings
from fly_cpp.engine.loading import Loaded


@dataclass(frozen=True)
class EngineInfo:
    """What an engine has loaded, for display and for the outer layers' decisions."""

    target: ModelSettings
    draft: ModelSettings | None
    target_name: str
    draft_name: str | None
    n_ctx: int
    n_vocab: int
    n_threads: int  # threads of the target's context, and of the draft's (None: no draft model)
    draft_n_threads: int | None
    bos: int
    eos: int
    add_bos: bool
    bos_text: str  # the BOS / EOS tokens' text, as chat templates want them
    eos_text: str
    chat_template: str | None  # the target GGUF's tokenizer.chat_template
    placement: str = ""  # where each model's layers went ("target on the CPU", "target 29/29 layers on ...")


def describe(pair: Loaded, target: ModelSettings, draft: ModelSettings | None, n_ctx: int) -> EngineInfo:
    """``pair`` loaded with ``target`` and ``draft``, a slot holding ``n_ctx`` positions."""
    m, d = pair.target_model, pair.draft_model
    assert pair.target is not None

    def text(token: int) -> str:
        return m.token_text(token).decode("utf-8", "replace") if token >= 0 else ""

    return EngineInfo(
        target=target, draft=draft, target_name=m.name, draft_name=d.name if d is not None else None,
        n_ctx=n_ctx, n_vocab=m.n_vocab, n_threads=pair.target.n_threads,
        draft_n_threads=pair.draft_ctx.n_threads if pair.draft_ctx is not None else None,
        bos=m.bos, eos=m.eos, add_bos=m.add_bos, bos_text=text(m.bos), eos_text=text(m.eos),
        chat_template=m.meta("tokenizer.chat_template"),
        placement="; ".join(f"{role} {model.placement}" for role, model in (("target", m), ("draft", d))
                            if model is not None))
