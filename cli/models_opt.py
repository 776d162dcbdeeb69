"""The model options shared by every command that loads a target/draft pair."""

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
    fn = click.option("-d", "--draft", "draft_path", type=click.Path(), help="draft GGUF model")(fn)
    fn = click.option("-m", "--model", "target_path", type=click.Path(), help="target GGUF model")(fn)
    return fn


def open_engine(options: dict[str, Any]) -> Engine:
    """Build the engine the options describe (the bundled pair when no model is named)."""
    from fly_cpp.models import bundled

    target_path, draft_path = options.get("target_path"), options.get("draft_path")
    if target_path is None:
        if draft_path is not None:
            raise click.UsageError("a draft model (-d) needs a target model (-m)")
        target_path, draft_path = bundled.TARGET, bundled.DRAFT
        options = {"n_ctx": bundled.N_CTX, **{k: v for k, v in options.items() if v is not None}}
    target = ModelSettings(path=str(target_path), **pick(options, ModelSettings))
    draft = None
    if draft_path is not None:
        draft = ModelSettings(path=str(draft_path), n_ctx=target.n_ctx, **pick(options, ModelSettings, "draft_"))
    return Engine(target, draft)
