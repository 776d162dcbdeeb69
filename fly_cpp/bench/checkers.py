"""Task checkers: did a generated answer solve the task?

GSM8K compares the last number of the answer with the reference's ``#### N``. HumanEval and
MBPP run the task's tests on the generated code in a separate Python process with a time
limit (generated code is untrusted: it never runs in the benchmark's own process).

A chat model's answer is its first fenced code block, reduced to its definitions (``sanitize``):
instruct models append their own example calls, prints and asserts, whose mistakes are not the
task's, and an answer cut by the token limit keeps its whole lines that parse.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

TIMEOUT_SECONDS = 10.0

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)(?:```|$)", re.S)


def last_number(text: str) -> str | None:
    """The last number written in ``text``, normalised ("1,234.50" -> "1234.5")."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    value = found[-1].replace(",", "")
    if "." in value:
        value = value.rstrip("0").rstrip(".")
    return value or None


def gsm8k_reference(answer: str) -> str | None:
    """The number after GSM8K's ``####`` marker."""
    _, _, tail = answer.rpartition("####")
    return last_number(tail) if tail else None


def check_gsm8k(output: str, meta: dict[str, Any]) -> dict[str, Any]:
    got, want = last_number(output), gsm8k_reference(meta["answer"])
    return {"passed": got is not None and got == want, "answer": got, "reference": want}


def sanitize(code: str) -> str:
    """The definitions of a code block: the longest run of its first lines that parses, less
    top-level statements other than imports, function and class definitions and assignments.
    Code where no line parses is returned as it is (the check then reports its error)."""
    lines = code.splitlines()
    for end in range(len(lines), 0, -1):
        try:
            tree = ast.parse("\n".join(lines[:end]))
        except SyntaxError:
            continue
        keep = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign,
                ast.AnnAssign)
        return ast.unparse(ast.Module(body=[n for n in tree.body if isinstance(n, keep)], type_ignores=[]))
    return code


def chat_code(output: str) -> str | None:
    """The sanitized first fenced code block of a chat answer; None when there is none."""
    m = _FENCE.search(output)
    return sanitize(m.group(1)) if m else None


def run_python(program: str, timeout: float = TIMEOUT_SECONDS) -> dict[str, Any]:
    """Run a program in an isolated interpreter in a scratch directory.
    Returns {"passed", "status": "passed"|"failed"|"timeout", "error": last stderr line}."""
    with tempfile.TemporaryDirectory(prefix="fly-bench-") as tmp:
        path = os.path.join(tmp, "check.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(program)
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            done = subprocess.run([sys.executable, "-I", path], cwd=tmp, env=env, capture_output=True,
                                  timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return {"passed": False, "status": "timeout", "error": f"timed out after {timeout:g}s"}
    if done.returncode == 0:
        return {"passed": True, "status": "passed", "error": ""}
    lines = done.stderr.decode("utf-8", errors="replace").strip().splitlines()
    return {"passed": False, "status": "failed", "error": lines[-1][:200] if lines else f"exit {done.returncode}"}


def humaneval_program(output: str, meta: dict[str, Any]) -> str:
    """The prompt continued by the completion (plain completion), or, when the answer holds a
    fenced code block (chat models), that block after the prompt's imports."""
    prompt = meta["prompt"]
    code = chat_code(output)
    if code is not None:
        imports = "\n".join(line for line in prompt.splitlines() if line.startswith(("import ", "from ")))
        body = f"{imports}\n{code}"
    else:
        body = prompt + output
    return f"{body}\n\n{meta['test']}\n\ncheck({meta['entry_point']})\n"


def check_humaneval(output: str, meta: dict[str, Any], timeout: float = TIMEOUT_SECONDS) -> dict[str, Any]:
    return run_python(humaneval_program(output, meta), timeout)


def check_mbpp(output: str, meta: dict[str, Any], timeout: float = TIMEOUT_SECONDS) -> dict[str, Any]:
    code = chat_code(output)
    program = "\n".join([output if code is None else code, meta.get("setup") or "", *meta["tests"]]) + "\n"
    return run_python(program, timeout)


CHECKERS: dict[str, Callable[[str, dict[str, Any]], dict[str, Any]]] = {
    "gsm8k": check_gsm8k,
    "humaneval": check_humaneval,
    "mbpp": check_mbpp,
}
