#!/usr/bin/env python3
"""The rooms of the house and the doors between them, drawn from the code: every module of
the package belongs to one room (``ROOMS``), and an arrow from one room to another says that a
module of the first imports one of the second (how many imports, on the arrow). The picture is
written into docs/architecture.md between its markers; ``tests/test_architecture.py`` fails
when a module belongs to no room or the picture is stale.

    python scripts/architecture.py            # rewrite the picture in docs/architecture.md
    python scripts/architecture.py --check    # exit 1 if it is stale
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_layout import graph  # noqa: E402  (the import walk the layout test checks)

DOC = ROOT / "docs" / "architecture.md"
BEGIN, END = "<!-- rooms: begin (scripts/architecture.py) -->", "<!-- rooms: end -->"

# room -> the modules (a name, or a package prefix ending in ".") that live there
ROOMS: dict[str, tuple[str, ...]] = {
    "surfaces: CLI": ("fly_cpp.cli.", "fly_cpp.cli"),
    "surfaces: server": ("fly_cpp.server.", "fly_cpp.server"),
    "surfaces: bench": ("fly_cpp.bench.", "fly_cpp.bench", "fly_cpp.hostbench"),
    "surfaces: Python API": ("fly_cpp", "fly_cpp.api", "fly_cpp.oai", "fly_cpp.chat_format", "fly_cpp.tools",
                             "fly_cpp.tool_formats", "fly_cpp.reply", "fly_cpp.structured"),
    "model kit": ("fly_cpp.models.", "fly_cpp.models"),
    "engine: requests and slots": ("fly_cpp.engine", "fly_cpp.fit", "fly_cpp.scheduler", "fly_cpp.batchloop", "fly_cpp.ledger",
                                   "fly_cpp.generation", "fly_cpp.vocab"),
    "the round": ("fly_cpp.loop", "fly_cpp.request", "fly_cpp.verify", "fly_cpp.accept", "fly_cpp.sampling",
                  "fly_cpp.output", "fly_cpp.text", "fly_cpp.step", "fly_cpp.crossround", "fly_cpp.shape",
                  "fly_cpp.constrain", "fly_cpp.runs", "fly_cpp.shift", "fly_cpp.prefill", "fly_cpp.scoring"),
    "drafters": ("fly_cpp.drafters", "fly_cpp.draft_model", "fly_cpp.ngram", "fly_cpp.mtp"),
    "k auto (control)": ("fly_cpp.control", "fly_cpp.paced", "fly_cpp.pacer", "fly_cpp.worth", "fly_cpp.evidence",
                         "fly_cpp.decayed", "fly_cpp.costs", "fly_cpp.calibrate", "fly_cpp.costcache",
                         "fly_cpp.recall", "fly_cpp.rollback_costs"),
    "backend: llama.cpp": ("fly_cpp.backend.", "fly_cpp.backend", "fly_cpp.native", "fly_cpp.rpc", "fly_cpp.rollback",
                           "fly_cpp.rows"),
    "basics: settings, errors, text helpers": ("fly_cpp.config", "fly_cpp.errors", "fly_cpp.fences",
                                               "fly_cpp.int_bounds", "fly_cpp.jsoncache"),
}


def room_of(module: str) -> str | None:
    """The room of ``module``: its own name listed, else the longest package prefix listed."""
    for room, members in ROOMS.items():
        if module in members:
            return room
    best = max(((len(m), room) for room, members in ROOMS.items() for m in members
                if m.endswith(".") and module.startswith(m)), default=None)
    return best[1] if best else None


def picture() -> str:
    g = graph()
    homeless = sorted(m for m in g if room_of(m) is None)
    if homeless:
        raise SystemExit(f"modules in no room (add them to ROOMS in scripts/architecture.py): {', '.join(homeless)}")
    doors: Counter[tuple[str, str]] = Counter()
    sizes: Counter[str] = Counter(room_of(m) for m in g)  # type: ignore[misc]
    for module, imported in g.items():
        for other in imported:
            a, b = room_of(module), room_of(other)
            if a != b:
                doors[(a, b)] += 1  # type: ignore[index]
    ids = {room: f"R{i}" for i, room in enumerate(ROOMS)}
    lines = ["```mermaid", "flowchart TD"]
    lines += [f'    {ids[room]}["{room} ({sizes[room]})"]' for room in ROOMS]
    lines += [f"    {ids[a]} -->|{n}| {ids[b]}" for (a, b), n in sorted(doors.items(), key=lambda x: (list(ROOMS).index(x[0][0]), list(ROOMS).index(x[0][1])))]
    lines.append("```")
    return "\n".join(lines)


def rewritten(text: str) -> str:
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC} lacks the markers {BEGIN} ... {END}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{picture()}\n{END}{tail}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the picture in the doc is stale")
    args = ap.parse_args()
    text = DOC.read_text(encoding="utf-8")
    new = rewritten(text)
    if args.check:
        if new != text:
            sys.exit("docs/architecture.md's picture is stale: run python scripts/architecture.py")
        return
    DOC.write_text(new, encoding="utf-8")


if __name__ == "__main__":
    main()
