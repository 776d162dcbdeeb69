"""The model options shared by every command that loads a target/draft pair.

A pair comes from local paths (-m/-d), from the Hugging Face hub (--hf-repo/--hf-file and
--hf-draft-repo/--hf-draft-file, through huggingface-hub's cache), from a named pair
(--pair: the registry in models/pairs.toml or one of the kit's local pairs), or, with none of
these, the bundled tiny pair; ``fly_cpp.models.sources`` resolves them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from fly_cpp.cli.options import pick, settings_options
from fly_cpp.config import ModelSettings
from fly_cpp.engine import Engine

DRAFT_FIELDS = ("n_threads", "n_gpu_layers", "main_gpu")


def model_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = settings_options(ModelSettings, prefix="draft_", only=DRAFT_FIELDS)(fn)
    fn = settings_options(ModelSettings, skip=("path",))(fn)
    fn = click.option("--pair", help="a named target/draft pair: see 'fly-cpp models list' (downloaded or built once)")(fn)
    fn = click.option("--hf-draft-file", help="draft GGUF file in --hf-draft-repo (or in --hf-repo)")(fn)
    fn = click.option("--hf-draft-repo", help="Hugging Face repository of the draft model")(fn)
    fn = click.option("--hf-file", help="target GGUF file in --hf-repo")(fn)
    fn = click.option("--hf-repo", help="Hugging Face repository of the target model (owner/name)")(fn)
    fn = click.option("-d", "--draft", "draft_path", type=click.Path(), help="draft GGUF model")(fn)
    fn = click.option("-m", "--model", "target_path", type=click.Path(), help="target GGUF model")(fn)
    return fn


def open_engine(options: dict[str, Any]) -> Engine:
    """Build the engine the options describe (the bundled pair when no model is named)."""
    from fly_cpp.models import sources

    given = sources.resolve(
        options.get("target_path"), options.get("draft_path"), hf_repo=options.get("hf_repo"),
        hf_file=options.get("hf_file"), hf_draft_repo=options.get("hf_draft_repo"),
        hf_draft_file=options.get("hf_draft_file"), pair=options.get("pair"), names=sources.CLI,
        note=lambda text: click.echo(f"fly-cpp: note: {text}", err=True))
    options = {**given.defaults, **{k: v for k, v in options.items() if v is not None}}
    target = ModelSettings(path=given.target, **pick(options, ModelSettings))
    draft = None
    if given.draft is not None:
        draft = ModelSettings(path=given.draft, n_ctx=target.n_ctx, **pick(options, ModelSettings, "draft_"))
    return Engine(target, draft)
