"""The pairs the kit makes locally, with no download beyond the tiny source checkpoint.

- ``stories260k``: the bundled pair (stories260K, 5 layers x 64, and its Q4_0 copy).
- ``tinystories``: tinystories-656k converted to GGUF (2 layers x 128, F32) and its Q4_0 copy.
- ``costly`` (SYNTHETIC): the cost-realistic pair for CPU speed work. Target: tinystories-656k
  grown to 24 layers x 1024 (64 heads, FFN 2816; ~284M parameters, F16, ~575 MB) and perturbed
  (noise 0.045, seed 1) so that it agrees with its draft on about 80% of greedy tokens. Draft:
  the same model grown to 4 layers x 512 (FFN 1536; ~15M parameters, F16) with no noise, i.e.
  the trained model's own function. See widen.py and models/README.md.

Pairs are built on demand into ``cache_root()/NAME`` (``$FLY_CPP_CACHE`` or
``~/.cache/fly-cpp/pairs``), deterministically from their recipe; a pair is rebuilt when its
recipe changes (the recipe is stored next to the files).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from fly_cpp.errors import FlyError
from fly_cpp.models import bundled, convert, make, widen

PathLike = str | os.PathLike[str]
SOURCE_REPO = "raincandy-u/TinyStories-656K"  # the hub copy of the tinystories-656k checkpoint
SYNTHETIC_KEY = "fly_cpp.synthetic"

COSTLY_TARGET = widen.Growth(n_embd=1024, n_ff=2816, n_layer=24, noise=0.045, seed=1)
COSTLY_DRAFT = widen.Growth(n_embd=512, n_ff=1536, n_layer=4, noise=0.0, seed=2)


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


def _plan(name: str, root: Path, tg: widen.Growth, dg: widen.Growth
          ) -> tuple[dict[str, object], Path, Path, dict[str, Callable[[Path], object]]]:
    """(recipe, target, draft, builders) of the local pair ``name`` in ``root``."""
    if name == "tinystories":
        target, draft = root / "tinystories-656k.gguf", root / "tinystories-656k-q4_0.gguf"
        return {"pair": name, "version": 1}, target, draft, {
            target.name: lambda p: convert.convert_hf_llama(tinystories_source(), p, name="tinystories-656k"),
            draft.name: lambda p: make.quantize(target, p, "Q4_0"),
        }
    target, draft = root / "costly-target-synthetic.gguf", root / "costly-draft-synthetic.gguf"
    recipe = {"pair": name, "version": 1, "source": "tinystories-656k", "target": asdict(tg), "draft": asdict(dg),
              "dtype": "f16"}
    return recipe, target, draft, {
        target.name: lambda p: widen.grow_checkpoint(tinystories_source(), p, tg, name="costly-target (synthetic)"),
        draft.name: lambda p: widen.grow_checkpoint(tinystories_source(), p, dg, name="costly-draft (synthetic)"),
    }


def _is_built(root: Path, recipe: dict[str, object], files: Iterable[str]) -> bool:
    stamp = root / "recipe.json"
    return stamp.exists() and stamp.read_text() == _recipe_text(recipe) and all((root / f).exists() for f in files)


def make_pair(name: str, out: PathLike | None = None, *, force: bool = False,
              target_growth: widen.Growth | None = None, draft_growth: widen.Growth | None = None) -> LocalPair:
    """Build (or find built) the local pair ``name`` in ``out`` (default ``cache_root()/name``),
    unless it is there with this very recipe. ``target_growth`` / ``draft_growth`` override the
    costly pair's shapes and noise (tests build it small)."""
    if name not in PAIRS:
        raise FlyError(f"unknown local pair {name!r} (known: {', '.join(PAIRS)})")
    if name == "stories260k":
        return LocalPair(name, bundled.TARGET, bundled.DRAFT, False, bundled.N_CTX, PAIRS[name])
    root = Path(out) if out is not None else cache_root() / name
    recipe, target, draft, builders = _plan(name, root, target_growth or COSTLY_TARGET, draft_growth or COSTLY_DRAFT)
    if force or not _is_built(root, recipe, builders):
        root.mkdir(parents=True, exist_ok=True)
        (root / "recipe.json").unlink(missing_ok=True)
        for file, build in builders.items():
            tmp = root / (file + ".partial")
            build(tmp)
            tmp.rename(root / file)
        (root / "recipe.json").write_text(_recipe_text(recipe))
    return LocalPair(name, target, draft, name == "costly", 512, PAIRS[name])


def built(name: str) -> LocalPair | None:
    """The local pair ``name`` if it is built in the default cache with the current recipe
    (builds nothing)."""
    if name == "stories260k":
        return make_pair(name)
    if name not in PAIRS:
        return None
    root = cache_root() / name
    recipe, target, draft, builders = _plan(name, root, COSTLY_TARGET, COSTLY_DRAFT)
    if not _is_built(root, recipe, builders):
        return None
    return LocalPair(name, target, draft, name == "costly", 512, PAIRS[name])


def remove(name: str) -> None:
    shutil.rmtree(cache_root() / name, ignore_errors=True)


PAIRS = {
    "stories260k": "bundled: stories260K (260K params, trained) + its Q4_0 copy",
    "tinystories": "tinystories-656k converted from Hugging Face (656K params, trained) + its Q4_0 copy",
    "costly": "SYNTHETIC cost-realistic pair: tinystories-656k grown to 24x1024 (~284M params, F16) and "
              "perturbed, + the same model grown to 4x512 (~15M params, F16) unperturbed; ~80% greedy agreement",
}

