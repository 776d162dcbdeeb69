"""CPU time per generated token, fly-cpp's target-only against llama-completion, on a busy machine.

Wall clock on a shared machine measures the neighbours; the CPU time a process was given does
much less. Each configuration runs as fresh processes with -n 1 and -n N, alternated with the
others; the difference, per token, leaves out loading and the prompt. The prompt must not end
its text before N tokens (check with `fly-cpp generate ... --json`).

    python scripts/cpu_per_token.py MODEL.gguf [--n 257] [--repeats 5] [--prompt TEXT]
        [--llama-cpp-bin DIR]

Configurations: fly-cpp token by token (the native library off, FLY_CPP_NO_NATIVE=1), fly-cpp
as it runs (target-only runs in the library), llama-completion.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys

PROMPT = "Tom and Sue went to the park. They saw a big dog"


def cpu_seconds(argv: list[str], env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--n", type=int, default=257)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--llama-cpp-bin", default="llama-bin")
    a = ap.parse_args()
    common = ["-m", a.model, "-p", a.prompt, "-t", "1", "-c", "512"]
    fly = [sys.executable, "-m", "fly_cpp.cli.main", "generate", *common, "--mode", "target", "--json"]
    peer = [os.path.join(a.llama_cpp_bin, "llama-completion"), *common, "--temp", "0", "--seed", "0", "-no-cnv"]
    configs = {"fly-cpp token by token": (fly, {"FLY_CPP_NO_NATIVE": "1"}), "fly-cpp": (fly, {}),
               "llama-completion": (peer, {})}
    per_token: dict[str, list[float]] = {k: [] for k in configs}
    for rep in range(a.repeats):
        for name, (argv, extra) in configs.items():
            env = {**os.environ, **extra}
            one = cpu_seconds([*argv, "-n", "1"], env)
            many = cpu_seconds([*argv, "-n", str(a.n)], env)
            per_token[name].append((many - one) / (a.n - 1) * 1e3)
        print(rep, {k: round(v[-1], 3) for k, v in per_token.items()}, flush=True)
    med = {k: statistics.median(v) for k, v in per_token.items()}
    for name, ms in med.items():
        print(f"{name}: {ms:.3f} ms CPU per token (median of {a.repeats}); "
              f"llama-completion / this {med['llama-completion'] / ms:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
