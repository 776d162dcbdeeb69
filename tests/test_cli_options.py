"""llama.cpp's spellings of the options, on every command that has the option: each one parses
to the same settings as the long form; and the draft model's settings follow the target's."""

from __future__ import annotations

import dataclasses
from typing import Any

import click
import pytest

from fly_cpp.cli.bench import bench
from fly_cpp.cli.chat import chat
from fly_cpp.cli.generate import generate
from fly_cpp.cli.models_opt import model_settings
from fly_cpp.cli.options import pick
from fly_cpp.cli.serve import serve
from fly_cpp.config import ModelSettings, SamplingSettings, SpecSettings

COMMANDS = {"generate": generate, "chat": chat, "serve": serve, "bench": bench}

# (llama.cpp's spellings, the long form): each spelling with the same value must parse the same
ALIASES = [
    (["-c", "--ctx-size"], ["--n-ctx", "1024"]),
    (["-t", "--threads"], ["--n-threads", "3"]),
    (["-td", "--threads-draft", "--spec-draft-threads"], ["--draft-n-threads", "2"]),
    (["-b", "--batch-size"], ["--n-batch", "256"]),
    (["-ub", "--ubatch-size"], ["--n-ubatch", "64"]),
    (["-ngl", "--gpu-layers"], ["--n-gpu-layers", "99"]),
    (["-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft", "--spec-draft-ngl"], ["--draft-n-gpu-layers", "7"]),
    (["-sm"], ["--split-mode", "row"]),
    (["-ts"], ["--tensor-split", "3,1"]),
    (["-mg"], ["--main-gpu", "1"]),
    (["-ctk", "--cache-type-k"], ["--type-k", "q8_0"]),
    (["-ctv", "--cache-type-v"], ["--type-v", "q4_0"]),
    (["-ctkd", "--cache-type-k-draft", "--spec-draft-type-k"], ["--draft-type-k", "q8_0"]),
    (["-ctvd", "--cache-type-v-draft", "--spec-draft-type-v"], ["--draft-type-v", "q5_1"]),
    (["-fa"], ["--flash-attn", "off"]),
    (["--draft-max", "--draft-n", "--spec-draft-n-max"], ["--k", "4"]),
    (["--draft-min", "--draft-n-min", "--spec-draft-n-min"], ["--n-min", "2"]),
    (["--draft-p-min", "--spec-draft-p-min"], ["--p-min", "0.75"]),
    (["--temp"], ["--temperature", "0.2"]),
    (["-s"], ["--seed", "42"]),
    (["-n", "--n-predict", "--predict"], ["--max-tokens", "17"]),
    (["-md", "--model-draft", "--spec-draft-model", "-d"], ["--draft", "d.gguf"]),
    (["-hf", "-hfr"], ["--hf-repo", "owner/name:Q8_0"]),
    (["-hff"], ["--hf-file", "x.gguf"]),
    (["-hfd", "-hfrd", "--hf-repo-draft", "--spec-draft-hf"], ["--hf-draft-repo", "owner/small:Q4_0"]),
    (["-sys", "--system-prompt"], ["--system", "Be brief."]),
    (["-a"], ["--alias", "my-model"]),
]


def parse(command: click.Command, args: list[str]) -> dict[str, Any]:
    with command.make_context(command.name or "", list(args), resilient_parsing=False) as ctx:
        return dict(ctx.params)


def has(command: click.Command, opt: str) -> bool:
    return any(opt in (*p.opts, *p.secondary_opts) for p in command.params)


CASES = [(name, alias, long) for name, command in COMMANDS.items() for aliases, long in ALIASES
         if has(command, long[0]) for alias in aliases]


@pytest.mark.parametrize("name, alias, long", CASES, ids=[f"{c[0]}:{c[1]}" for c in CASES])
def test_alias_parses_as_the_long_form(name: str, alias: str, long: list[str]) -> None:
    command = COMMANDS[name]
    assert has(command, alias), f"{name} lacks {alias}"
    assert parse(command, [alias, *long[1:]]) == parse(command, long)


