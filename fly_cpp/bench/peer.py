"""The peer: llama.cpp's own binaries on the same prompts (see scripts/build-llama-cpp.sh).

- ``llama-speculative-simple`` runs exact-match speculative decoding with a draft model. We
  give it the same k (``--spec-draft-n-max k``, no minimum, no probability cut-off: the same
  drafting rule as fly-cpp's ``spd-plain``) and greedy sampling; it prints its decode speed,
  drafted/accepted counts and the drafter's mean accepted length.
- Target-only: ``llama-completion`` (``llama-speculative-simple`` refuses to run without a
  draft); its time is its perf counters' ``eval time`` (the one-token decodes after the prompt)
  plus their share of its ``sampling time`` (choosing each token, which fly-cpp's time also
  holds); printing the text is left out, a slight advantage over the speculative binary's wall
  clock.

Decode speeds exclude model loading and prompt processing, like fly-cpp's ``seconds``. Each
run is a fresh process: the models load every time, outside the timed part.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fly_cpp.backend.lib import cpu_has_amx
from fly_cpp.basics.errors import FlyError
from fly_cpp.config import SamplingSettings

SPECULATIVE = "llama-speculative-simple"
COMPLETION = "llama-completion"
TIMEOUT_SECONDS = 600.0

_DECODED = re.compile(r"decoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds, speed:\s+([\d.]+|inf|nan)\s+t/s")
_ENCODED = re.compile(r"encoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds")
_FIELD = re.compile(r"\b(n_draft|n_predict|n_drafted|n_accept)\s*=\s*(\d+)\s*$", re.M)
_EVAL = re.compile(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs")
_PROMPT_EVAL = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
_SAMPLING = re.compile(r"\bsampling time =\s*([\d.]+) ms")


@dataclass
class PeerRun:
    """One run of a peer binary on one prompt."""

    n_prompt: int = 0
    n_tokens: int = 0
    seconds: float = 0.0
    n_draft_max: int = 0
    n_drafted: int = 0
    n_accept: int = 0
    n_rounds: int = 0  # target forward passes: every round emits its accepted tokens + 1
    mean_accepted: float = 0.0  # tokens per round
    text: str = ""  # the generated text, as echoed on stdout

    @property
    def tokens_per_second(self) -> float:
        return self.n_tokens / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("text")
        out["tokens_per_second"] = self.tokens_per_second
        return out


def generated_text(stdout: str, prompt: str) -> str:
    """The text after the echoed prompt (both binaries print prompt + continuation)."""
    at = stdout.find(prompt) if prompt else -1
    text = stdout[at + len(prompt):] if at >= 0 else stdout
    return text.rstrip("\n")


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
    run.n_rounds = max(run.n_tokens - run.n_accept, 0)  # n_predict = sum over rounds of (accepted + 1)
    run.mean_accepted = run.n_tokens / run.n_rounds if run.n_rounds else 0.0
    return run


def parse_completion(output: str) -> PeerRun:
    """Parse llama-completion's perf counters: generation time from ``eval time`` and the
    generated tokens' share of ``sampling time`` (it also sampled the first token, off the
    prompt's logits)."""
    m = _EVAL.search(output.replace("prompt eval time", "prompt_eval_time"))
    if not m:
        raise FlyError("could not find llama-completion's 'eval time' line in its output")
    n, ms = int(m.group(2)), float(m.group(1))
    if s := _SAMPLING.search(output):
        ms += float(s.group(1)) * n / (n + 1)
    run = PeerRun(n_tokens=n, seconds=ms / 1000.0)
    if p := _PROMPT_EVAL.search(output):
        run.n_prompt = int(p.group(2))
    run.n_rounds = run.n_tokens
    run.mean_accepted = 1.0
    return run


def _layers(n: int) -> str:
    """fly-cpp's layer count as the binaries' -ngl takes it (fly-cpp's -1 is their "all")."""
    return "all" if n < 0 else str(n)


