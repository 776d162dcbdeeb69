"""The model options shared by every command that loads a target/draft pair.

A pair comes from local paths (-m/-d), from the Hugging Face hub (--hf-repo/--hf-file and
--hf-draft-repo/--hf-draft-file, through huggingface-hub's cache), from a named pair
(--pair: the registry in models/pairs.toml or one of the kit's local pairs), or, with none of
these, the bundled tiny pair.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from fly_cpp.cli.options import pick, settings_options
from fly_cpp.config import ModelSettings
from fly_cpp.engine import Engine

DRAFT_FIELDS = ("n_threads", "n_gpu_layers", "main_gpu")
SOURCE_KEYS = ("target_path", "draft_path", "hf_repo", "hf_file", "hf_draft_repo", "hf_draft_file", "pair")


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


def model_paths(options: dict[str, Any]) -> tuple[str | None, str | None, dict[str, Any]]:
    """(target path, draft path, default settings) the options name, downloading or building
    what is missing. Both paths are None when no model is named (the caller's default)."""
    from fly_cpp.models import hub, kit

    given = {k: options.get(k) for k in SOURCE_KEYS if options.get(k) is not None}
    defaults: dict[str, Any] = {}
    if "pair" in given:
        if len(given) > 1:
            raise click.UsageError("--pair names both models: drop -m/-d/--hf-* options")
        name = given["pair"]
        if name in kit.PAIRS:
            if kit.built(name) is None:
                click.echo(f"fly-cpp: note: building pair {name} into {kit.cache_root() / name} (once)", err=True)
            pair = kit.make_pair(name)
            if pair.synthetic:
                click.echo(f"fly-cpp: note: pair {pair.label}: {pair.description}", err=True)
            return str(pair.target), str(pair.draft), {"n_ctx": pair.n_ctx}
        if name not in hub.registry():
            known = sorted(hub.registry()) + list(kit.PAIRS)
            raise click.UsageError(f"unknown pair {name!r} (known: {', '.join(known)}; see 'fly-cpp models list')")
        target, draft = hub.pull_pair(name)
        return str(target), str(draft), defaults

    target, draft = given.get("target_path"), given.get("draft_path")
    if "hf_file" in given and "hf_repo" not in given:
        raise click.UsageError("--hf-file needs --hf-repo")
    if "hf_repo" in given:
        if target is not None:
            raise click.UsageError("give the target with -m or with --hf-repo, not both")
        if "hf_file" not in given:
            raise click.UsageError("--hf-repo needs --hf-file (the GGUF file name in the repository)")
        target = str(hub.pull(given["hf_repo"], given["hf_file"]))
    if "hf_draft_repo" in given or "hf_draft_file" in given:
        if draft is not None:
            raise click.UsageError("give the draft with -d or with --hf-draft-repo/--hf-draft-file, not both")
        repo = given.get("hf_draft_repo") or given.get("hf_repo")
        if repo is None:
            raise click.UsageError("--hf-draft-file needs --hf-draft-repo (or --hf-repo)")
        if "hf_draft_file" not in given:
            raise click.UsageError("--hf-draft-repo needs --hf-draft-file (the GGUF file name in the repository)")
        draft = str(hub.pull(repo, given["hf_draft_file"]))
    if target is None and draft is not None:
        raise click.UsageError("a draft model (-d) needs a target model (-m)")
    return target, draft, defaults


def open_engine(options: dict[str, Any]) -> Engine:
    """Build the engine the options describe (the bundled pair when no model is named)."""
    from fly_cpp.models import bundled

    target_path, draft_path, defaults = model_paths(options)
    if target_path is None:
        target_path, draft_path = bundled.TARGET, bundled.DRAFT
        defaults = {"n_ctx": bundled.N_CTX}
    options = {**defaults, **{k: v for k, v in options.items() if v is not None}}
    target = ModelSettings(path=str(target_path), **pick(options, ModelSettings))
    draft = None
    if draft_path is not None:
        draft_opts = {k: v for k, v in pick(options, ModelSettings, "draft_").items() if k != "path"}
        draft = ModelSettings(path=str(draft_path), n_ctx=target.n_ctx, **draft_opts)
    return Engine(target, draft)
