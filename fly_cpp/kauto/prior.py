"""k auto's prior: what a pair's decodes cost before any of them is timed, from what the GGUF
headers say (bytes, parameters, layers, width, where the layers went) and what this machine has
already learned for other models, so that a first answer starts at once instead of waiting for a
calibration (45-75 s on the Qwen pair on a 2-core CPU, for a 3-s answer).

A decode of n rows reads the model's weights once and does each row's arithmetic: on a CPU a
one-row decode is the read (``per_byte`` seconds a byte of the file), a batch reads again beyond it
(``SECOND_ROW``: the batched kernels, ~0.4 of a one-row decode) and pays ``per_param`` seconds a
parameter for each row; every decode pays ``Machine.per_layer`` a layer besides (a tiny model's
whole cost). Fitted on this project's 2-core CPU at 2 threads (``REFERENCE``) to the
F16 and Q4_K_M Qwen2.5-Coder targets and their 0.5B Q4_K_M draft, measured by the calibration
this replaces (tests/data/replays): within 8% of both targets' measured curves at 1, 2, 4 and 17
rows, the draft's one-row decode 0.85x and its batches about 0.7x. Each further token of
context adds ``PER_DEPTH`` of a parameter-row a row (a decode attends over the cache).

Where the machine has already learned a model's curve (the same file loaded alike, in another
pair: the Q4_K_M and F16 pairs share their draft), that curve is the prior for it; where it has
learned others', their per-byte and per-parameter prices, as fitted from those curves, replace
the reference machine's. A layer offloaded to a local GPU costs ``GPU_SHARE`` of its CPU read and
its rows are nearly free (the shape of ``tests/data/replays/gpu-shaped.json``, assumed).

The prior is only where k auto starts: every decode it runs anyway teaches the prices
(``Costs``: the first warm decodes of each kind set the scales, then each one moves them), and
what the answers taught is cached for the next process (``fly_cpp.kauto.calibrate.store_live``)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from fly_cpp.kauto.costcache import LARGEST_TIMED
from fly_cpp.kauto.costs import Curve

TARGET_ROWS = (1, 2, 3, 4, 6, 8, 12, 17)  # the sizes a target's prior curve is written at (a calibration's)
DRAFT_ROWS = tuple(2 ** i for i in range(LARGEST_TIMED.bit_length()))  # ... a draft model's: 1, 2, 4, ... 32
# a batch's decode over a one-row one, beyond its rows' arithmetic: 0.41 (F16 1.5B), 0.33 (its Q4_K_M),
# 0.50 (the 0.5B Q4_K_M draft), CPU-2's calibrations at 2 threads (tests/data/replays)
SECOND_ROW = 0.4
# of a parameter-row, what one more token of context adds to a row's decode (the targets' depth slopes:
# 4-6 us a row per token at 17 ms a row)
PER_DEPTH = 3.0e-4
# seconds a decode costs a layer on one thread whatever its size (its graph's ops): a tiny model's
# decodes are made of it (stories260K, 5 layers: ~0.1 ms a decode at 1 thread); with more threads
# ``Machine.per_layer`` (their barriers: 0.3 ms a layer at 2 threads on CPU-2)
PER_LAYER = 2e-5
GPU_SHARE = 0.02  # an offloaded layer's read beside the CPU's (assumed: an H100's ~3 TB/s beside ~40 GB/s)


@dataclass(frozen=True)
class Machine:
    """What this machine's decodes cost: seconds a byte of weights read (a one-row decode),
    seconds a parameter for each row's arithmetic, and seconds a layer whatever its size (its
    ops and the threads' barriers between them), at ``threads`` threads."""

    per_byte: float
    per_param: float
    per_layer: float
    threads: int

    def at(self, threads: int) -> Machine:
        """These prices at ``threads`` threads: the arithmetic shares them out, the reads only
        as far as the memory bus lets (assumed: as their square root); one thread has no barriers."""
        if threads <= 0 or threads == self.threads:
            return self
        ratio = self.threads / threads
        return Machine(self.per_byte * ratio ** 0.5, self.per_param * ratio,
                       PER_LAYER if threads == 1 else self.per_layer, threads)


# CPU-2 (AMD EPYC, AVX-512) at 2 threads, fitted to the calibrations of tests/data/replays: the F16
# target's (3.55 GB, 1.78e9 parameters, 28 layers: 82 ms a row, 16.3 ms a row more from 2 to 17 rows)
# and the Q4_K_M target's (1.11 GB: 30 ms, 16.8 ms a row more): the prior is within 8% of both at 1,
# 2, 4 and 17 rows; the 0.5B draft's one-row decode 0.85x, its batches 0.7x
REFERENCE = Machine(per_byte=2.0e-11, per_param=0.95e-11, per_layer=3.0e-4, threads=2)


