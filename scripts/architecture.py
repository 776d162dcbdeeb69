#!/usr/bin/env python3
"""The rooms of the house and the doors between them, drawn from the code: every module of
the package belongs to one room (``ROOMS``), and an arrow from one room to another says that a
module of the first imports one of the second (how many imports, on the arrow). Beside it, one
request's path through the rooms (``PATH``): a streamed chat completion from the HTTP handler
down to a round of the speculative loop and its tokens back, hop by hop, every hop checked
against the code (``broken``). Both pictures are written into docs/architecture.md between
their markers; ``tests/test_architecture.py`` fails when a module belongs to no room, a hop is
no longer in the code, or a picture is stale.

    python scripts/architecture.py            # rewrite the pictures in docs/architecture.md
    python scripts/architecture.py --check    # exit 1 if one is stale or a hop is gone
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_layout import graph, modules  # noqa: E402  (the import walk the layout test checks)

DOC = ROOT / "docs" / "architecture.md"
BEGIN, END = "<!-- rooms: begin (scripts/architecture.py) -->", "<!-- rooms: end -->"
PATH_BEGIN, PATH_END = "<!-- request path: begin (scripts/architecture.py) -->", "<!-- request path: end -->"

# room -> the packages (a name, or a prefix ending in ".") that live there: every room is a package (the
# basics' room two: settings, and the helpers)
ROOMS: dict[str, tuple[str, ...]] = {
    "surfaces: CLI": ("fly_cpp.cli.", "fly_cpp.cli"),
    "surfaces: server": ("fly_cpp.server.", "fly_cpp.server"),
    "surfaces: bench": ("fly_cpp.bench.", "fly_cpp.bench"),
    "surfaces: Python API": ("fly_cpp", "fly_cpp.api.", "fly_cpp.api"),
    "model kit": ("fly_cpp.models.", "fly_cpp.models"),
    "engine: requests and slots": ("fly_cpp.engine.", "fly_cpp.engine"),
    "the round": ("fly_cpp.rounds.", "fly_cpp.rounds"),
    "drafters": ("fly_cpp.drafters.", "fly_cpp.drafters"),
    "k auto (control)": ("fly_cpp.kauto.", "fly_cpp.kauto"),
    "backend: llama.cpp": ("fly_cpp.backend.", "fly_cpp.backend"),
    "basics: settings, errors, text helpers": ("fly_cpp.config", "fly_cpp.config.", "fly_cpp.basics.", "fly_cpp.basics"),
}


@dataclass(frozen=True)
class Hop:
    """One arrow of the request's path: ``caller`` reaches ``callee``, each written
    "module:Qualified.name" (the module under ``fly_cpp``; a nested function under its outer
    one, a method under its class), and the caller's own body calls or iterates the name
    ``via`` (by default the callee's own name; another where the code reaches it through a
    variable, a callback or ``__call__``). ``back``: the arrow is drawn the other way, the
    callee's items coming back to the caller, which iterates ``via`` while the callee yields.
    The caller ``client`` is the HTTP client: its hops are checked on the server's side only
    (the handler routed at ``via``, or the stream it reads yielding)."""

    caller: str
    callee: str
    label: str
    via: str = ""
    back: bool = False


CLIENT = "client"

# One request's path, in order: `fly-cpp serve`'s POST /v1/chat/completions with stream true,
# one slot, a draft model under k auto. When the code moves, move the hop here: the check names
# the hop (its number, as the picture numbers its arrows) that is no longer true.
PATH: list[Hop] = [
    Hop(CLIENT, "server.oai:router.chat", "POST /v1/chat/completions, stream true", via="/v1/chat/completions"),
    Hop("server.oai:router.chat", "server.oai:chat_generation", "the body checked"),
    Hop("server.oai:chat_generation", "server.prepare:generation", "off the event loop: chat template, tokens"),
    Hop("server.prepare:generation", "api.fly:Fly.generate", "the prompt's tokens, the body's settings"),
    Hop("api.fly:Fly.generate", "engine.engine:Engine.generate", "the settings over the instance's"),
    Hop("engine.engine:Engine.generate", "engine.control:Control.plan", "the settings as k auto runs them on this pair"),
    Hop("engine.engine:Engine.generate", "engine.admit:admit", "every check before any token, the Request frozen"),
    Hop("engine.engine:Engine.generate", "engine.generation:Generation", "returned unstarted (its steps: Engine._submitted)"),
    Hop("server.oai:router.chat", "server.oai:answer", "run it, answer as SSE"),
    Hop("server.oai:answer", "server.runs:Runs.start", "counted (a full queue: 503 before any byte)"),
    Hop("server.runs:Runs.start", "server.worker:Worker.submit", "queued, a Job for the event loop to read"),
    Hop("server.worker:Worker.submit.job", "server.oai:answer.job", "on a worker thread (one per slot)", via="make"),
    Hop("server.oai:answer.job", "api.oai:chat_chunks", "chunks as the steps come", via="chunks"),
    Hop("api.oai:chat_chunks", "engine.generation:Generation.events", "for step in gen"),
    Hop("engine.generation:Generation.events", "engine.engine:Engine._submitted", "the first step asked for", via="_steps"),
    Hop("engine.engine:Engine._submitted", "engine.scheduler:Scheduler.submit", "a task of the step loop"),
    Hop("engine.scheduler:Scheduler._main", "engine.scheduler:Scheduler._admit", "the step thread: a free slot for it"),
    Hop("engine.scheduler:Scheduler._admit", "engine.scheduler:Scheduler._run", "its greenlet (_advance switches to it)"),
    Hop("engine.scheduler:Scheduler._run", "engine.engine:Engine.generate.body", "the task's body, in its slot", via="body"),
    Hop("engine.engine:Engine.generate.body", "engine.engine:Engine._in_slot", "the slot's ledger, cost model, caches"),
    Hop("engine.engine:Engine._in_slot", "engine.engine:Engine.generate.start", "the loop and its drafter, made in the slot",
        via="start"),
    Hop("engine.engine:Engine.generate.start", "engine.control:Control.drafting", "who drafts in this slot, and how"),
    Hop("engine.control:Control.drafting", "engine.control:Control._drafter", "the pair's drafter"),
    Hop("engine.control:Control._drafter", "engine.control:Control._stepper", "the draft model, the MTP head or none"),
    Hop("engine.control:Control._drafter", "engine.control:Control._pacer", "paced by the slot's pacer (k auto)"),
    Hop("engine.engine:Engine.generate.start", "rounds.loop:run", "the speculative loop: a generator _in_slot reads"),
    Hop("rounds.loop:run", "rounds.loop:_Loop.run", "the generation's rounds"),
    Hop("rounds.loop:_Loop.run", "drafters.drafter:PairDrafter.begin", "the draft's cache brought to the prompt"),
    Hop("rounds.loop:_Loop.run", "rounds.loop:_Loop.round", "one round", via="round"),
    Hop("rounds.loop:_Loop.round", "drafters.drafter:PairDrafter.draft", "this round's drafts"),
    Hop("drafters.drafter:PairDrafter.draft", "drafters.drafter:PairDrafter._planned", "what the pacer plans (k auto)"),
    Hop("drafters.drafter:PairDrafter._planned", "kauto.pacer:Pacer.plan", "draft, guess or rest, and how far"),
    Hop("kauto.pacer:Pacer.plan", "kauto.planner:plan", "the plan at a draw from the belief (a pure function)"),
    Hop("drafters.drafter:PairDrafter._planned", "drafters.drafter:PairDrafter._paced", "step by step while one more pays"),
    Hop("drafters.drafter:PairDrafter._paced", "drafters.steps:draft_steps", "the one step loop, paced"),
    Hop("drafters.steps:draft_steps", "drafters.draft_model:DraftModel.step", "one draft decode", via="step"),
    Hop("rounds.loop:_Loop.round", "backend.cache:Cache.decode", "the target: one pass over the last token and the drafts",
        via="decode"),
    Hop("backend.cache:Cache.decode", "backend.cache:Cache._run", "deferred and new tokens"),
    Hop("backend.cache:Cache._run", "backend.context:Context._decode_range", "llama_decode, batch by batch"),
    Hop("rounds.loop:_Loop.round", "rounds.verify:Verifier.__call__", "the accept rule's verdict on the rows", via="verify"),
    Hop("rounds.loop:_Loop.round", "rounds.loop:_Loop._apply", "what the round keeps, applied"),
    Hop("rounds.loop:_Loop._apply", "rounds.verify:Verifier.keep", "the complete keep: FLy's ask, the window", via="keep"),
    Hop("rounds.loop:_Loop.round", "drafters.drafter:PairDrafter.accept", "how the round went: the pacer learns"),
    Hop("engine.engine:Engine._in_slot", "rounds.loop:_Loop.run", "the round's Steps (out.take)", via="steps", back=True),
    Hop("engine.scheduler:Scheduler._run", "engine.engine:Engine._in_slot", "Steps", via="items", back=True),
    Hop("engine.scheduler:Scheduler._run", "engine.scheduler:Task._put", "each to the caller's queue"),
    Hop("engine.engine:Engine._submitted", "engine.scheduler:Task.__iter__", "Steps, on the worker thread", via="task", back=True),
    Hop("engine.generation:Generation.events", "engine.engine:Engine._submitted", "Steps", via="_steps", back=True),
    Hop("api.oai:chat_chunks", "engine.generation:Generation.events", "Steps (its text and tokens kept)", back=True),
    Hop("server.oai:answer.job", "api.oai:chat_chunks", "chat.completion.chunk dicts", via="chunks", back=True),
    Hop("server.worker:Worker.submit.job", "server.oai:answer.job", "chunks", via="it", back=True),
    Hop("server.worker:Worker.submit.job", "server.worker:Worker.submit.post", "to the event loop, a burst per wake-up"),
    Hop("server.oai:_events", "server.worker:Job.__anext__", "chunks, on the event loop", via="items", back=True),
    Hop("server.runs:Runs.events", "server.oai:_events", "SSE events, timings on the last", via="events", back=True),
    Hop(CLIENT, "server.runs:Runs.events", "data: chunk ... data: [DONE]", back=True),
]


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


# -- the request's path ------------------------------------------------------------------------

ITERATOR_METHODS = frozenset({"__iter__", "__next__", "__aiter__", "__anext__"})


@cache
def _tree(module: str) -> ast.Module | None:
    path = modules().get(f"fly_cpp.{module}")
    return ast.parse(path.read_text(encoding="utf-8")) if path is not None else None


def _defs(node: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]:
    """The functions and classes defined directly in ``node`` (under an ``if`` or ``try`` too)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield child
        elif not isinstance(child, ast.Lambda):
            yield from _defs(child)


