#!/usr/bin/env python3
"""Run llama-server's own test suite against ``fly-cpp serve`` and print passed / failed /
not runnable per file.

    python scripts/llama_server_suite.py                      # every in-scope file
    python scripts/llama_server_suite.py test_tokenize test_security --json out.json

The tests come from the llama.cpp sources vendored in the llama-cpp-python sdist of the
installed version (fetched with pip download into $WORK, by default ../llama-cpp-src next to the
repository, as scripts/build-llama-cpp.sh does); nothing is installed. The suite starts the
binary named by $LLAMA_SERVER_BIN_PATH with llama-server's command line: here a small wrapper
(scripts/llama_server_wrap.py) that starts ``fly-cpp serve`` on the bundled stories260K pair.
Tests whose models are not available offline count as not runnable; ``slow`` tests are left
out, as the suite's tests.sh does. The suite's assertions are untouched.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# out of scope for fly-cpp serve: MCP, built-in tools and the MCP proxy, GCP /predict, router
# mode (test_router, and test_stream: stream resume is the router's, on a hub model) and slot
# save/restore (other issues)
OUT_OF_SCOPE = {"test_mcp_servers", "test_tools_builtin", "test_proxy", "test_compat_gcp", "test_router",
                "test_stream", "test_slot_save"}
FAST = ["test_tokenize", "test_security", "test_basic", "test_template"]
WORK = Path(os.environ.get("WORK", REPO.parent / "llama-cpp-src"))


def fetch(work: Path, version: str) -> Path:
    """The suite's tests directory, fetched once; FileNotFoundError when it cannot be."""
    tests = work / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp" / "tools" / "server" / "tests"
    if (tests / "utils.py").is_file():
        return tests
    work.mkdir(parents=True, exist_ok=True)
    sdist = work / f"llama_cpp_python-{version}.tar.gz"
    if not sdist.is_file():
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                               f"llama-cpp-python=={version}", "-d", str(work)], capture_output=True, text=True)
        if done.returncode != 0 or not sdist.is_file():
            raise FileNotFoundError(f"could not fetch llama-cpp-python {version}'s sdist: "
                                    f"{done.stderr.strip().splitlines()[-1:] or done.returncode}")
    with tarfile.open(sdist) as tar:
        tar.extractall(work, filter="data")
    if not (tests / "utils.py").is_file():
        raise FileNotFoundError(f"no server tests in {sdist}")
    return tests


def templates(work: Path = WORK, version: str | None = None) -> Path:
    """llama.cpp's chat templates (models/templates/*.jinja) from the same sdist; FileNotFoundError
    when it cannot be fetched."""
    found = fetch(work, version or importlib.metadata.version("llama_cpp_python")).parents[2] / "models" / "templates"
    if not found.is_dir():
        raise FileNotFoundError(f"no chat templates at {found}")
    return found


def wrapper(tmp: Path) -> Path:
    exe = tmp / "llama-server"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{HERE / "llama_server_wrap.py"}" "$@"\n')
    exe.chmod(0o755)
    return exe


def run_file(tests: Path, name: str, exe: Path, tmp: Path, timeout: float, port: int) -> dict[str, object]:
    xml = tmp / f"{name}.xml"
    start = time.monotonic()
    env = {**os.environ, "LLAMA_SERVER_BIN_PATH": str(exe), "FLY_SUITE_NOTE": str(tmp / "note.txt"),
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
           "LLAMA_CACHE": str(tmp / "cache"), "HF_HUB_OFFLINE": "1", "FLY_CPP_THREADS": "1",
           "PORT": str(port)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "llama_server_suite_plugin", "-m", "not slow",
           "-p", "no:cacheprovider", f"--junitxml={xml}", f"unit/{name}.py"]
    # its own process group: a file that runs past the limit is ended with the servers it started
    proc = subprocess.Popen(cmd, cwd=tests, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return {"file": name, "error": f"timed out after {timeout:.0f}s"}
    return {"file": name, **count(xml), "seconds": round(time.monotonic() - start)}


def count(xml: Path) -> dict[str, object]:
    counts = {"passed": 0, "failed": 0, "not_runnable": 0, "skipped": 0}
    failures: list[str] = []
    unrunnable: list[str] = []
    if not xml.is_file():
        return {**counts, "error": "no report (collection failed?)"}
    for case in ET.parse(xml).iter("testcase"):
        kinds = {child.tag: child for child in case}
        if "failure" in kinds or "error" in kinds:
            counts["failed"] += 1
            failures.append(case.get("name", "?"))
        elif "skipped" in kinds:
            message = kinds["skipped"].get("message", "")
            counts["not_runnable" if "not runnable" in message else "skipped"] += 1
            if "not runnable" in message:
                unrunnable.append(f"{case.get('name', '?')}: {message}")
        else:
            counts["passed"] += 1
    return {**counts, "failures": failures, "not_runnable_why": unrunnable}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="test files (test_basic ...); default: every in-scope file")
    parser.add_argument("--fast", action="store_true", help=f"only the fast files: {' '.join(FAST)}")
    parser.add_argument("--work", type=Path, default=WORK)
    parser.add_argument("--version", default=importlib.metadata.version("llama_cpp_python"))
    parser.add_argument("--timeout", type=float, default=900, help="seconds per file")
    parser.add_argument("--port", type=int, default=8080, help="the port the suite's servers take")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    try:
        tests = fetch(args.work, args.version)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    every = sorted(p.stem for p in (tests / "unit").glob("test_*.py"))
    names = FAST if args.fast else [n.removesuffix(".py") for n in args.files] or every
    rows = []
    with tempfile.TemporaryDirectory(prefix="fly-suite-") as tmp_dir:
        tmp = Path(tmp_dir)
        exe = wrapper(tmp)
        for name in names:
            if name in OUT_OF_SCOPE:
                rows.append({"file": name, "out_of_scope": True})
            else:
                rows.append(run_file(tests, name, exe, tmp, args.timeout, args.port))
            print(line(rows[-1]), flush=True)
    total = {k: sum(int(r.get(k, 0)) for r in rows) for k in ("passed", "failed", "not_runnable", "skipped")}
    runnable = total["passed"] + total["failed"]
    share = 100 * total["passed"] / runnable if runnable else 0.0
    print(f"total: {total['passed']} passed, {total['failed']} failed, {total['not_runnable']} not runnable, "
          f"{total['skipped']} skipped ({share:.0f}% of runnable)")
    if args.json:
        args.json.write_text(json.dumps({"files": rows, "total": total}, indent=1))
    return 0


def line(row: dict[str, object]) -> str:
    if row.get("out_of_scope"):
        return f"{row['file']:<28} out of scope"
    if "error" in row and "passed" not in row:
        return f"{row['file']:<28} {row['error']}"
    return (f"{row['file']:<28} {row['passed']:>3} passed {row['failed']:>3} failed "
            f"{row['not_runnable']:>3} not runnable {row['skipped']:>3} skipped")


if __name__ == "__main__":
    sys.exit(main())
