"""Real tokenizers for synthetic models: llama.cpp's vocabulary-only GGUF files.

llama.cpp ships vocabularies of real models for its tokenizer tests (``models/ggml-vocab-*.gguf``
in its sources, and in the llama-cpp-python sdist that vendors them). A vocabulary is found, in
order:

- in this repository's ``tests/data`` (xz-compressed copies, for the tests and a source checkout);
- among the shared assets next to the project (``$FLY_CPP_SHARED/tokenizers``, else ``../shared``);
- in the llama-cpp-python sdist of the installed version, downloaded with pip's own client
  (``pip download --no-binary``: the user's index and proxy apply, and pip's cache keeps it).

Found files are checked against the sha256 pinned here and unpacked into the kit's cache.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from fly_cpp.models.pypi_parts import PIP_RETRIES, PIP_TIMEOUT_S

from fly_cpp.basics.errors import FlyError

SHA256 = {"qwen35": "63ed952ff338996cf0bdf24a7b10015124273f75c6dc9bb427356aa3f67ec62c"}
REPO = Path(__file__).resolve().parents[1]
_UNREACHABLE = re.compile(r"NewConnectionError|NameResolutionError|Failed to establish|timed out|ProxyError",
                          re.IGNORECASE)


def file_name(name: str) -> str:
    return f"ggml-vocab-{name}.gguf"


def vocab(name: str, cache: Path) -> Path:
    """The vocabulary ``name`` (e.g. "qwen35") as a GGUF file in ``cache``, found or fetched once."""
    if name not in SHA256:
        raise FlyError(f"no pinned vocabulary {name!r} (known: {', '.join(SHA256)})")
    out = cache / file_name(name)
    if out.exists() and _sha256(out) == SHA256[name]:
        return out
    cache.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".partial")
    try:
        _find(name, tmp)
        if _sha256(tmp) != SHA256[name]:
            raise FlyError(f"{file_name(name)}: sha256 {_sha256(tmp)[:16]}... is not the pinned {SHA256[name][:16]}...")
        tmp.rename(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _find(name: str, out: Path) -> None:
    packed = REPO / "tests" / "data" / (file_name(name) + ".xz")
    if packed.exists():
        with lzma.open(packed) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
        return
    shared = Path(os.environ.get("FLY_CPP_SHARED", REPO.parent / "shared")) / "tokenizers" / file_name(name)
    if shared.exists():
        shutil.copyfile(shared, out)
        return
    _from_sdist(name, out)


def _from_sdist(name: str, out: Path) -> None:
    """Unpack the vocabulary from the sdist of the installed llama-cpp-python (pip downloads it once)."""
    from importlib.metadata import version

    requirement = f"llama-cpp-python=={version('llama-cpp-python')}"
    with tempfile.TemporaryDirectory(prefix="fly-cpp-sdist-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-input",
               "--disable-pip-version-check", "--progress-bar", "off", "--timeout", str(PIP_TIMEOUT_S),
               "--retries", str(PIP_RETRIES), "--dest", tmp, requirement]
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
        except OSError as e:
            raise FlyError(f"could not run pip to download {requirement}: {e}") from None
        sdists = list(Path(tmp).glob("*.tar.gz"))
        if run.returncode != 0 or len(sdists) != 1:
            text = run.stdout + run.stderr
            reason = ("the package index could not be reached" if _UNREACHABLE.search(text)
                      else f"pip exited with status {run.returncode}")
            raise FlyError(f"{file_name(name)} is not in this checkout, and downloading the {requirement} sdist "
                           f"that carries it failed: {reason}")
        with tarfile.open(sdists[0]) as tar:
            member = next((m for m in tar.getmembers() if m.name.endswith("/vendor/llama.cpp/models/"
                                                                           + file_name(name))), None)
            src = tar.extractfile(member) if member is not None else None
            if src is None:
                raise FlyError(f"the {requirement} sdist holds no {file_name(name)}")
            with src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
