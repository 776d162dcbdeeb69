"""GGUF files from the Hugging Face hub, through huggingface-hub's own cache.

The cache location and offline mode are read from the environment at each call (HF_HUB_CACHE,
else HF_HOME/hub, else ~/.cache/huggingface/hub; HF_HUB_OFFLINE=1 never touches the network),
so a file downloaded once is found again by every later command, and machines without a
network work from a pre-filled cache. Downloads show huggingface-hub's progress bar.

The registry (``pairs.toml`` next to this file) names well-known target/draft pairs.
"""

from __future__ import annotations

import os
import re
import socket
import tomllib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from fly_cpp.basics.errors import FlyError

REGISTRY = Path(__file__).resolve().parent / "pairs.toml"
_TRUE = {"1", "on", "yes", "true"}


def cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def unreachable(timeout: float = 3.0) -> str | None:
    """Why the hub (or the HTTPS proxy in front of it) cannot be reached, in a few words; None
    when a TCP connection opens. Checked once before a download, because huggingface-hub
    retries a dead connection for about 25 seconds before giving up."""
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    url = urlsplit(proxy or os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        return f"cannot reach {host}:{port} ({e.strerror or e})"
    return None


@dataclass(frozen=True)
class HubFile:
    repo: str
    file: str
    revision: str | None = None

    def __str__(self) -> str:
        return f"{self.repo}/{self.file}" + (f"@{self.revision}" if self.revision else "")


def _check_repo(repo: str) -> None:
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise FlyError(f"not a Hugging Face repository id (owner/name): {repo!r}")


def pull(repo: str, file: str, *, revision: str | None = None) -> Path:
    """The local path of ``file`` from hub repository ``repo``, downloaded into the cache
    unless it is there already (offline, or with the hub out of reach: only from the cache)."""
    from huggingface_hub import errors, hf_hub_download

    _check_repo(repo)
    where = cache_dir()
    why = "HF_HUB_OFFLINE is set" if offline() else unreachable()
    try:
        path = hf_hub_download(repo, file, revision=revision, cache_dir=where, local_files_only=why is not None)
    except errors.LocalEntryNotFoundError:
        raise FlyError(f"{repo}/{file} is not in the Hugging Face cache at {where} and "
                       f"{why or 'the hub could not be reached'}") from None
    except errors.RepositoryNotFoundError:
        raise FlyError(f"Hugging Face repository {repo} not found (or private: set HF_TOKEN)") from None
    except errors.EntryNotFoundError:
        raise FlyError(f"file {file} not found in Hugging Face repository {repo}") from None
    except errors.HfHubHTTPError as e:
        raise FlyError(f"downloading {repo}/{file} failed: {str(e).splitlines()[0]}") from None
    except OSError as e:
        raise FlyError(f"downloading {repo}/{file} into {where} failed: {e}") from None
    return Path(path)


DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")  # llama.cpp's -hf picks these, in this order, when no quant is named
_SIDECARS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")  # GGUFs that are not a model
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


def split_tag(repo: str) -> tuple[str, str]:
    """``owner/name[:QUANT]`` -> (``owner/name``, ``QUANT`` or "")."""
    name, _, tag = repo.partition(":")
    _check_repo(name)
    return name, tag


def _is_model(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    if not name.lower().endswith(".gguf") or any(s in name for s in _SIDECARS):
        return False
    split = _SPLIT.search(name)
    return split is None or int(split.group(1)) == 1


def choose_file(files: list[str], tag: str) -> str | None:
    """The model file llama.cpp's ``-hf owner/name[:QUANT]`` picks among a repository's
    ``files``: the first GGUF whose name has the quant (case-insensitive) followed by '.' or
    '-' (the first part of a split model); with no quant, Q4_K_M, else Q8_0, else the first
    model GGUF. Projector, imatrix and speculative-head files are never picked."""
    models = [f for f in files if _is_model(f)]
    for quant in ([tag] if tag else DEFAULT_QUANTS):
        pattern = re.compile(re.escape(quant) + "[.-]", re.IGNORECASE)
        for f in models:
            if pattern.search(f):
                return f
    return None if tag or not models else models[0]


def repo_files(repo: str) -> list[str]:
    """The files of hub repository ``repo``: listed by the hub, or, offline or with the hub out
    of reach, those of its cached snapshots (as llama.cpp does)."""
    from huggingface_hub import HfApi, errors

    why = "HF_HUB_OFFLINE is set" if offline() else unreachable()
    if why is None:
        try:
            return list(HfApi().list_repo_files(repo))
        except errors.RepositoryNotFoundError:
            raise FlyError(f"Hugging Face repository {repo} not found (or private: set HF_TOKEN)") from None
        except Exception as e:  # any failure of the network or the hub: one line, no traceback
            raise FlyError(f"listing Hugging Face repository {repo} failed: {str(e).splitlines()[0]}") from None
    cached = sorted({f.file for f in cached_ggufs() if f.repo == repo})
    if not cached:
        raise FlyError(f"Hugging Face repository {repo} has no files in the cache at {cache_dir()} and {why}")
    return cached


def pull_tagged(repo_tag: str, file: str | None = None) -> Path:
    """``-hf owner/name[:QUANT]`` as llama.cpp reads it: ``file`` when given (it overrides the
    quant), else the file ``choose_file`` picks, downloaded once."""
    repo, tag = split_tag(repo_tag)
    if file is None:
        files = repo_files(repo)
        file = choose_file(files, tag)
        if file is None:
            ggufs = [f for f in files if f.lower().endswith(".gguf")]
            what = f"no GGUF file for quant {tag}" if tag else "no model GGUF file"
            raise FlyError(f"Hugging Face repository {repo} has {what}"
                           + (f" (files: {', '.join(ggufs[:8])}{', ...' if len(ggufs) > 8 else ''})" if ggufs else ""))
    return pull(repo, file)


@dataclass(frozen=True)
class CachedFile:
    repo: str
    file: str
    revision: str
    path: Path
    size_bytes: int


def cached_ggufs() -> list[CachedFile]:
    """GGUF files in the local Hugging Face cache (newest revision first within a repo)."""
    from huggingface_hub import CacheNotFound, scan_cache_dir

    try:
        info = scan_cache_dir(cache_dir())
    except CacheNotFound:
        return []
    out = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        for rev in sorted(repo.revisions, key=lambda r: -r.last_modified):
            for f in sorted(rev.files, key=lambda f: f.file_name):
                if f.file_name.endswith(".gguf"):
                    out.append(CachedFile(repo.repo_id, str(f.file_path.relative_to(rev.snapshot_path)),
                                          rev.commit_hash, f.file_path, f.size_on_disk))
    return out


@dataclass(frozen=True)
class HubPair:
    name: str
    target: HubFile
    draft: HubFile
    note: str = ""


def registry(path: Path = REGISTRY) -> dict[str, HubPair]:
    """The well-known pairs of ``pairs.toml``, by name."""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    pairs = {}
    for name, entry in data.items():
        try:
            pairs[name] = HubPair(name, HubFile(**entry["target"]), HubFile(**entry["draft"]), entry.get("note", ""))
        except (KeyError, TypeError) as e:
            raise FlyError(f"{path}: pair {name!r} is malformed ({e})") from None
    return pairs


def pull_pair(name: str) -> tuple[Path, Path]:
    """(target, draft) local paths of the registry pair ``name``, downloading what is missing."""
    pairs = registry()
    if name not in pairs:
        raise FlyError(f"unknown pair {name!r} (known: {', '.join(sorted(pairs))})")
    pair = pairs[name]
    return (pull(pair.target.repo, pair.target.file, revision=pair.target.revision),
            pull(pair.draft.repo, pair.draft.file, revision=pair.draft.revision))
