"""Where a target/draft pair comes from: the one place model sources are resolved.

A pair comes from local paths, from the Hugging Face hub (repository + file, through
huggingface-hub's cache), from a named pair (the registry in ``pairs.toml`` or one of the kit's
local pairs, built once), or, with none of these, the bundled tiny pair. The Python API and
every command resolve through ``resolve``; errors name the arguments the way the caller spells
them (``CLI`` or ``PYTHON``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fly_cpp.basics.errors import UsageError

PYTHON = {name: name for name in ("target", "draft", "hf_repo", "hf_file", "hf_draft_repo", "hf_draft_file", "pair")}
CLI = {"target": "-m", "draft": "-d", "hf_repo": "--hf-repo", "hf_file": "--hf-file",
       "hf_draft_repo": "--hf-draft-repo", "hf_draft_file": "--hf-draft-file", "pair": "--pair"}


@dataclass(frozen=True)
class Resolved:
    """Local paths of the pair (``draft`` None: no draft model) and the settings it suggests
    (e.g. the context a tiny model was trained on)."""

    target: str
    draft: str | None
    defaults: dict[str, Any] = field(default_factory=dict)


def resolve(target: str | None = None, draft: str | None = None, *, hf_repo: str | None = None,
            hf_file: str | None = None, hf_draft_repo: str | None = None, hf_draft_file: str | None = None,
            pair: str | None = None, names: Mapping[str, str] = PYTHON,
            note: Callable[[str], None] | None = None) -> Resolved:
    """The pair these sources name, downloading or building what is missing. ``note`` hears
    about slow first-time work (building a kit pair). A hub repository may carry a quant
    (``owner/name:Q8_0``) and needs no file: the file is then picked as llama.cpp's ``-hf``
    picks it (``hub.choose_file``)."""
    from fly_cpp.models import bundled, hub

    given = {k: v for k, v in {"target": target, "draft": draft, "hf_repo": hf_repo, "hf_file": hf_file,
                               "hf_draft_repo": hf_draft_repo, "hf_draft_file": hf_draft_file}.items() if v is not None}
    if pair is not None:
        if given:
            raise UsageError(f"{names['pair']} names both models: drop the other model arguments "
                             f"({', '.join(names[k] for k in given)})")
        return _pair(pair, note)
    if hf_repo is not None or hf_file is not None:
        if target is not None:
            raise UsageError(f"give the target model as {names['target']} or as {names['hf_repo']}, not both")
        if hf_repo is None:
            raise UsageError(f"{names['hf_file']} needs {names['hf_repo']} (the repository the GGUF file is in)")
        target = str(hub.pull_tagged(hf_repo, hf_file))
    if hf_draft_repo is not None or hf_draft_file is not None:
        if draft is not None:
            raise UsageError(f"give the draft model as {names['draft']} or as "
                             f"{names['hf_draft_repo']}/{names['hf_draft_file']}, not both")
        if hf_draft_repo is not None:
            draft = str(hub.pull_tagged(hf_draft_repo, hf_draft_file))
        elif hf_repo is None:
            raise UsageError(f"{names['hf_draft_file']} needs {names['hf_draft_repo']} (or {names['hf_repo']})")
        else:
            draft = str(hub.pull(hub.split_tag(hf_repo)[0], hf_draft_file))
    if target is None:
        if draft is not None:
            raise UsageError(f"a draft model ({names['draft']}) needs a target model ({names['target']})")
        return Resolved(str(bundled.TARGET), str(bundled.DRAFT), {"n_ctx": bundled.N_CTX})
    return Resolved(str(target), None if draft is None else str(draft))


def _pair(name: str, note: Callable[[str], None] | None) -> Resolved:
    from fly_cpp.models import hub, kit

    if name in kit.PAIRS:
        if kit.built(name) is None and note is not None:
            note(f"building pair {name} into {kit.cache_root() / name} (once)")
        local = kit.make_pair(name)
        if local.synthetic and note is not None:
            note(f"pair {local.label}: {local.description}")
        return Resolved(str(local.target), str(local.draft), {"n_ctx": local.n_ctx})
    if name not in hub.registry():
        known = sorted(hub.registry()) + list(kit.PAIRS)
        raise UsageError(f"unknown pair {name!r} (known: {', '.join(known)}; see 'fly-cpp models list')")
    target, draft = hub.pull_pair(name)
    return Resolved(str(target), str(draft))
