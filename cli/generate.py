"""``fly-cpp generate``: one prompt in, streamed text out, stats on stderr."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from fly_cpp.cli.models_opt import model_options, open_engine
from fly_cpp.cli.options import constraint_files, max_tokens_option, pick, read_constraint_files, settings_options

from fly_cpp.basics.errors import FlyError
from fly_cpp.config import SamplingSettings, SpecSettings


@click.command()
@click.option("-p", "--prompt", help="the prompt text ('-' reads standard input)")
@click.option("-f", "--file", "prompt_file", type=click.Path(dir_okay=False), help="read the prompt from a file")
@max_tokens_option(type=click.IntRange(min=0), default=128, show_default=True, help="tokens to generate")
@click.option("--stop", multiple=True, help="stop when this text appears (repeatable)")
@click.option("--json", "as_json", is_flag=True,
              help='print one JSON object {"text", "tokens", "stats", "finish_reason"} instead of streaming; '
                   'finish_reason is "stop" (end of text or a --stop string) or "length" (-n tokens, or the '
                   'context is full)')
@click.option("--echo/--no-echo", default=True, show_default=True, help="print the prompt before the streamed text")
@click.option("--no-display-prompt", "hide_prompt", is_flag=True, help="as --no-echo (llama.cpp's spelling)")
@click.option("-e", "--escape/--no-escape", default=True,
              help="process the escapes of -p's text (\\n, \\r, \\t, \\', \\\", \\\\, \\xHH), as llama.cpp does; "
                   "a -f file or standard input is read as it is [default: on]")
@click.option("-no-cnv", "--no-conversation", "no_conversation", is_flag=True,
              help="accepted for llama.cpp's habit: generate is always one prompt in, text out ('fly-cpp chat' converses)")
@model_options
@settings_options(SpecSettings)
@settings_options(SamplingSettings)
@constraint_files
def generate(prompt: str | None, prompt_file: str | None, max_tokens: int, stop: tuple[str, ...], as_json: bool,
             echo: bool, hide_prompt: bool, escape: bool, no_conversation: bool, **options: Any) -> None:
    """Generate text from a prompt with a target model and a draft model.

    With no -m/-d, the bundled tiny story model and its draft are used.
    """
    if escape and prompt not in (None, "-"):
        prompt = process_escapes(prompt)
    text = _read_prompt(prompt, prompt_file)
    echo = echo and not hide_prompt
    read_constraint_files(options)
    spec = SpecSettings(**pick(options, SpecSettings))
    sampling = SamplingSettings(**pick(options, SamplingSettings))
    with open_engine(options, spec.max_draft, spec.draft_tree > 0) as engine:
        gen = engine.generate(text, spec=spec, sampling=sampling, max_tokens=max_tokens, stop=stop)
        if as_json:
            gen.run()
            click.echo(json.dumps({"text": gen.text, "tokens": gen.tokens, "stats": gen.stats.as_dict(),
                                   "finish_reason": gen.finish_reason}))
        else:
            out = sys.stdout
            if echo:
                out.write(text)
            for step in gen:
                out.write(step.text)
                out.flush()
            out.write("\n")
            out.flush()
            click.echo(f"{gen.stats.summary()}; {engine.info().placement}", err=True)
        if (note := engine.slower_note(gen)) is not None:
            click.echo(f"fly-cpp: note: {note}", err=True)
        if gen.context_full:
            click.echo(f"fly-cpp: note: the context is full (n_ctx={engine.n_ctx}); generation stopped", err=True)


def _read_prompt(prompt: str | None, prompt_file: str | None) -> str:
    if prompt is not None and prompt_file is not None:
        raise click.UsageError("give the prompt with -p or -f, not both")
    if prompt_file is not None:
        try:
            with open(prompt_file, encoding="utf-8") as f:
                return f.read()
        except OSError as e:
            raise FlyError(f"cannot read prompt file {prompt_file}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise FlyError(f"prompt file {prompt_file} is not UTF-8 text") from None
    if prompt == "-" or (prompt is None and not sys.stdin.isatty()):
        text = read_stdin()
        if prompt == "-" or text:
            return text
    if prompt is None:
        raise click.UsageError("no prompt: give one with -p TEXT, -f FILE, or on standard input")
    return prompt


_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "'": "'", '"': '"', "\\": "\\", "a": "\a", "b": "\b", "f": "\f",
            "v": "\v", "?": "?"}


def process_escapes(text: str) -> str:
    """``text`` with its backslash escapes turned into the characters they name, as llama.cpp's
    tools treat ``-p`` (its ``--escape``, on by default): ``\\n`` is a newline; an unknown escape
    stays as written."""
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt in _ESCAPES:
                out.append(_ESCAPES[nxt])
                i += 2
                continue
            if nxt == "x" and len(text) >= i + 4 and all(h in "0123456789abcdefABCDEF" for h in text[i + 2:i + 4]):
                out.append(chr(int(text[i + 2:i + 4], 16)))
                i += 4
                continue
        out.append(c)
        i += 1
    return "".join(out)


def read_stdin() -> str:
    """Standard input as UTF-8 text, or one clear error."""
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FlyError(f"standard input is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None
