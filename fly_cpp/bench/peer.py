"""The peer: llama.cpp's own binaries on the same prompts (see scripts/build-llama-cpp.sh).

- ``llama-speculative-simple`` runs exact-match speculative decoding with a draft model. We
  give it the same k (``--spec-draft-n-max k``, no minimum, no probability cut-off: the same
  drafting rule as fly-cpp's ``spd-plain``) and greedy sampling; it prints its decode speed,
  drafted/accepted counts and the drafter's mean accepted length.
- Target-only: the same binary without a draft model, when this build accepts that (the same
  loop and the same timer), otherwise ``llama-completion`` (its perf counters' eval speed).

Its decode speed excludes model loading and prompt processing, like fly-cpp's ``seconds``.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fly_cpp._llama import cpu_has_amx
from fly_cpp.errors import FlyError

SPECULATIVE = "llama-speculative-simple"
COMPLETION = "llama-completion"
TIMEOUT_SECONDS = 600.0

_DECODED = re.compile(r"decoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds, speed:\s+([\d.]+|inf|nan)\s+t/s")
_ENCODED = re.compile(r"encoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds")
_FIELD = re.compile(r"^\s*(n_draft|n_predict|n_drafted|n_accept)\s*=\s*(\d+)\s*$", re.M)
_CALLS = re.compile(r"#calls\(b,g,a\)\s*=\s*(\d+)\s+(\d+)\s+(\d+)")
_MEAN_ACC = re.compile(r"#mean acc len\s*=\s*([\d.]+)")
_EVAL = re.compile(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs")
_PROMPT_EVAL = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")


@dataclass
class PeerRun:
    """One run of a peer binary on one prompt."""

    n_prompt: int = 0
    n_tokens: int = 0
    seconds: float = 0.0
    n_draft_max: int = 0
    n_drafted: int = 0
    n_accept: int = 0
    n_rounds: int = 0  # drafts verified (the drafter's accept calls); 0 when not printed
    mean_accepted: float = 0.0  # as llama.cpp prints it: 1 + accepted / rounds
    text: str = ""

    @property
    def tokens_per_second(self) -> float:
        return self.n_tokens / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("text")
        out["tokens_per_second"] = self.tokens_per_second
        return out


def parse_speculative(output: str) -> PeerRun:
    """Parse what llama-speculative-simple prints (stdout and stderr together)."""
    m = _DECODED.search(output)
    if not m:
        raise FlyError("could not find llama-speculative-simple's 'decoded N tokens' line in its output")
    run = PeerRun(n_tokens=int(m.group(1)), seconds=float(m.group(2)))
    if e := _ENCODED.search(output):
        run.n_prompt = int(e.group(1))
    fields = dict(_FIELD.findall(output))
    run.n_draft_max = int(fields.get("n_draft", 0))
    run.n_drafted = int(fields.get("n_drafted", 0))
    run.n_accept = int(fields.get("n_accept", 0))
    if c := _CALLS.search(output):
        run.n_rounds = int(c.group(3))
    if a := _MEAN_ACC.search(output):
        run.mean_accepted = float(a.group(1))
    elif run.n_rounds:
        run.mean_accepted = 1.0 + run.n_accept / run.n_rounds
    return run


def parse_completion(output: str) -> PeerRun:
    """Parse llama-completion's perf counters: generation speed from ``eval time``."""
    m = _EVAL.search(output.replace("prompt eval time", "prompt_eval_time"))
    if not m:
        raise FlyError("could not find llama-completion's 'eval time' line in its output")
    run = PeerRun(n_tokens=int(m.group(2)), seconds=float(m.group(1)) / 1000.0)
    if p := _PROMPT_EVAL.search(output):
        run.n_prompt = int(p.group(2))
    run.n_rounds = run.n_tokens
    run.mean_accepted = 1.0
    return run