def find(where: str) -> ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | None:
    """The definition "module:Qualified.name" names, or None."""
    module, _, qualname = where.partition(":")
    node: ast.AST | None = _tree(module)
    for name in qualname.split("."):
        node = next((d for d in _defs(node) if d.name == name), None) if node is not None else None
    return node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else None


def _own(fn: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``fn``'s own body: its lambdas', not those of the functions defined inside
    it (a nested function is a hop's caller of its own, so that a hop says where the call is)."""
    todo = list(getattr(fn, "body", []))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))


def _named(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _reaches(fn: ast.AST, name: str) -> bool:
    """Whether ``fn``'s body calls ``name`` (``name(...)``, ``x.name(...)``) or iterates it
    (``for``, ``async for``, a comprehension or ``yield from`` over an expression that names
    it): a generator's body runs as its reader iterates it, so that is a hop too."""
    for node in _own(fn):
        if isinstance(node, ast.Call) and _named(node.func) == name:
            return True
        over = node.iter if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)) else \
            node.value if isinstance(node, ast.YieldFrom) else None
        if over is not None and any(_named(n) == name for n in ast.walk(over)):
            return True
    return False


def _yields(fn: ast.AST) -> bool:
    return getattr(fn, "name", "") in ITERATOR_METHODS or any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in _own(fn))


