"""Function-preserving growth of a trained llama: wider, deeper, then lightly perturbed.

Used to make the cost-realistic pair (see models/README.md): a big synthetic target whose text
is still the trained tiny model's, at the cost of a big model's forward pass.

Starting from the llama.cpp tensors of a model with width d (``gguf_tensors`` layout: q/k rows
already in llama.cpp's rotary order), with ``Q`` a random (D, d) matrix with orthonormal
columns and ``r = d / D``:

- residual stream: h' = Q h. Embeddings E' = E Q^T; every matrix that writes into the residual
  (attn_output, ffn_down) is left-multiplied by Q. The stream is dense in all D dimensions.
- RMSNorm: mean(h'^2) over D is r * mean(h^2) over d, so each norm gets the uniform weight
  sqrt(r), its original weight g is folded into the matrices that read it (W diag(g) Q^T), and
  the epsilon becomes eps * r. The result is exact, not approximate.
- extra attention heads (same head size, same query/KV grouping) and extra FFN units get random
  read weights (q, k, v, gate, up) of the original's scale and zero write weights (their
  columns of attn_output / ffn_down), so they compute but contribute nothing.
- extra blocks (identity blocks) are placed between the original ones: random read weights,
  zero write weights.
- perturbation: Gaussian noise with standard deviation ``noise`` times the original tensor
  kind's RMS (per kind: attn_q, ffn_down, ...) added to every block matrix, zero ones included
  (embeddings, output head and norms are left alone). This
  is the one knob that sets how often the grown model's greedy token differs from the
  original's. noise = 0 gives the original model's logits (to float rounding).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from fly_cpp.models import convert

from fly_cpp.basics.errors import FlyError

PathLike = str | os.PathLike[str]
_READ = ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up")
_WRITE = ("attn_output", "ffn_down")


@dataclass(frozen=True)
class Growth:
    """Target shape and perturbation of a grown model (n_head follows from n_embd)."""

    n_embd: int
    n_ff: int
    n_layer: int
    noise: float = 0.0
    seed: int = 0


class _Layout:
    """What both growths read of the source and make of the shape ``g`` (checked here): the
    sizes, each tensor kind's scale in the original (norm weights folded into the matrices that
    read the norm), where the original blocks go, and the grown hparams."""

    def __init__(self, hparams: dict[str, Any], tensors: dict[str, np.ndarray], g: Growth) -> None:
        d, f, n_layer = hparams["n_embd"], hparams["n_ff"], hparams["n_layer"]
        head_dim, n_head, n_head_kv = hparams["head_dim"], hparams["n_head"], hparams["n_head_kv"]
        group = n_head // n_head_kv
        if g.n_embd < d or g.n_ff < f or g.n_layer < n_layer:
            raise FlyError(f"cannot shrink: model is {d} wide, {f} ff, {n_layer} layers; asked {g.n_embd}, {g.n_ff}, {g.n_layer}")
        if g.n_embd % (head_dim * group):
            raise FlyError(f"n_embd {g.n_embd} must be a multiple of head_dim x group = {head_dim * group}")
        if head_dim * n_head != d:
            raise FlyError("growth needs n_head x head_dim == n_embd")
        self.tensors, self.d, self.D, self.F, self.L = tensors, d, g.n_embd, g.n_ff, g.n_layer
        H = self.D // head_dim
        self.H, self.H_kv, self.r = H, H // group, d / self.D
        # (rows, cols) of each block matrix kind
        self.shape = {"attn_q": (H * head_dim, self.D), "attn_k": (self.H_kv * head_dim, self.D),
                      "attn_v": (self.H_kv * head_dim, self.D), "ffn_gate": (self.F, self.D), "ffn_up": (self.F, self.D),
                      "attn_output": (self.D, H * head_dim), "ffn_down": (self.D, self.F)}
        self.scale = {k: float(np.sqrt(np.mean([np.mean(self.folded(i, k) ** 2) for i in range(n_layer)])))
                      for k in _READ + _WRITE}
        self.place = [round(i * self.L / n_layer) for i in range(n_layer)]  # original block i goes to place[i]
        self.embd = tensors["token_embd.weight"]
        self.head = tensors.get("output.weight", self.embd) * tensors["output_norm.weight"][None, :]
        self.hparams = {**hparams, "n_embd": self.D, "n_ff": self.F, "n_layer": self.L, "n_head": H,
                        "n_head_kv": self.H_kv, "rms_eps": hparams["rms_eps"] * self.r}

    def folded(self, i: int, kind: str) -> np.ndarray:
        """Block ``i``'s ``kind`` matrix, the norm it reads folded in (a write matrix as it is)."""
        w = self.tensors[f"blk.{i}.{kind}.weight"]
        norm = "attn_norm" if kind.startswith("attn") else "ffn_norm"
        return w * self.tensors[f"blk.{i}.{norm}.weight"][None, :] if kind in _READ else w

    def source(self, j: int) -> int | None:
        """The original block at grown position ``j`` (None: an identity block)."""
        return self.place.index(j) if j in self.place else None