class Peer:
    """llama.cpp's binaries in one directory, run with the same models and settings."""

    def __init__(self, bin_dir: str | os.PathLike[str], target: str, draft: str | None, *, n_ctx: int,
                 n_threads: int, repack: bool | None = None, timeout: float = TIMEOUT_SECONDS) -> None:
        self.dir = Path(bin_dir)
        if not self.dir.is_dir():
            raise FlyError(f"--llama-cpp-bin: no such directory: {self.dir}")
        self.speculative = self.dir / SPECULATIVE
        if not os.access(self.speculative, os.X_OK):
            raise FlyError(f"--llama-cpp-bin: {SPECULATIVE} not found in {self.dir} "
                           "(build it with scripts/build-llama-cpp.sh)")
        if draft is None:
            raise FlyError("--llama-cpp-bin needs a draft model (-d) for llama.cpp's speculative decoding")
        self.completion = self.dir / COMPLETION
        self.target, self.draft = target, draft
        self.n_ctx, self.n_threads, self.timeout = n_ctx, n_threads, timeout
        self.repack = repack if repack is not None else not cpu_has_amx()  # AMX repacking crashes
        self._target_only: str | None = None  # which binary runs target-only, found on first use

    def _common(self, prompt_file: str, max_tokens: int) -> list[str]:
        args = ["-m", self.target, "-f", prompt_file, "-n", str(max_tokens), "-c", str(self.n_ctx),
                "-t", str(self.n_threads), "--temp", "0", "--seed", "0", "-ngl", "0"]
        return args if self.repack else [*args, "--no-repack"]

    def _exec(self, argv: list[str]) -> tuple[int, str]:
        try:
            done = subprocess.run(argv, capture_output=True, timeout=self.timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise FlyError(f"{Path(argv[0]).name} timed out after {self.timeout:g}s") from None
        except OSError as e:
            raise FlyError(f"cannot run {argv[0]}: {e.strerror or e}") from None
        out = done.stdout.decode("utf-8", "replace") + "\n" + done.stderr.decode("utf-8", "replace")
        return done.returncode, out

    def _run(self, argv: list[str], parse: Any) -> PeerRun:
        rc, out = self._exec(argv)
        if rc != 0:
            tail = [line for line in out.strip().splitlines() if line.strip()][-1:] or [f"exit status {rc}"]
            raise FlyError(f"{Path(argv[0]).name} failed (exit {rc}): {tail[0][:200]}")
        return parse(out)

    def run(self, kind: str, prompt: str, max_tokens: int, k: int | None = None) -> PeerRun:
        """Run ``kind`` ("speculative" or "target") on a rendered prompt text."""
        with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8", delete=False) as f:
            f.write(prompt + "\n")  # llama.cpp drops one trailing newline of a prompt file
            path = f.name
        try:
            if kind == "speculative":
                argv = [str(self.speculative), *self._common(path, max_tokens), "-md", self.draft,
                        "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0"]
                return self._run(argv, parse_speculative)
            return self._run_target(path, max_tokens)
        finally:
            os.unlink(path)

    def _run_target(self, path: str, max_tokens: int) -> PeerRun:
        if self._target_only in (None, "speculative"):
            argv = [str(self.speculative), *self._common(path, max_tokens)]
            rc, out = self._exec(argv)
            if rc == 0 and _DECODED.search(out):
                self._target_only = "speculative"
                return parse_speculative(out)
            if self._target_only == "speculative":
                raise FlyError(f"{SPECULATIVE} (target only) failed (exit {rc})")
        if not os.access(self.completion, os.X_OK):
            raise FlyError(f"--llama-cpp-bin: {SPECULATIVE} cannot run without a draft and "
                           f"{COMPLETION} is not in {self.dir}")
        self._target_only = "completion"
        argv = [str(self.completion), *self._common(path, max_tokens), "-no-cnv", "--no-warmup", "--perf"]
        return self._run(argv, parse_completion)

    def describe(self) -> dict[str, Any]:
        return {"bin": str(self.dir), "repack": self.repack, "target_only": self._target_only}