def _routed(fn: ast.AST, path: str) -> bool:
    """Whether ``fn`` is decorated as the handler of ``path`` (``@r.post(path)``)."""
    return any(isinstance(d, ast.Call) and d.args and isinstance(d.args[0], ast.Constant) and d.args[0].value == path
               for d in getattr(fn, "decorator_list", []))


def _missing(where: str) -> str:
    module, _, qualname = where.partition(":")
    return f"fly_cpp.{module} has no {qualname}" if _tree(module) is not None else f"there is no module fly_cpp.{module}"


def _fault(hop: Hop) -> str | None:
    """Why ``hop`` is not true of the code now (None: it is)."""
    if any(c in hop.label for c in ";#\n"):
        return f"its label {hop.label!r} has a character mermaid's messages cannot hold (; # or a newline)"
    callee = find(hop.callee)
    if callee is None:
        return _missing(hop.callee)
    if hop.back and not _yields(callee):
        return f"fly_cpp.{hop.callee.replace(':', '.')} yields nothing"
    via = hop.via or hop.callee.partition(":")[2].rpartition(".")[2]
    if hop.caller == CLIENT:
        return None if hop.back or _routed(callee, via) else f"fly_cpp.{hop.callee.replace(':', '.')} is not routed at {via}"
    caller = find(hop.caller)
    if caller is None:
        return _missing(hop.caller)
    if not _reaches(caller, via):
        return f"fly_cpp.{hop.caller.replace(':', '.')} no longer calls or iterates {via}"
    return None


