#!/usr/bin/env python3
"""Several server configurations under the same load, interleaved: aggregate tok/s and ratios.

    python scripts/slots_bench.py --clients 4 --requests 24 --max-tokens 128 --repeat 3 \\
        --config "np1=fly -np 1 --mode target" --config "np4=fly -np 4 --mode target" \\
        --config "ls4=llama-server -np 4" --ratio np4/np1 --ratio np4/ls4 -- -m T.gguf [-d D.gguf]

Each configuration is ``LABEL=KIND ARGS``: KIND ``fly`` starts ``fly-cpp serve ARGS`` (``fly@PYTHON``:
with that interpreter, e.g. another checkout's virtualenv), ``llama-server`` starts llama.cpp's
server (``--llama-server BIN``) with ARGS on the same model files, the target alone unless ARGS
hold ``-md`` (then the draft's file, with the same threads). Arguments after ``--`` go to every
fly-cpp server (the model files: ``-m``/``-d``, or ``--pair NAME`` of a built kit pair; none: the
bundled pair); ``-t`` to all.
Every repeat runs each configuration once, in the order given, each on a fresh server
(``scripts/serve_load.py``'s load: streaming /v1/completions, greedy, its prompts); the table
gives each configuration's median tok/s over the repeats, and each ``--ratio A/B`` the median of
the per-repeat ratios (A and B ran next to each other in every repeat).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import serve_load  # noqa: E402


def main() -> None:
    argv = sys.argv[1:]
    common = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", action="append", required=True, metavar="LABEL=KIND ARGS")
    p.add_argument("--ratio", action="append", default=[], metavar="A/B")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", "-t", type=int, default=1)
    p.add_argument("--llama-server", metavar="BIN")
    p.add_argument("--json", action="store_true", help="also print every run as JSON")
    args = p.parse_args(argv)
    configs: list[tuple[str, str, list[str]]] = []
    for spec in args.config:
        label, _, rest = spec.partition("=")
        kind, *extra = shlex.split(rest)
        if not label or kind.split("@")[0] not in ("fly", "llama-server"):
            sys.exit(f"--config {spec!r}: expected LABEL=fly ARGS, LABEL=fly@PYTHON ARGS or LABEL=llama-server ARGS")
        if kind == "llama-server" and not args.llama_server:
            sys.exit("a llama-server configuration needs --llama-server BIN")
        configs.append((label, kind, extra))
    labels = [c[0] for c in configs]
    ratios = [r.split("/") for r in args.ratio]
    if any(len(r) != 2 or r[0] not in labels or r[1] not in labels for r in ratios):
        sys.exit(f"--ratio takes A/B of configured labels ({', '.join(labels)})")
    body = {"max_tokens": args.max_tokens, "temperature": 0}
    model = _model_path(common)
    draft = _draft_path(common)
    runs: dict[str, list[dict]] = {label: [] for label in labels}
    for rep in range(args.repeat):
        for label, kind, extra in configs:
            if kind == "llama-server":
                peer_draft = draft if "-md" in extra or "--model-draft" in extra else None
                extra = [a for a in extra if a not in ("-md", "--model-draft")]
                np_ = int(extra[extra.index("-np") + 1]) if "-np" in extra else 1
                rest = [a for i, a in enumerate(extra) if a != "-np" and (i == 0 or extra[i - 1] != "-np")]
                proc, url = serve_load.start_llama_server(args.llama_server, model, peer_draft, np_, args.threads, rest)
                payload = body
            else:
                python = kind.partition("@")[2] or sys.executable
                proc, url = serve_load.start_server(["-t", str(args.threads), *extra, *common], python)
                payload = body
            try:
                got = asyncio.run(serve_load.load(url, None, args.clients, args.requests, payload))
            finally:
                proc.terminate()
                proc.wait()
            runs[label].append(got)
            print(f"repeat {rep + 1} {label}: {got['tokens_per_second']:.1f} tok/s ({got['tokens']} tokens, "
                  f"busy slots a decode {got.get('n_busy_slots_per_decode', '-')})", file=sys.stderr)
    print(f"\n{args.clients} clients x {args.requests // args.clients} requests x {args.max_tokens} tokens, "
          f"-t {args.threads}, {args.repeat} repeats interleaved; medians\n")
    print("| configuration | tok/s | TTFT p50 (s) | busy slots a decode |")
    print("|---|---|---|---|")
    for label in labels:
        rs = runs[label]
        busy = [r["n_busy_slots_per_decode"] for r in rs if "n_busy_slots_per_decode" in r]
        print(f"| {label} | {statistics.median(r['tokens_per_second'] for r in rs):.1f} | "
              f"{statistics.median(r['p50_ttft_seconds'] for r in rs):.3f} | "
              f"{statistics.median(busy) if busy else '-'} |")
    for a, b in ratios:
        each = [x["tokens_per_second"] / y["tokens_per_second"] for x, y in zip(runs[a], runs[b])]
        print(f"\n{a} / {b}: {statistics.median(each):.3f}x (per repeat: {', '.join(f'{r:.3f}' for r in each)})")
    if args.json:
        print(json.dumps(runs, indent=2))


def _pair_files(common: list[str]) -> tuple[str, str | None] | None:
    """The target and draft files of ``--pair NAME`` among the fly-cpp arguments (a kit pair
    that is built), for llama-server to load the same files."""
    if "--pair" not in common:
        return None
    from fly_cpp.models.kit import built

    name = common[common.index("--pair") + 1]
    pair = built(name)
    if pair is None:
        sys.exit(f"pair {name} is not built here: fly-cpp models make-pair {name}")
    return str(pair.target), str(pair.draft)


def _model_path(common: list[str]) -> str:
    if (pair := _pair_files(common)) is not None:
        return pair[0]
    for flag in ("-m", "--model"):
        if flag in common:
            return common[common.index(flag) + 1]
    from fly_cpp.models.bundled import TARGET  # the bundled pair, as fly-cpp serve takes it with no -m

    return str(TARGET)


def _draft_path(common: list[str]) -> str | None:
    if (pair := _pair_files(common)) is not None:
        return pair[1]
    for flag in ("-d", "-md", "--model-draft"):
        if flag in common:
            return common[common.index(flag) + 1]
    if "-m" in common or "--model" in common:
        return None
    from fly_cpp.models.bundled import DRAFT

    return str(DRAFT)


if __name__ == "__main__":
    main()
