"""``fly-cpp bench``: speed and fidelity of target, spd and fly (and llama.cpp) on a dataset."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from fly_cpp.cli.models_opt import model_options, open_engine
from fly_cpp.cli.options import DraftLengths, NumberList, field_aliases, max_tokens_option, pick, settings_options

from fly_cpp.basics.errors import FlyError
from fly_cpp.bench.modes import VARIANTS
from fly_cpp.config import SamplingSettings, SpecSettings


@click.command()
@click.option("--dataset", default="spec_bench", show_default=True,
              help="spec_bench (the speculative-decoding benchmark's mix of tasks), mt_bench, gsm8k, humaneval, mbpp, "
                   "or a JSONL file with a prompt field per line")
@click.option("--limit", type=click.IntRange(min=1), help="run this many prompts (spread over the categories)")
@click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True,
              help="skip this many of the selected prompts first (to split a run into parts)")
@click.option("--modes", default="target,spd,fly", show_default=True,
              help=f"comma-separated modes: {', '.join(VARIANTS)}; name@kN runs a mode at that k only")
@click.option("--k", *field_aliases(SpecSettings, "k"), "ks", type=DraftLengths(),
              help="tokens drafted per round, 'auto' or a number; a list (auto,3,5,8) sweeps k [default: auto]")
@click.option("--peer-k", "peer_ks", type=NumberList(int, minimum=1),
              help="llama.cpp's draft lengths (--spec-draft-n-max) with --llama-cpp-bin, e.g. 3,5,8,16 "
                   "[default: llama.cpp as its users run it: k 3,5,8,16 at p-min 0 and 0.75, and its "
                   "n-gram lookup chained in front of the draft model]")
@click.option("--peer-p-min", "peer_p_mins", type=NumberList(float, minimum=0.0),
              help="llama.cpp's --spec-draft-p-min with --llama-cpp-bin (its default is 0: k every round, as "
                   "fly-cpp's fixed k does); a list (0,0.75) runs each [default: 0 with --peer-k; with neither, "
                   "llama.cpp as its users run it]")
@max_tokens_option(type=click.IntRange(min=1), default=128, show_default=True, help="tokens generated per prompt")
@click.option("-o", "--out", type=click.Path(file_okay=False), default="bench-out", show_default=True,
              help="directory for results.json, summary.md and the plots")
@click.option("--llama-cpp-bin", type=click.Path(),
              help="directory with llama.cpp's llama-speculative-simple and llama-completion to compare with "
                   "(scripts/build-llama-cpp.sh builds them)")
@click.option("--template/--no-template", default=True, show_default=True,
              help="apply the model's chat template when it has one")
@click.option("--cold", is_flag=True,
              help="every fly-cpp generation in a fresh process, as `fly-cpp generate` runs per prompt "
                   "(cost and evidence caches as they are); without it one warm process runs them all")
@click.option("--warmup/--no-warmup", default=True, show_default=True, help="one short untimed run per mode first")
@click.option("--fidelity/--no-fidelity", default=True, show_default=True,
              help="score agreement with the target and the target's NLL of every output")
@click.option("--plots/--no-plots", default=True, show_default=True, help="write PNG plots (needs matplotlib)")
@click.option("--progress/--no-progress", default=None, help="progress bar on stderr [default: when a terminal]")
@click.option("--system", "-sys", "--system-prompt", "system", help="a system message before every prompt, the same for every mode (needs the chat template)")
@click.option("--resume", is_flag=True,
              help="keep the records of --out's results.json and run only the (prompt, mode) pairs it lacks; "
                   "results are written after every prompt, so a stopped run can be resumed")
@model_options
@settings_options(SpecSettings, skip=("mode", "k"))
@settings_options(SamplingSettings)
def bench(dataset: str, limit: int | None, offset: int, modes: str, ks: tuple[int | str, ...] | None,
          peer_ks: tuple[int, ...] | None, peer_p_mins: tuple[float, ...] | None, max_tokens: int, out: str,
          llama_cpp_bin: str | None, template: bool, cold: bool, warmup: bool, fidelity: bool, plots: bool,
          progress: bool | None, system: str | None, resume: bool, **options: Any) -> None:
    """Benchmark decoding modes side by side on a dataset: tokens/s, speedup over the target,
    acceptance, host overhead, fidelity to the target's output, and task accuracy.

    All modes run on the same prompts in one process, interleaved per prompt, after a warm-up.
    With no -m/-d, the bundled tiny story model and its draft are used.
    """
    from fly_cpp.bench import datasets, report
    from fly_cpp.bench.modes import parse_modes
    from fly_cpp.bench.peer import Peer
    from fly_cpp.bench.runner import BenchConfig
    from fly_cpp.bench.suite import run_benchmark

    data = datasets.load(dataset)
    base = SpecSettings(**pick(options, SpecSettings))
    mode_list = parse_modes(modes, list(ks or [base.k]), base, peer=llama_cpp_bin is not None, peer_ks=peer_ks or (),
                            peer_p_mins=peer_p_mins or (0.0,), peer_users=not peer_ks and not peer_p_mins)
    sampling = SamplingSettings(**{"seed": 0, **pick(options, SamplingSettings)})
    if plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise FlyError("plots need matplotlib (pip install 'fly-cpp[bench]'), or pass --no-plots") from None
    config = BenchConfig(max_tokens=max_tokens, sampling=sampling, checker=data.checker, template=template,
                         warmup=warmup, fidelity=fidelity, system=system, cold=cold)
    prompts = datasets.select(data.prompts, limit, offset)
    if not prompts:
        raise FlyError(f"--offset {offset} leaves no prompts to run")
    out_dir = Path(out)
    previous = report.read(out_dir) if resume else None
    have = {(r["prompt_id"], r["mode"]) for r in (previous or {}).get("records", [])}
    n_runs = sum((p.id, m.label) not in have for p in prompts for m in mode_list)
    specs = [m.spec for m in mode_list if m.spec is not None]
    with open_engine(options, max((s.max_draft for s in specs), default=0), any(s.draft_tree for s in specs)) as engine:
        peer = None
        if llama_cpp_bin is not None:
            info = engine.info()
            peer = Peer(llama_cpp_bin, info.target.path, info.draft.path if info.draft is not None else None,
                        n_ctx=info.n_ctx, n_threads=info.n_threads, repack=info.target.repack,
                        gpu_layers=info.target.offloaded_layers,
                        draft_gpu_layers=info.draft.offloaded_layers if info.draft is not None else 0,
                        sampling=sampling)  # llama.cpp's binaries sample as fly-cpp's modes do
        from tqdm import tqdm

        show = sys.stderr.isatty() if progress is None else progress
        with tqdm(total=n_runs, desc="bench", unit="run", file=sys.stderr,
                  disable=not show, dynamic_ncols=True) as bar:
            def step(label: str) -> None:
                bar.set_postfix_str(label, refresh=False)
                bar.update(1)

            result = run_benchmark(engine, data, mode_list, config, limit=limit, offset=offset, peer=peer,
                                   progress=step,
                                   previous=previous,
                                   checkpoint=lambda partial: report.write(partial, out_dir, with_plots=False))
    files = report.write(result, out_dir, with_plots=plots)
    click.echo(report.terminal(result))
    click.echo(f"wrote {', '.join(str(out_dir / f) for f in files)}", err=True)
