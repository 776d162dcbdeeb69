"""The shape of the house: no import circles among fly-cpp's modules.

Every import is counted, at module level, inside functions and under ``TYPE_CHECKING`` alike: a
circle through a type-only or a deferred import is still a circle in the design.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# source folder -> package it is installed as (pyproject.toml's wheel.packages)
PACKAGES = {"fly_cpp": "fly_cpp", "cli": "fly_cpp.cli", "models": "fly_cpp.models"}


def modules() -> dict[str, Path]:
    out = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """fly-cpp modules that ``name`` imports (a package's own ``__init__`` counts as the package)."""
    is_package = path.name == "__init__.py"
    here = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles() -> None:
    g = graph()
    assert len(g) > 40  # the walk found the package
    assert cycles(g) == []


def untyped_calls(path: Path) -> list[str]:
    """Methods called on a parameter typed ``Any`` or ``object``, and methods looked up by name
    and called (``getattr(x, "name")(...)``): a call the import graph cannot see, so a module
    could call back up into whoever handed it the object and no circle would show."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        args = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
        hidden = {a.arg for a in args if a.annotation is not None
                  and ast.unparse(a.annotation) in ("Any", "object", "typing.Any")}
        hidden -= narrowed(fn)
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in hidden:
                found.append(f"{path.name}:{node.lineno} {f.value.id}.{f.attr}()")
            if (isinstance(f, ast.Call) and isinstance(f.func, ast.Name) and f.func.id == "getattr"
                    and len(f.args) >= 2 and isinstance(f.args[1], ast.Constant)):
                found.append(f"{path.name}:{node.lineno} getattr(..., {f.args[1].value!r})()")
    return found


def narrowed(fn: ast.AST) -> set[str]:
    """Names the function checks before use (``isinstance(x, ...)``, ``hasattr(x, ...)``): a
    JSON value or a duck-typed scalar, not an injected collaborator."""
    return {node.args[0].id for node in ast.walk(fn)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("isinstance", "hasattr") and node.args and isinstance(node.args[0], ast.Name)}


def test_no_seam_calls_back_through_an_untyped_object() -> None:
    """Every object a module calls into has a type the reader (and the import graph) can see:
    a class or a Protocol from the same or a lower module."""
    found = [hit for path in modules().values() for hit in untyped_calls(path)]
    assert found == []


def test_the_seam_check_sees_the_shapes_it_forbids(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("from typing import Any\n"
                   "def draft(pacer: Any, n: int):\n    return pacer.plan(n)\n"
                   "def learn(loop: object):\n    getattr(loop, 'observe')(1, 2)\n"
                   "def fine(value: Any):\n    return value.items() if isinstance(value, dict) else value\n")
    assert [hit.split(" ", 1)[1] for hit in untyped_calls(src)] == ["pacer.plan()", "getattr(..., 'observe')()"]


# where a request runs (the engine, the round, the drafters, k auto): there an object's fields are
# written by the object itself; ``stats`` and ``record`` are the records its owner fills (a
# generation's ``Stats``, a round's ``Round``)
SEAMED = ("fly_cpp.engine.engine", "fly_cpp.engine.admit", "fly_cpp.engine.loading", "fly_cpp.rounds.loop", "fly_cpp.rounds.verify", "fly_cpp.rounds.output",
          "fly_cpp.rounds.crossround", "fly_cpp.rounds.runs", "fly_cpp.rounds.shift", "fly_cpp.rounds.prefill", "fly_cpp.engine.batchloop",
          "fly_cpp.drafters.seam", "fly_cpp.drafters.draft_model", "fly_cpp.drafters.mtp", "fly_cpp.engine.control", "fly_cpp.drafters.drafter", "fly_cpp.kauto.pacer",
          "fly_cpp.kauto.worth", "fly_cpp.kauto.costs", "fly_cpp.kauto.evidence", "fly_cpp.kauto.calibrate", "fly_cpp.kauto.recall")
RECORDS = {"stats", "record"}


def seam_crossings(path: Path) -> list[str]:
    """Fields written on an object the writer does not own (``other.field = ...``, where
    ``other`` is neither ``self`` nor one of its parts nor a record), and a wrapped object
    reached through its wrapper (``x.inner`` of another object): each a way into another
    module's state that its methods do not see."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for target in targets:
            for t in ast.walk(target):
                if not (isinstance(t, ast.Attribute) and isinstance(t.ctx, ast.Store)):
                    continue
                base = t.value
                while isinstance(base, (ast.Attribute, ast.Subscript)):
                    base = base.value
                if isinstance(base, ast.Name) and (base.id in ("self", "cls") or base.id in RECORDS):
                    continue
                found.append(f"{path.name}:{node.lineno} {ast.unparse(t)} =")
        if (isinstance(node, ast.Attribute) and node.attr == "inner" and not
                (isinstance(node.value, ast.Name) and node.value.id == "self")):
            found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return found


def test_no_field_is_written_across_a_seam() -> None:
    mods = modules()
    found = [hit for name in SEAMED for hit in seam_crossings(mods[name])]
    assert found == []


def test_the_seam_crossing_check_sees_the_shapes_it_forbids(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("def f(pacer, drafter, stats):\n    pacer.sharing = 4\n    stats.slot = 1\n"
                   "    return drafter.inner.inner\n"
                   "class A:\n    def g(self, other):\n        self.x = other\n        self.part.y = 1\n"
                   "        other.z += 1\n")
    assert sorted(hit.split(" ", 1)[1] for hit in seam_crossings(src)) == [
        "drafter.inner", "drafter.inner.inner", "other.z =", "pacer.sharing ="]


# k auto's tuning constants: the modules that decide (how far to draft, whether to loosen, what a
# decode costs) and those that measure (timing the curves, caching them, the rollback's price).
# The budgets only shrink; each constant says what measured it (issue 53: 41 in all before).
DECIDING = ("fly_cpp.engine.control", "fly_cpp.drafters.drafter", "fly_cpp.kauto.pacer", "fly_cpp.kauto.planner", "fly_cpp.kauto.belief", "fly_cpp.kauto.worth",
            "fly_cpp.kauto.evidence", "fly_cpp.kauto.decayed", "fly_cpp.kauto.costs")
MEASURING = ("fly_cpp.kauto.calibrate", "fly_cpp.kauto.costcache", "fly_cpp.kauto.rollback_costs")
PRICING = ("fly_cpp.kauto.prior",)  # what decodes cost before any is timed (issue 66: the calibration's place)
BUDGET = {DECIDING: 8, MEASURING: 10, PRICING: 5}


def tuning_constants(path: Path) -> list[tuple[str, bool]]:
    """A module's constants set from numbers alone (``NAME = 0.9``, ``NAME = (1, 2)``, ``256 << 20``;
    not one derived from another), each with whether a comment sits on its line or just above."""
    lines = path.read_text(encoding="utf-8").splitlines()

    def literal(v: ast.expr) -> bool:
        if isinstance(v, ast.Constant):
            return isinstance(v.value, (int, float)) and not isinstance(v.value, bool)
        if isinstance(v, ast.UnaryOp):
            return literal(v.operand)
        if isinstance(v, ast.BinOp):
            return literal(v.left) and literal(v.right)
        return isinstance(v, ast.Tuple) and all(literal(e) for e in v.elts)

    out = []
    for node in ast.parse("\n".join(lines)).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id.isupper() and node.value is not None and literal(node.value):
            here, above = lines[node.lineno - 1], lines[node.lineno - 2] if node.lineno > 1 else ""
            out.append((target.id, "#" in here or above.lstrip().startswith("#")))
    return out


def test_k_auto_keeps_few_tuning_constants_each_saying_what_measured_it() -> None:
    mods = modules()
    for group, budget in BUDGET.items():
        found = [c for name in group for c in tuning_constants(mods[name])]
        assert len(found) <= budget, (group, [n for n, _ in found])
        assert [n for n, commented in found if not commented] == []


# files over the size a reader takes in at once, each waiting to be split; the list only shrinks
LONG = 400
STILL_LONG: set[str] = set()
ENGINE = 300  # the engine composes (load, admit, hand over): loading, admission and drafting live elsewhere


def test_only_the_backend_imports_llama_cpp() -> None:
    """llama-cpp-python is touched in one place (``fly_cpp.backend``), so that a change of its
    API, or of the library under it, is a change there."""
    found = []
    for name, path in modules().items():
        if name == "fly_cpp.backend" or name.startswith("fly_cpp.backend."):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{name}: {n}" for n in names if n == "llama_cpp" or n.startswith("llama_cpp.")]
    assert found == []


def test_no_file_grows_past_what_a_reader_takes_in() -> None:
    long = {str(path.relative_to(ROOT)) for path in modules().values()
            if len(path.read_text(encoding="utf-8").splitlines()) > LONG}
    assert long <= STILL_LONG, f"over {LONG} lines: {sorted(long - STILL_LONG)}"
    assert len((ROOT / "fly_cpp" / "engine" / "engine.py").read_text(encoding="utf-8").splitlines()) < ENGINE
    backend = [p for p in (ROOT / "fly_cpp" / "backend").glob("*.py")]
    assert len(backend) >= 7 and not [p for p in backend if str(p.relative_to(ROOT)) in STILL_LONG]


DRAFTER_NAMES = ("Drafter", "DraftModel", "MtpHead", "Throttled")


def drafter_probes(src: str) -> list[str]:
    """Where ``src`` asks what a drafter is rather than using its seam: an isinstance against a
    drafter class, a getattr or hasattr (each a line)."""
    hits = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            name = node.func.id
            if name == "isinstance" and len(node.args) == 2 and any(d in ast.unparse(node.args[1]) for d in DRAFTER_NAMES):
                hits.append(f"{node.lineno} isinstance")
            elif name in ("getattr", "hasattr"):
                hits.append(f"{node.lineno} {name}")
    return hits


def test_no_drafter_is_unwrapped_or_probed() -> None:
    """The drafters, the round and the engine's control face use a drafter through its seam
    (``fly_cpp.drafters.seam``: ``Drafter``, ``Drafter.pacer``; the steppers' ``Stepper``); a
    caller's drafter has its shape read once, at the API's edge (``seam.as_drafter``)."""
    mods = modules()
    found = []
    for name, path in mods.items():
        if name.startswith(("fly_cpp.drafters.", "fly_cpp.rounds.")) or name in ("fly_cpp.engine.control", "fly_cpp.engine.batchloop"):
            src = path.read_text(encoding="utf-8")
            if name == "fly_cpp.drafters.seam":
                src = src[: src.index("class _Whole")]  # the edge: a caller's object completed
            found += [f"{name}:{hit}" for hit in drafter_probes(src)]
    assert found == []


def test_the_probe_check_sees_the_shapes_it_forbids() -> None:
    src = ("def f(d, x):\n    if isinstance(d, ModelDrafter):\n        pass\n    getattr(d, 'shift', None)\n"
           "    hasattr(d, 'pacer')\n    isinstance(x, str)\n")
    assert drafter_probes(src) == ["2 isinstance", "4 getattr", "5 hasattr"]