def broken(path: Sequence[Hop] = PATH) -> list[str]:
    """One line per hop of ``path`` that the code no longer bears out, numbered as the picture
    numbers its arrows."""
    return [f"hop {i} ({hop.caller} -> {hop.callee}): {why}" for i, hop in enumerate(path, 1)
            if (why := _fault(hop)) is not None]


def _module(where: str) -> str:
    return where if where == CLIENT else "fly_cpp." + where.partition(":")[0]


def _id(module: str) -> str:
    # a suffix, so that no module's name is one of mermaid's words (``loop``, ``end``, ``box``)
    return module.removeprefix("fly_cpp.").replace(".", "_") + "_py" if module != CLIENT else CLIENT


def sequence(path: Sequence[Hop] = PATH) -> str:
    """The request's path as a mermaid sequence diagram: the modules it passes, each in its
    room's box (rooms in ``ROOMS``' order), an arrow per hop, numbered."""
    if faults := broken(path):
        raise SystemExit("the request path in scripts/architecture.py is no longer the code's:\n" + "\n".join(faults))
    seen = list(dict.fromkeys(_module(w) for hop in path for w in (hop.caller, hop.callee)))
    lines = ["```mermaid", "sequenceDiagram", "    autonumber"]
    if CLIENT in seen:
        lines.append(f"    actor {CLIENT}")
    for room in ROOMS:
        members = [m for m in seen if m != CLIENT and room_of(m) == room]
        if members:
            lines.append(f"    box {room}")
            lines += [f"        participant {_id(m)} as {m.removeprefix('fly_cpp.').replace('.', '/')}.py" for m in members]
            lines.append("    end")
    for hop in path:
        a, b = _id(_module(hop.caller)), _id(_module(hop.callee))
        name = hop.callee.partition(":")[2]
        text = hop.label if hop.back or hop.caller == CLIENT else f"{name}(): {hop.label}"
        lines.append(f"    {b}-->>{a}: {text}" if hop.back else f"    {a}->>{b}: {text}")
    lines.append("```")
    return "\n".join(lines)


def _between(text: str, begin: str, end: str, body: str) -> str:
    if begin not in text or end not in text:
        raise SystemExit(f"{DOC} lacks the markers {begin} ... {end}")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def rewritten(text: str) -> str:
    return _between(_between(text, BEGIN, END, picture()), PATH_BEGIN, PATH_END, sequence())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a picture in the doc is stale or a hop is gone")
    args = ap.parse_args()
    text = DOC.read_text(encoding="utf-8")
    new = rewritten(text)
    if args.check:
        if new != text:
            sys.exit("docs/architecture.md's pictures are stale: run python scripts/architecture.py")
        return
    DOC.write_text(new, encoding="utf-8")


if __name__ == "__main__":
    main()