def grow(hparams: dict[str, Any], tensors: dict[str, np.ndarray], g: Growth) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Grow llama.cpp tensors (float32, ``convert.gguf_tensors`` layout) to the shape ``g``.
    Returns the new hparams and tensors (float32)."""
    lay = _Layout(hparams, tensors, g)
    d, D, r, scale = lay.d, lay.D, lay.r, lay.scale
    rng = np.random.default_rng(g.seed)
    q_basis = np.linalg.qr(rng.standard_normal((D, d)))[0]  # (D, d), orthonormal columns

    def read(kind: str, src: np.ndarray | None) -> np.ndarray:
        out = rng.standard_normal((lay.shape[kind][0], D)) * scale[kind] * np.sqrt(d / D)  # same output scale
        if src is not None:
            out[: src.shape[0]] = src @ q_basis.T
        return out

    def write(kind: str, src: np.ndarray | None) -> np.ndarray:
        out = np.zeros(lay.shape[kind])
        if src is not None:
            out[:, : src.shape[1]] = q_basis @ src
        return out

    new: dict[str, np.ndarray] = {}
    new["token_embd.weight"] = lay.embd @ q_basis.T
    new["output_norm.weight"] = np.full(D, np.sqrt(r))
    new["output.weight"] = lay.head @ q_basis.T
    for j in range(lay.L):
        i = lay.source(j)
        for kind in _READ:
            new[f"blk.{j}.{kind}.weight"] = read(kind, None if i is None else lay.folded(i, kind))
        for kind in _WRITE:
            new[f"blk.{j}.{kind}.weight"] = write(kind, None if i is None else lay.folded(i, kind))
        new[f"blk.{j}.attn_norm.weight"] = np.full(D, np.sqrt(r))
        new[f"blk.{j}.ffn_norm.weight"] = np.full(D, np.sqrt(r))
    if g.noise:
        for j in range(lay.L):
            for kind in _READ + _WRITE:
                w = new[f"blk.{j}.{kind}.weight"]
                w += rng.standard_normal(w.shape) * (g.noise * scale[kind])
    return lay.hparams, {k: v.astype(np.float32) for k, v in new.items()}


def grow_checkpoint(src: PathLike, out: PathLike, g: Growth, *, dtype: str = "f16", name: str | None = None) -> Path:
    """Grow the Hugging Face llama checkpoint ``src`` and write it as GGUF ``out``."""
    config, tensors = convert.load_checkpoint(src)
    hparams = convert.hparams_of(config)
    grown, new = grow(hparams, convert.gguf_tensors(config, tensors), g)
    label = name or f"{Path(src).resolve().name}-grown-{g.n_embd}x{g.n_layer}"
    return convert.write_llama(out, grown, convert.tokenizer_fields(src, config), new, name=label, dtype=dtype,
                               extra={"fly_cpp.synthetic": f"grown from {Path(src).resolve().name}: {g}"})


def grow_large(src: PathLike, out: PathLike, g: Growth, *, dtype: str = "f16", name: str | None = None) -> Path:
    """``grow_checkpoint`` for a model too large to hold in memory (an 8B-class target: 16 GB
    in F16, 32 GB as grow()'s float32, twice that in its float64 steps): the same growth, made
    and written one tensor at a time in float32. Each tensor draws its own random numbers
    (seeded by ``g.seed`` and its place in the file), and one draw each: a new read weight and
    its noise are one Gaussian of their summed variance, a copied one gets the noise alone. So
    its numbers are not grow()'s (the pairs made with grow() keep theirs), the function and the
    statistics are."""
    config, tensors = convert.load_checkpoint(src)
    lay = _Layout(convert.hparams_of(config), convert.gguf_tensors(config, tensors), g)
    d, D, r = lay.d, lay.D, lay.r
    basis = np.linalg.qr(np.random.default_rng([g.seed, 0]).standard_normal((D, d)))[0].astype(np.float32)

    def block(j: int, kind: str) -> Callable[[np.random.Generator], np.ndarray]:
        i, noise = lay.source(j), g.noise * lay.scale[kind]

        def make_it(rng: np.random.Generator) -> np.ndarray:
            rows, cols = lay.shape[kind]
            src = None if i is None else lay.folded(i, kind)
            if kind in _READ:  # new rows: a read weight of the original's scale, and the noise
                std = np.full((rows, 1), np.sqrt(lay.scale[kind] ** 2 * d / D + noise ** 2), dtype=np.float32)
                if src is not None:
                    std[: src.shape[0]] = noise
                w = rng.standard_normal((rows, cols), dtype=np.float32) * std
                if src is not None:
                    w[: src.shape[0]] += src @ basis.T
            else:  # zero write weights, and the noise
                w = rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(noise)
                if src is not None:
                    w[:, : src.shape[1]] += basis @ src
            return w
        return make_it

    def norm(rng: np.random.Generator) -> np.ndarray:
        return np.full(D, np.sqrt(r), dtype=np.float32)

    # name -> (shape, maker), in the file's order
    makers: dict[str, tuple[tuple[int, ...], Callable[[np.random.Generator], np.ndarray]]] = {
        "token_embd.weight": ((lay.embd.shape[0], D), lambda rng: lay.embd @ basis.T),
        "output_norm.weight": ((D,), norm),
        "output.weight": ((lay.head.shape[0], D), lambda rng: lay.head @ basis.T)}
    for j in range(lay.L):
        for kind in _READ + _WRITE:
            makers[f"blk.{j}.{kind}.weight"] = (lay.shape[kind], block(j, kind))
        for kind in ("attn_norm", "ffn_norm"):
            makers[f"blk.{j}.{kind}.weight"] = ((D,), norm)
    label = name or f"{Path(src).resolve().name}-grown-{g.n_embd}x{g.n_layer}"
    writer = convert.llama_writer(out, lay.hparams, convert.tokenizer_fields(src, config), name=label, dtype=dtype,
                                  extra={"fly_cpp.synthetic": f"grown from {Path(src).resolve().name}: {g}"})
    # as write_llama stores them: matrices as ``dtype``, vectors as f32
    store = {name: np.dtype(np.float16 if dtype == "f16" and len(dim) == 2 else np.float32)
             for name, (dim, _) in makers.items()}
    for tname, (dim, _) in makers.items():
        writer.add_tensor_info(tname, dim, store[tname], int(np.prod(dim)) * store[tname].itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()

    def made(n: int, tname: str) -> np.ndarray:
        return np.ascontiguousarray(makers[tname][1](np.random.default_rng([g.seed, n])), dtype=store[tname])

    # numpy draws and converts without the GIL: the tensors are made on every core, a few ahead
    # of the one being written, in the file's order
    workers = os.cpu_count() or 1
    with ThreadPoolExecutor(workers) as pool:
        ahead: deque[Future[np.ndarray]] = deque()
        for n, tname in enumerate(makers, start=1):
            ahead.append(pool.submit(made, n, tname))
            if len(ahead) > workers:
                writer.write_tensor_data(ahead.popleft().result())
        while ahead:
            writer.write_tensor_data(ahead.popleft().result())
    writer.close()
    return Path(out)