class Peer:
    """llama.cpp's binaries in one directory, run with the same models and settings."""

    def __init__(self, bin_dir: str | os.PathLike[str], target: str, draft: str | None, *, n_ctx: int,
                 n_threads: int, repack: bool | None = None, gpu_layers: int = 0, draft_gpu_layers: int = 0,
                 timeout: float = TIMEOUT_SECONDS, sampling: SamplingSettings | None = None) -> None:
        """``sampling``: the sampling the binaries run at, as llama.cpp spells it (--temp,
        --top-k, --top-p, --min-p, --seed); None: greedy, seed 0."""
        self.dir = Path(bin_dir)
        if not self.dir.is_dir():
            raise FlyError(f"--llama-cpp-bin: no such directory: {self.dir}")
        self.speculative = self.dir / SPECULATIVE
        if not os.access(self.speculative, os.X_OK):
            raise FlyError(f"--llama-cpp-bin: {SPECULATIVE} not found in {self.dir} "
                           "(build it with scripts/build-llama-cpp.sh)")
        self.completion = self.dir / COMPLETION
        if not os.access(self.completion, os.X_OK):
            raise FlyError(f"--llama-cpp-bin: {COMPLETION} (target-only runs) not found in {self.dir}")
        self.target, self.draft = target, draft  # no draft model: llama.cpp drafts with the target's MTP head
        self.n_ctx, self.n_threads, self.timeout = n_ctx, n_threads, timeout
        self.repack = repack if repack is not None else not cpu_has_amx()  # AMX repacking crashes
        # fly-cpp's offload, said explicitly: on a GPU build the binaries offload all by default
        self.gpu_layers, self.draft_gpu_layers = _layers(gpu_layers), _layers(draft_gpu_layers)
        s = sampling if sampling is not None and sampling.temperature > 0 else None
        self.sampling = (["--temp", "0", "--seed", "0"] if s is None else
                         ["--temp", f"{s.temperature:g}", "--top-k", str(s.top_k), "--top-p", f"{s.top_p:g}",
                          "--min-p", f"{s.min_p:g}", "--seed", str(s.seed if s.seed is not None else 0)])

    def _common(self, prompt_file: str, max_tokens: int) -> list[str]:
        args = ["-m", self.target, "-f", prompt_file, "-n", str(max_tokens), "-c", str(self.n_ctx),
                "-t", str(self.n_threads), *self.sampling, "-ngl", self.gpu_layers]
        return args if self.repack else [*args, "--no-repack"]

    def _run(self, argv: list[str], parse: Callable[[str], PeerRun], prompt: str) -> PeerRun:
        try:
            done = subprocess.run(argv, capture_output=True, timeout=self.timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise FlyError(f"{Path(argv[0]).name} timed out after {self.timeout:g}s") from None
        except OSError as e:
            raise FlyError(f"cannot run {argv[0]}: {e.strerror or e}") from None
        stdout, stderr = (b.decode("utf-8", "replace") for b in (done.stdout, done.stderr))
        if done.returncode != 0:
            tail = [line for line in stderr.strip().splitlines() if line.strip()][-1:] or ["(no message)"]
            raise FlyError(f"{Path(argv[0]).name} failed (exit {done.returncode}): {tail[0][:200]}")
        run = parse(stdout + "\n" + stderr)
        run.text = generated_text(stdout, prompt)
        return run

    def run(self, kind: str, prompt: str, max_tokens: int, k: int | None = None, p_min: float = 0.0,
            spec_type: str = "draft-simple") -> PeerRun:
        """Run ``kind`` ("speculative" or "target") on a rendered prompt text; speculative
        drafts up to ``k`` tokens, stopping early where the draft's top probability < ``p_min``
        (llama.cpp's default is 0: k every round, as fly-cpp's fixed k does); ``spec_type``: its
        --spec-type list ("ngram-mod,draft-simple": the n-gram lookup first)."""
        with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8", delete=False) as f:
            f.write(prompt + "\n")  # llama.cpp drops one trailing newline of a prompt file
            path = f.name
        try:
            if kind == "speculative":
                drafter = (["-md", self.draft, "-ngld", self.draft_gpu_layers, "--spec-type", spec_type]
                           if self.draft else ["--spec-type", "draft-mtp"])
                argv = [str(self.speculative), *self._common(path, max_tokens), *drafter, "--spec-draft-n-max", str(k),
                        "--spec-draft-n-min", "0", "--spec-draft-p-min", f"{p_min:g}"]
                return self._run(argv, parse_speculative, prompt)
            argv = [str(self.completion), *self._common(path, max_tokens), "-no-cnv", "--perf"]
            return self._run(argv, parse_completion, prompt)
        finally:
            os.unlink(path)

    def describe(self) -> dict[str, Any]:
        return {"bin": str(self.dir), "repack": self.repack, "gpu_layers": self.gpu_layers,
                "draft_gpu_layers": self.draft_gpu_layers, "speculative": SPECULATIVE, "target_only": COMPLETION,
                "sampling": self.sampling}