def test_every_command_takes_the_spellings_it_should() -> None:
    for name in ("generate", "chat", "serve", "bench"):
        for opt in ("-md", "-ngld", "-td", "-ctk", "-ctv", "-ctkd", "-ctvd", "-fa", "-hf", "--temp", "--ctx-size",
                    "--threads", "--draft-max", "--draft-p-min", "--draft-min", "--mlock", "--no-mmap"):
            assert has(COMMANDS[name], opt), f"{name} {opt}"
    for name in ("generate", "chat", "bench"):
        assert has(COMMANDS[name], "--n-predict")
    assert has(serve, "--alias") and has(chat, "-sys")


def settings(args: list[str], command: click.Command = generate) -> tuple[Any, ...]:
    params = parse(command, args)
    target, draft = model_settings(params)
    return target, draft, SpecSettings(**pick(params, SpecSettings)), SamplingSettings(**pick(params, SamplingSettings))


def test_same_settings_objects_as_the_long_form() -> None:
    llama_cpp = ["-m", "t.gguf", "-md", "d.gguf", "-c", "2048", "-t", "2", "-td", "1", "--temp", "0",
                 "--draft-max", "8", "--draft-min", "2", "--draft-p-min", "0.5", "-fa", "-ctk", "Q8_0", "-ngl", "99"]
    ours = ["-m", "t.gguf", "-d", "d.gguf", "--n-ctx", "2048", "--n-threads", "2", "--draft-n-threads", "1",
            "--temperature", "0", "--k", "8", "--n-min", "2", "--p-min", "0.5", "--flash-attn", "on",
            "--type-k", "q8_0", "--n-gpu-layers", "99"]
    assert settings(llama_cpp) == settings(ours)
    target, draft, spec, sampling = settings(llama_cpp)
    assert (target.n_ctx, target.n_threads, target.flash_attn, target.type_k) == (2048, 2, "on", "q8_0")
    assert (spec.k, spec.n_min, spec.p_min, sampling.temperature) == (8, 2, 0.5, 0.0)
    assert draft is not None and draft.path == "d.gguf" and draft.n_threads == 1


def test_md_is_one_option_not_m_then_d() -> None:
    target, draft, *_ = settings(["-md", "d.gguf", "-m", "t.gguf"])
    assert (target.path, draft.path) == ("t.gguf", "d.gguf")


def test_draft_follows_the_target_unless_set() -> None:
    target, draft, *_ = settings(["-m", "t.gguf", "-md", "d.gguf", "-t", "3", "-ngl", "99", "-ctk", "q8_0",
                                  "-ctv", "q8_0", "-fa", "on", "--no-mmap", "--mlock", "-c", "1024"])
    assert draft == dataclasses.replace(target, path="d.gguf")
    assert (draft.n_threads, draft.n_gpu_layers, draft.type_k, draft.flash_attn, draft.mmap, draft.mlock) == (
        3, 99, "q8_0", "on", False, True)
    _, draft, *_ = settings(["-m", "t.gguf", "-md", "d.gguf", "-t", "3", "-ngl", "99", "-td", "1", "-ngld", "0",
                             "-ctkd", "f32"])
    assert (draft.n_threads, draft.n_gpu_layers, draft.type_k) == (1, 0, "f32")


def test_bad_values_are_one_line_errors() -> None:
    from fly_cpp.cli.main import main

    assert main(["generate", "-ctk", "q3_k", "-p", "x"]) == 2
    assert main(["generate", "-fa", "maybe", "-p", "x"]) == 2
    with pytest.raises(Exception, match="type_k must be one of"):
        ModelSettings(path="x", type_k="q3_k")
    assert ModelSettings(path="x", type_k="Q8_0", flash_attn=True) == ModelSettings(path="x", type_k="q8_0",
                                                                                    flash_attn="on")
