"""GGUF files from the Hugging Face hub, through huggingface-hub's own cache.

The cache location and offline mode are read from the environment at each call (HF_HUB_CACHE,
else HF_HOME/hub, else ~/.cache/huggingface/hub; HF_HUB_OFFLINE=1 never touches the network),
so a file downloaded once is found again by every later command, and machines without a
network work from a pre-filled cache. Downloads show huggingface-hub's progress bar.

The registry (``pairs.toml`` next to this file) names well-known target/draft pairs.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from fly_cpp.errors import FlyError

REGISTRY = Path(__file__).resolve().parent / "pairs.toml"
_TRUE = {"1", "on", "yes", "true"}


def cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


@dataclass(frozen=True)
class HubFile:
    repo: str
    file: str
    revision: str | None = None

    def __str__(self) -> str:
        return f"{self.repo}/{self.file}" + (f"@{self.revision}" if self.revision else "")


def pull(repo: str, file: str, *, revision: str | None = None) -> Path:
    """The local path of ``file`` from hub repository ``repo``, downloaded into the cache
    unless it is there already (offline: only from the cache)."""
    from huggingface_hub import errors, hf_hub_download

    if repo.count("/") != 1 or not all(repo.split("/")):
        raise FlyError(f"not a Hugging Face repository id (owner/name): {repo!r}")
    where = cache_dir()
    try:
        path = hf_hub_download(repo, file, revision=revision, cache_dir=where, local_files_only=offline())
    except errors.LocalEntryNotFoundError:
        how = "HF_HUB_OFFLINE is set" if offline() else "the hub could not be reached"
        raise FlyError(f"{repo}/{file} is not in the Hugging Face cache at {where} and {how}") from None
    except errors.RepositoryNotFoundError:
        raise FlyError(f"Hugging Face repository {repo} not found (or private: set HF_TOKEN)") from None
    except errors.EntryNotFoundError:
        raise FlyError(f"file {file} not found in Hugging Face repository {repo}") from None
    except errors.HfHubHTTPError as e:
        raise FlyError(f"downloading {repo}/{file} failed: {str(e).splitlines()[0]}") from None
    except OSError as e:
        raise FlyError(f"downloading {repo}/{file} into {where} failed: {e}") from None
    return Path(path)


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
