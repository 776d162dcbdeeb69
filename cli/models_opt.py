"""The model options shared by every command that loads a target/draft pair.

A pair comes from local paths (-m/-d), from the Hugging Face hub (--hf-repo/--hf-file and
--hf-draft-repo/--hf-draft-file, through huggingface-hub's cache), from a named pair
(--pair: the registry in models/pairs.toml or one of the kit's local pairs), or, with none of
these, the bundled tiny pair; ``fly_cpp.models.sources`` resolves them. llama.cpp's spellings
work too (-md/--model-draft, -hf owner/name[:QUANT], -hff, -hfd).

The draft takes the target's settings (threads, GPU layers, KV cache types, flash attention,
loading) unless its own options set them (``ModelSettings.for_draft``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import click
from fly_cpp.cli.options import pick, settings_options

from fly_cpp.api.fly import Fly
from fly_cpp.basics.errors import FlyError
from fly_cpp.config import ModelSettings
from fly_cpp.engine.engine import Engine

DRAFT_FIELDS = ("n_threads", "n_gpu_layers", "main_gpu", "type_k", "type_v", "rollback")


def model_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = settings_options(ModelSettings, prefix="draft_", only=DRAFT_FIELDS)(fn)
    fn = click.option("--rpc-draft", is_flag=True, default=None,
                      help="put the draft's layers on the --rpc servers too [default: the draft runs here]")(fn)
    fn = settings_options(ModelSettings, skip=("path",))(fn)
    fn = click.option("--pair", help="a named target/draft pair: see 'fly-cpp models list' (downloaded or built once)")(fn)
    fn = click.option("--hf-draft-file", help="draft GGUF file in --hf-draft-repo (or in --hf-repo)")(fn)
    fn = click.option("--hf-draft-repo", "-hfd", "-hfrd", "--hf-repo-draft", "--spec-draft-hf", "hf_draft_repo",
                      metavar="OWNER/NAME[:QUANT]", help="Hugging Face repository of the draft model, as for -hf")(fn)
    fn = click.option("--hf-file", "-hff", help="target GGUF file in --hf-repo (overrides its QUANT)")(fn)
    fn = click.option("--hf-repo", "-hf", "-hfr", "hf_repo", metavar="OWNER/NAME[:QUANT]",
                      help="Hugging Face repository of the target model; without --hf-file the GGUF is picked as "
                           "llama.cpp does: the QUANT tag (case-insensitive), default Q4_K_M, else Q8_0, else the "
                           "first model file")(fn)
    fn = click.option("-d", "--draft", "-md", "--model-draft", "--spec-draft-model", "draft_path", type=click.Path(),
                      help="draft GGUF model")(fn)
    fn = click.option("-m", "--model", "target_path", type=click.Path(), help="target GGUF model")(fn)
    return fn


def model_settings(options: dict[str, Any]) -> tuple[ModelSettings, ModelSettings | None]:
    """The target's and the draft's settings the options describe (the bundled pair when no
    model is named), validated without loading anything (downloads happen here); the draft
    follows the target unless its own options say otherwise."""
    from fly_cpp.models import sources

    given = sources.resolve(
        options.get("target_path"), options.get("draft_path"), hf_repo=options.get("hf_repo"),
        hf_file=options.get("hf_file"), hf_draft_repo=options.get("hf_draft_repo"),
        hf_draft_file=options.get("hf_draft_file"), pair=options.get("pair"), names=sources.CLI,
        note=lambda text: click.echo(f"fly-cpp: note: {text}", err=True))
    options = {**given.defaults, **{k: v for k, v in options.items() if v is not None}}
    target = ModelSettings(path=given.target, **pick(options, ModelSettings))
    draft = None
    if options.get("rpc_draft") and not target.rpc:
        raise click.UsageError("--rpc-draft puts the draft on the --rpc servers: give --rpc too")
    if given.draft is not None:
        on_servers = {"rpc": target.rpc, "tensor_split": target.tensor_split} if options.get("rpc_draft") else {}
        try:
            draft = target.for_draft(given.draft, **on_servers, **pick(options, ModelSettings, "draft_"))
        except FlyError as e:
            raise FlyError(f"draft model: {e}") from None
    return target, draft


# models this large (together) take a second or more to load: a line says so first, as llama.cpp's
# tools print their loading (the F16 Qwen pair, 3.6 GB, loads in about 2 s on a 2-core CPU)
LOADING_NOTE_BYTES = 512 << 20


def open_engine(options: dict[str, Any], max_draft: int = 0, branches: bool = False) -> Engine:
    """Build the engine the options describe, saying first what it loads where that takes a while;
    ``max_draft``: the longest draft its rounds may make, ``branches``: whether they verify trees (``Engine``)."""
    target, draft = model_settings(options)
    loading_note(target, draft)
    return Engine(target, draft, max_draft=max_draft, branches=branches)


def loading_note(target: ModelSettings, draft: ModelSettings | None) -> None:
    """One line on stderr naming the models being loaded, where they are large enough to keep a
    user waiting (``LOADING_NOTE_BYTES``)."""
    from fly_cpp.backend.fit import size_text

    models = [m for m in (target, draft) if m is not None]
    sizes = [os.path.getsize(m.path) if os.path.isfile(m.path) else 0 for m in models]
    if sum(sizes) < LOADING_NOTE_BYTES:
        return
    names = " + ".join(f"{os.path.basename(m.path)} ({size_text(n)})" for m, n in zip(models, sizes))
    click.echo(f"fly-cpp: loading {names}", err=True)


def template_fallback(fly: Fly, chat_format: str | None) -> Fly:
    """``fly`` with llama.cpp's fallback where its model has no chat template and none was
    given: ChatML, as llama-cli and llama-server use (the Python API keeps ``plain``), so that
    ``chat`` and ``serve`` render a conversation alike."""
    from fly_cpp.api.chat_format import builtin

    if chat_format is None and fly.chat_format.name == "plain":
        fly.chat_format = builtin("chatml", bos_token=fly.info.bos_text, eos_token=fly.info.eos_text)
    return fly
