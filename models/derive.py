"""Drafts derived from any target: quantized copies and first-N-layer copies, each with its
greedy agreement with the target (``measure.greedy_agreement``).

A quantization type is skipped, with the reason, when the target's tensor shapes forbid it:
no weight row is a whole number of the type's blocks (32 values for the legacy types, 256 for
K-quants), so llama.cpp would store every tensor in some fallback type and the copy would not
be what its name says. When only some tensors do not fit (stories260K's 172-wide FFN), the
copy is made and its note names the tensors llama.cpp stores in another type.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import gguf
from fly_cpp.models import make, measure

from fly_cpp.basics.errors import FlyError

PathLike = str | os.PathLike[str]

BLOCK = {"Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q8_0": 32,
         "Q2_K": 256, "Q3_K_S": 256, "Q3_K_M": 256, "Q3_K_L": 256, "Q4_K_S": 256, "Q4_K_M": 256,
         "Q5_K_S": 256, "Q5_K_M": 256, "Q6_K": 256}
DEFAULT_QUANTS = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0")
_FLOAT_TYPES = {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16}


@dataclass(frozen=True)
class Derived:
    """One derived draft: ``path`` is None when it was skipped (``note`` says why)."""

    name: str
    kind: str  # "quant" or "layers"
    path: Path | None
    note: str = ""
    agreement: float | None = None
    size_bytes: int | None = None


def _weight_rows(src: PathLike) -> dict[str, tuple[int, bool]]:
    """name -> (row length, stored as float) of every 2-D tensor (ggml order: shape[0] is the row)."""
    reader = gguf.GGUFReader(str(src))
    return {t.name: (int(t.shape[0]), t.tensor_type in _FLOAT_TYPES) for t in reader.tensors if len(t.shape) >= 2}


def quant_obstacle(src: PathLike, qtype: str) -> str | None:
    """Why ``src`` cannot be quantized to ``qtype`` (None when it can, perhaps with fallbacks)."""
    qtype = qtype.upper()
    if qtype not in BLOCK:
        return f"unknown type (known: {', '.join(BLOCK)})"
    rows = _weight_rows(src)
    quantized = [name for name, (_, is_float) in rows.items() if not is_float]
    if quantized:
        return f"already quantized ({quantized[0]}); derive from a float model"
    if not any(row % BLOCK[qtype] == 0 for row, _ in rows.values()):
        sizes = ", ".join(str(r) for r in sorted({row for row, _ in rows.values()}))
        return f"no weight row is a multiple of the {BLOCK[qtype]}-value block (rows hold {sizes} values)"
    return None


def quant_fallbacks(src: PathLike, qtype: str) -> list[str]:
    """Tensors llama.cpp will store in another type than ``qtype`` (rows not a whole number of blocks)."""
    block = BLOCK[qtype.upper()]
    return [name for name, (row, _) in _weight_rows(src).items() if row % block]


def derive(target: PathLike, out_dir: PathLike, *, quants: Iterable[str] = DEFAULT_QUANTS,
           layers: Iterable[int] = (), agree: bool = True, n_threads: int = 0, n_ctx: int = 512,
           prompts: Sequence[str] = measure.PROMPTS, n_tokens: int = 48) -> list[Derived]:
    """Write derived drafts of ``target`` into ``out_dir`` (existing files are reused) and
    measure each one's greedy agreement with the target when ``agree``."""
    target = Path(target)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = target.name.removesuffix(".gguf")
    results: list[Derived] = []
    for qtype in quants:
        qtype = qtype.upper()
        name = f"{stem}-{qtype.lower()}.gguf"
        reason = quant_obstacle(target, qtype)
        if reason:
            results.append(Derived(name, "quant", None, f"skipped: {reason}"))
            continue
        path = out / name
        if not path.exists():
            make.quantize(target, path.with_suffix(".partial"), qtype)
            path.with_suffix(".partial").rename(path)
        fallback = quant_fallbacks(target, qtype)
        note = qtype + (f", {len(fallback)} tensors in another type (e.g. {fallback[0]})" if fallback else "")
        results.append(Derived(name, "quant", path, note))
    for n in layers:
        name = f"{stem}-first{n}.gguf"
        path = out / name
        try:
            if not path.exists():
                make.cut_layers(target, path.with_suffix(".partial"), n)
                path.with_suffix(".partial").rename(path)
        except FlyError as e:
            results.append(Derived(name, "layers", None, f"skipped: {e}"))
            continue
        results.append(Derived(name, "layers", path, f"first {n} layers"))
    if agree:
        results = [_with_agreement(target, d, prompts, n_tokens, n_threads, n_ctx) for d in results]
    return results


def _with_agreement(target: Path, d: Derived, prompts: Sequence[str], n_tokens: int, n_threads: int,
                    n_ctx: int) -> Derived:
    if d.path is None:
        return d
    rate = measure.greedy_agreement(target, d.path, prompts, n_tokens=n_tokens, n_threads=n_threads, n_ctx=n_ctx).rate
    return Derived(d.name, d.kind, d.path, d.note, rate, d.path.stat().st_size)
