"""Benchmark prompts: the datasets shipped with the package, or any JSONL file.

A ``Prompt`` carries the user's text, a category (for per-category plots) and, for datasets
with a checker, what the checker needs (``meta``). Multi-turn questions use their first turn.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fly_cpp.basics.errors import FlyError

DATA = Path(__file__).resolve().parent / "data"
PROMPT_FIELDS = ("prompt", "question", "turns", "text", "instruction", "input")


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    text: str
    meta: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Dataset:
    name: str
    checker: str | None  # a name in ``checkers.CHECKERS``, or None
    prompts: list[Prompt]


def _gsm8k(row: dict[str, Any], i: int) -> Prompt:
    return Prompt(f"gsm8k/{i}", "math", row["question"], {"answer": row["answer"]})


def _humaneval(row: dict[str, Any], i: int) -> Prompt:
    return Prompt(row["task_id"], "coding", row["prompt"],
                  {"prompt": row["prompt"], "test": row["test"], "entry_point": row["entry_point"]})


def _mbpp(row: dict[str, Any], i: int) -> Prompt:
    tests = "\n".join(row["test_list"])
    text = f"{row['text']}\nYour code should pass these tests:\n\n{tests}\n"
    return Prompt(f"mbpp/{row['task_id']}", "coding", text,
                  {"tests": row["test_list"], "setup": row.get("test_setup_code", "")})


def _turns(name: str):  # type: ignore[no-untyped-def]
    def make(row: dict[str, Any], i: int) -> Prompt:
        return Prompt(f"{name}/{row.get('question_id', i)}", row.get("category", name), row["turns"][0])
    return make


# name -> (file in data/, row parser, checker)
BUILTIN = {
    "spec_bench": ("spec_bench.jsonl.gz", _turns("spec_bench"), None),
    "mt_bench": ("mt_bench.jsonl.gz", _turns("mt_bench"), None),
    "gsm8k": ("gsm8k.jsonl.gz", _gsm8k, "gsm8k"),
    "humaneval": ("humaneval.jsonl.gz", _humaneval, "humaneval"),
    "mbpp": ("mbpp.jsonl.gz", _mbpp, "mbpp"),
}


def _read_jsonl(path: Path) -> Iterable[tuple[int, dict[str, Any]]]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise FlyError(f"{path}:{line_no}: not valid JSON ({e.msg})") from None
                if not isinstance(row, dict):
                    raise FlyError(f"{path}:{line_no}: each line must be a JSON object")
                yield line_no, row
    except OSError as e:
        raise FlyError(f"cannot read dataset {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise FlyError(f"dataset {path} is not UTF-8 text") from None


def _generic(path: Path, line_no: int, row: dict[str, Any]) -> Prompt:
    for key in PROMPT_FIELDS:
        value = row.get(key)
        if isinstance(value, list) and value and isinstance(value[0], str):
            value = value[0]
        if isinstance(value, str) and value.strip():
            meta = {"answer": row["answer"]} if isinstance(row.get("answer"), str) else {}
            return Prompt(str(row.get("id", row.get("question_id", f"{path.stem}/{line_no}"))),
                          str(row.get("category", path.stem)), value, meta)
    raise FlyError(f"{path}:{line_no}: no prompt field (one of {', '.join(PROMPT_FIELDS)})")


def load(name_or_path: str) -> Dataset:
    """A shipped dataset by name, or a JSONL file (optionally .gz) with a prompt field per line."""
    if name_or_path in BUILTIN:
        file, parse, checker = BUILTIN[name_or_path]
        rows = _read_jsonl(DATA / file)
        return Dataset(name_or_path, checker, [parse(row, i) for i, (_, row) in enumerate(rows)])
    path = Path(name_or_path)
    if path.suffix not in (".jsonl", ".gz", ".json") and not path.exists():
        raise FlyError(f"unknown dataset {name_or_path!r}: use one of {', '.join(BUILTIN)} or a .jsonl file")
    if not path.is_file():
        raise FlyError(f"dataset file not found: {path}")
    prompts = [_generic(path, line_no, row) for line_no, row in _read_jsonl(path)]
    if not prompts:
        raise FlyError(f"dataset {path} holds no prompts")
    return Dataset(path.stem, None, prompts)


def select(prompts: list[Prompt], limit: int | None, offset: int = 0) -> list[Prompt]:
    """The first ``limit`` prompts, taken round-robin over categories (in order of first
    appearance), so that a small limit still covers every category of Spec-Bench; ``offset``
    drops that many from the front of this order first (``limit`` then counts what is left)."""
    if offset:
        return select(prompts, None if limit is None else offset + limit)[offset:]
    if limit is None or limit >= len(prompts):
        return list(prompts)
    by_category: dict[str, list[Prompt]] = {}
    for p in prompts:
        by_category.setdefault(p.category, []).append(p)
    out: list[Prompt] = []
    queues = [iter(v) for v in by_category.values()]
    while len(out) < limit:
        for q in queues:
            p = next(q, None)
            if p is not None and len(out) < limit:
                out.append(p)
    return out


def mixed(names: str, each: int) -> list[Prompt]:
    """``each`` prompts of every dataset in the comma-separated ``names``, taken in turn (one of the
    first, one of the second, ...), so that a run cut short still has covered every dataset."""
    sets = [select(load(name).prompts, each) for name in names.split(",")]
    return [p for group in zip(*sets) for p in group]
