"""GGUF files other tools already downloaded on this machine, found read-only.

- llama.cpp's ``-hf`` cache: ``$LLAMA_CACHE``, else ``$XDG_CACHE_HOME/llama.cpp``, else
  ``~/.cache/llama.cpp``. Older llama.cpp builds keep flat files there
  (``owner_repo_file.gguf``); newer ones lay it out as Hugging Face's hub cache
  (``models--owner--repo/snapshots/<commit>/file.gguf``). Both are listed.
- ollama's store: ``$OLLAMA_MODELS``, else ``~/.ollama/models``. A manifest
  (``manifests/<registry>/<namespace>/<model>/<tag>``, JSON) names its weights layer
  (media type ``application/vnd.ollama.image.model``) by digest; the layer is the GGUF file
  ``blobs/sha256-<hex>``.

Nothing here writes or moves a file: the paths listed are the files themselves, usable with
``-m`` / ``-d`` as they are.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

GGUF_MAGIC = b"GGUF"
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_REGISTRY = "registry.ollama.ai"


@dataclass(frozen=True)
class LocalFile:
    name: str  # how the tool names it (owner/repo/file, or ollama's model:tag)
    path: Path  # the file itself
    size_bytes: int


def llama_cpp_cache() -> Path:
    if os.environ.get("LLAMA_CACHE"):
        return Path(os.environ["LLAMA_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "llama.cpp"


def ollama_store() -> Path:
    return Path(os.environ.get("OLLAMA_MODELS") or "~/.ollama/models").expanduser()


def _is_gguf(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def llama_cpp_ggufs(root: Path | None = None) -> list[LocalFile]:
    """GGUF files in llama.cpp's ``-hf`` cache, in either layout."""
    root = llama_cpp_cache() if root is None else root
    if not root.is_dir():
        return []
    out = []
    for path in sorted(root.rglob("*.gguf")):
        rel = path.relative_to(root).parts
        if rel[0].startswith("models--") and len(rel) >= 4 and rel[1] == "snapshots":  # hub layout
            name = "/".join([rel[0][len("models--"):].replace("--", "/"), *rel[3:]])
        elif len(rel) == 1:
            name = rel[0]  # flat layout: owner_repo_file.gguf
        else:
            name = "/".join(rel)
        if _is_gguf(path):
            out.append(LocalFile(name, path, path.stat().st_size))
    return out


def _ollama_name(manifest: Path, root: Path) -> str:
    registry, namespace, model, tag = manifest.relative_to(root).parts[-4:]
    name = model if namespace == "library" else f"{namespace}/{model}"
    return (name if registry == OLLAMA_REGISTRY else f"{registry}/{name}") + f":{tag}"


def ollama_ggufs(store: Path | None = None) -> list[LocalFile]:
    """ollama's models whose weights are a GGUF blob, by ollama's name (``llama3.2:1b``)."""
    store = ollama_store() if store is None else store
    manifests = store / "manifests"
    if not manifests.is_dir():
        return []
    out = []
    for manifest in sorted(p for p in manifests.rglob("*") if p.is_file()):
        if len(manifest.relative_to(manifests).parts) < 4:
            continue
        try:
            layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers", [])
        except (OSError, ValueError, AttributeError):
            continue  # not a manifest: skip it, as ollama would
        for layer in layers:
            if not isinstance(layer, dict) or layer.get("mediaType") != OLLAMA_MODEL_LAYER:
                continue
            blob = store / "blobs" / str(layer.get("digest", "")).replace(":", "-")
            if _is_gguf(blob):
                out.append(LocalFile(_ollama_name(manifest, manifests), blob, blob.stat().st_size))
    return out