@dataclass(frozen=True)
class Shape:
    """What of a model the prior prices it by (its GGUF header, and where its layers went)."""

    bytes: int
    params: int
    layers: int
    offloaded: int = 0  # layers on a local GPU

    def as_dict(self) -> dict[str, int]:
        return {"bytes": self.bytes, "params": self.params, "layers": self.layers, "offloaded": self.offloaded}

    @classmethod
    def from_dict(cls, d: object) -> Shape | None:
        """The shape ``as_dict`` wrote, or None for anything else."""
        if not isinstance(d, dict):
            return None
        try:
            return cls(int(d["bytes"]), int(d["params"]), int(d["layers"]), int(d.get("offloaded", 0)))
        except (KeyError, TypeError, ValueError):
            return None

    @property
    def gpu(self) -> float:
        """The share of its layers on a GPU."""
        return min(self.offloaded / self.layers, 1.0) if self.layers > 0 else 0.0


def curve(shape: Shape, machine: Machine, rows: Sequence[int]) -> Curve:
    """The prior curve of a model of ``shape`` on ``machine``: a one-row decode reads the
    weights, a batch reads ``SECOND_ROW`` more and pays each row's arithmetic; offloaded layers
    read at ``GPU_SHARE`` of the CPU's price and their rows a twentieth of that (a GPU computes
    ~1000x a CPU-2 core pair)."""
    cpu, gpu = 1 - shape.gpu, shape.gpu
    read = shape.bytes * machine.per_byte * (cpu + gpu * GPU_SHARE)
    row = shape.params * machine.per_param * (cpu + gpu * GPU_SHARE / 20)
    fixed = shape.layers * machine.per_layer * (cpu + gpu * GPU_SHARE)
    seconds = tuple(fixed + (read if r <= 1 else read * (1 + SECOND_ROW * cpu) + (r - 1) * row) for r in rows)
    per_token = tuple(r * row * PER_DEPTH for r in rows)
    return Curve(tuple(rows), seconds, 0, per_token)


def learned(shape: Shape, curve_: Curve, per_layer: float) -> tuple[float, float] | None:
    """(per_byte, per_param) as a measured CPU curve of a model of ``shape`` prices them: its
    one-row decode (less ``per_layer`` a layer) over its bytes, and its slope from its second
    size to its last over its parameters."""
    if shape.gpu > 0 or shape.bytes <= 0 or shape.params <= 0 or len(curve_.rows) < 3:
        return None
    (r0, s0), (r1, s1) = (curve_.rows[1], curve_.seconds[1]), (curve_.rows[-1], curve_.seconds[-1])
    slope = (s1 - s0) / (r1 - r0) if r1 > r0 else 0.0
    read = curve_.seconds[0] - shape.layers * per_layer
    if read <= 0 or slope <= 0:
        return None
    return read / shape.bytes, slope / shape.params


def machine(known: Sequence[tuple[str, int, Shape, Curve]], threads: int) -> Machine:
    """This machine's prices at ``threads``: the medians of what the curves it learned at these
    threads say (``known``, as ``known_curves`` reads them), else the reference machine's."""
    base = REFERENCE.at(threads)
    fits = [f for _, t, s, c in known if t == threads and (f := learned(s, c, base.per_layer)) is not None]
    if not fits:
        return base
    return Machine(statistics.median(f[0] for f in fits), statistics.median(f[1] for f in fits), base.per_layer,
                   threads)


def head(shape: Shape, n_vocab: int, n_embd: int) -> Shape:
    """An MTP head of a target of ``shape``: one of its layers and the output matrix over the
    vocabulary (on a small model the output matrix makes a step nearly a decode)."""
    per_param = shape.bytes / max(shape.params, 1)
    params = shape.params // max(shape.layers, 1) + n_vocab * n_embd
    return Shape(int(params * per_param), params, 1, 1 if shape.gpu >= 1 else 0)


def known_curves(entries: Mapping[str, Mapping[str, object]], machine_id: str,
                 parse: Callable[[object], Curve | None]) -> list[tuple[str, int, Shape, Curve]]:
    """The curves this machine has learned (cost-cache entries that recorded their models'
    ``basis``): each model's id (its file and loading, ``fly_cpp.kauto.costcache.model_id``), threads,
    shape and curve. ``parse``: the cache's curve reader."""
    out: list[tuple[str, int, Shape, Curve]] = []
    for entry in entries.values():
        basis = entry.get("basis")
        if not isinstance(basis, dict) or basis.get("machine") != machine_id:
            continue
        for role in ("target", "draft"):
            model = basis.get(role)
            if not isinstance(model, dict):
                continue
            shape = Shape.from_dict(model.get("shape"))
            c = parse(entry.get(role))
            if shape is not None and c is not None and isinstance(model.get("threads"), int):
                out.append((str(model.get("id")), int(model["threads"]), shape, c))
    return out


def of_model(model_id: str, shape: Shape, threads: int, rows: Sequence[int],
             known: Sequence[tuple[str, int, Shape, Curve]]) -> Curve:
    """A model's prior curve: the one this machine learned for it (the same file loaded alike,
    in another pair), else priced by its shape at this machine's prices (``machine``, from the
    CPU curves learned at these threads)."""
    for kid, kthreads, _, c in known:
        if kid == model_id and kthreads == threads:
            return c
    return curve(shape, machine(known, threads), rows)
