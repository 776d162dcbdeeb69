#!/usr/bin/env python3
"""Start ``fly-cpp serve`` from llama-server's command line, as llama-server's own test suite
(``tools/server/tests/utils.py``) gives it.

Flags ``fly-cpp serve`` knows pass through unchanged; the model flags point at the repository's
bundled stories260K pair where the suite asks for stories260K; flags it does not know are dropped
with a note on stderr, so the tests about them fail on their own assertions. A model that is not
available offline ends the process with exit status 3 and its name written to the file named by
$FLY_SUITE_NOTE, which the suite's plugin turns into "not runnable". With $FLY_SUITE_SOURCE set
to another source tree of fly-cpp (laid out as installed: fly_cpp/ with cli/ and models/ in it),
that tree is served instead of the installed one, for before/after comparisons.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STORIES = REPO / "models" / "stories260K" / "stories260K.gguf"
STORIES_DRAFT = REPO / "models" / "stories260K" / "stories260K-draft.gguf"
# (hf repo, hf file) pairs the suite uses for stories260K
OFFLINE = {("ggml-org/models", "tinyllamas/stories260K.gguf"), ("ggml-org/test-model-stories260K", None)}
# llama-server flags that take no value (all the others the suite gives take one)
BARE = {"--offline", "--cont-batching", "--embedding", "--reranking", "--metrics", "--kv-unified", "--swa-full",
        "--slots", "--no-slots", "--verbose", "--context-shift", "--no-ui", "--no-models-autoload", "--jinja",
        "--no-jinja", "--no-mmproj", "--no-cache-idle-slots", "--ui-mcp-proxy", "--backend_sampling"}
MODEL = {"--model", "-m", "--hf-repo", "-hf", "-hfr", "--hf-file", "-hff", "--model-draft", "-md", "--model-url"}


def _known() -> dict[str, bool]:
    """``fly-cpp serve``'s option names -> whether the option is a flag."""
    from fly_cpp.cli.serve import serve

    known: dict[str, bool] = {}
    for param in serve.params:
        for name in [*param.opts, *getattr(param, "secondary_opts", [])]:
            known[name] = bool(getattr(param, "is_flag", False))
    return known


def _pairs(argv: list[str]) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag in BARE or i + 1 >= len(argv):
            out.append((flag, None))
            i += 1
        else:
            out.append((flag, argv[i + 1]))
            i += 2
    return out


def _unrunnable(what: str) -> None:
    note = os.environ.get("FLY_SUITE_NOTE")
    if note:
        Path(note).write_text(f"model not available offline: {what}\n")
    print(f"llama_server_wrap: model not available offline: {what}", file=sys.stderr)
    sys.exit(3)


def translate(argv: list[str]) -> list[str]:
    pairs = _pairs(argv)
    given = {flag: value for flag, value in pairs}
    repo, file = given.get("--hf-repo"), given.get("--hf-file")
    args: list[str] = []
    if given.get("--model"):
        if not Path(str(given["--model"])).is_file():
            _unrunnable(str(given["--model"]))
        args += ["-m", str(given["--model"])]
    elif repo:
        if (repo, file) not in OFFLINE:
            _unrunnable(f"{repo} {file or ''}".strip())
        args += ["-m", str(STORIES)]
    elif given.get("--model-url"):
        _unrunnable(str(given["--model-url"]))
    else:
        args += ["-m", str(STORIES)]
    draft = given.get("--model-draft")
    if draft and not Path(draft).is_file():
        _unrunnable(draft)
    args += ["-d", draft or str(STORIES_DRAFT)]
    known = _known()
    for flag, value in pairs:
        if flag in MODEL:
            continue
        if flag == "--chat-template-file":
            flag = "--chat-format"
        if flag not in known:
            print(f"llama_server_wrap: fly-cpp serve has no {flag}; dropped", file=sys.stderr)
            continue
        if known[flag] or value is None:
            args.append(flag)
        else:
            args += [flag, value]
    return args


def main() -> None:
    source = os.environ.get("FLY_SUITE_SOURCE")
    if source:  # before translate(): the options known are that tree's
        sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__]
        sys.path.insert(0, source)
    args = translate(sys.argv[1:])
    print("llama_server_wrap: fly-cpp serve " + " ".join(args), file=sys.stderr, flush=True)
    if source:
        from fly_cpp.cli.main import main as fly_main

        sys.exit(fly_main(["serve", *args]))
    exe = Path(sys.executable).parent / "fly-cpp"
    os.execv(str(exe), [str(exe), "serve", *args])


if __name__ == "__main__":
    main()
