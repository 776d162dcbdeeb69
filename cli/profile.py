"""``fly-cpp profile``: host time per round, numpy vs the native library, measured."""

from __future__ import annotations

import json
from typing import Any

import click
from fly_cpp.cli.models_opt import model_options, open_engine
from fly_cpp.cli.options import pick, settings_options

from fly_cpp.backend import native
from fly_cpp.bench import hostbench
from fly_cpp.config import SamplingSettings, SpecSettings
from fly_cpp.kauto.costs import format_curve


def _ints(value: str) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers") from None
    if not out or min(out) < 1:
        raise click.BadParameter(f"{value!r}: every value must be >= 1")
    return out


@click.command()
@click.option("--vocabs", default=",".join(map(str, hostbench.VOCABS)), show_default=True,
              help="vocabulary sizes of the micro-benchmark (comma-separated)")
@click.option("--ks", default=",".join(map(str, hostbench.KS)), show_default=True,
              help="draft lengths k of the micro-benchmark (comma-separated)")
@click.option("--repeats", type=click.IntRange(min=1), default=7, show_default=True, help="rounds timed per cell (median)")
@click.option("--sampled/--no-sampled", default=False, help="also time a sampled round (2k+1 draws + k entropies)")
@click.option("--engine", "run_engine", is_flag=True,
              help="also generate on a model pair (-m/-d/--pair; the bundled pair by default) with the library off "
                   "and on, and report the host share of a round")
@click.option("-p", "--prompt", default="Once upon a time", show_default=True, help="prompt of the --engine runs")
@click.option("-n", "--max-tokens", type=click.IntRange(min=1), default=64, show_default=True,
              help="tokens per --engine run")
@click.option("--runs", type=click.IntRange(min=1), default=3, show_default=True, help="--engine runs per setting")
@click.option("--skip-table", is_flag=True, help="skip the micro-benchmark (with --engine)")
@click.option("--recalibrate", is_flag=True,
              help="with --engine: measure the pair's cost curve again instead of reading it from the cache")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of tables")
@model_options
@settings_options(SpecSettings)
@settings_options(SamplingSettings)
def profile(vocabs: str, ks: str, repeats: int, sampled: bool, run_engine: bool, prompt: str, max_tokens: int,
            runs: int, skip_table: bool, recalibrate: bool, as_json: bool, **options: Any) -> None:
    """Measure the host side of a speculative round, numpy vs the native library.

    The micro-benchmark times what a greedy FLy round does with logits on the host (argmax of
    the k+1 target rows, top-3 entropy of all k drafted rows, k one-row draft argmaxes) for each
    vocabulary size and k, on random logits. With --engine, real generations split each round
    into draft, target and host time, and the pair's measured cost of a forward pass by rows
    (what k auto decides with) is printed.
    """
    vocab_list, k_list = _ints(vocabs), _ints(ks)
    result: dict[str, Any] = {"native": native.status()}
    say = (lambda text: None) if as_json else click.echo
    say(f"native library: {native.status()}")
    if not skip_table:
        for mode in ("greedy", "sampled") if sampled else ("greedy",):
            table = hostbench.round_table(mode, vocab_list, k_list, repeats)
            result[mode] = [{**vars(t), "speedup": t.speedup} for t in table]
            say(f"\nhost time of one {mode} round (median of {repeats}):")
            say(hostbench.format_table(table))
    if run_engine:
        spec = SpecSettings(**pick(options, SpecSettings))
        sampling = SamplingSettings(**pick(options, SamplingSettings))
        with open_engine(options) as engine:
            shares = hostbench.engine_share(engine, prompt, spec, sampling, max_tokens, runs)
            info = engine.info()
            result["engine"] = {"target": info.target.path, "draft": info.draft.path if info.draft else None,
                                "n_vocab": info.n_vocab, "runs": [s.as_dict() for s in shares]}
            say(f"\nper round on {info.target_name} (n_vocab {info.n_vocab}), "
                f"{runs} x {max_tokens} tokens, mode {spec.mode}, k {spec.k}, temperature {sampling.temperature}:")
            say(hostbench.format_shares(shares))
            model = engine.costs(refresh=recalibrate)
            result["engine"]["costs"] = model.as_dict()
            # where the curves come from: measured now or before, learned from live decodes, or the prior
            say(f"\ncost of one forward pass on this machine ({model.measured or 'measured now'}; "
                "ms by rows decoded; k auto decides with these):")
            shallow = model.target_curve.depth  # and 1024 tokens deeper, within the context
            for depth in dict.fromkeys((shallow, min(shallow + 1024, info.n_ctx))):
                say(format_curve(model, depth))
    if as_json:
        click.echo(json.dumps(result))
