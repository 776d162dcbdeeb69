"""``fly-cpp chat``: an interactive conversation in the terminal.

Answers stream to stdout as tokens are committed; a one-line stats footer per answer goes to
stderr. Standard input need not be a terminal: each line piped in is one message (commands
included), and the chat ends at end of input. A line ending in a backslash continues the
message on the next line.

Ctrl-C during an answer stops that answer (the part already shown stays in the conversation,
and the footer counts only that part); a second Ctrl-C before it stops quits. Ctrl-C at the
prompt clears the line; Ctrl-D quits. In a terminal, Up recalls a continued message whole.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import sys
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from fly_cpp.cli.models_opt import model_options, open_engine, template_fallback
from fly_cpp.cli.options import max_tokens_option, pick, settings_options

from fly_cpp.api.chat_format import BUILTIN, is_builtin
from fly_cpp.api.fly import Fly
from fly_cpp.basics.errors import FlyError
from fly_cpp.config import AUTO, SamplingSettings, SpecSettings
from fly_cpp.engine.generation import Generation
from fly_cpp.rounds.step import Stats, Step, plural

HELP = """commands:
  /reset            forget the conversation (the system prompt stays)
  /regen            write the last answer again (a new draw, unless greedy or seeded)
  /stats            counters of the last answer and of the session
  /set NAME VALUE   change a setting, e.g. /set temp 0.7, /set k 8, /set max_tokens 200
  /set              show the settings
  /mode MODE        fly, spd or target (same as /set mode MODE)
  /save FILE        write the conversation and settings as JSON
  /help             this text
  /exit             quit (also Ctrl-D)
Ctrl-C stops the answer being written. End a line with \\ to continue the message on the next line."""

GREEN, LOOSE, DIM, RESET = "\x1b[32m", "\x1b[30;43m", "\x1b[2m", "\x1b[0m"
LEGEND = f"colours: {GREEN}drafted and kept{RESET}, {LOOSE}loosely accepted{RESET}, plain: the target's own token"
_TYPES = {**typing.get_type_hints(SpecSettings), **typing.get_type_hints(SamplingSettings)}
# /set also takes the llama.cpp spellings of the command line (/set temp 0.2, /set draft-max 8)
_NAMES = {alias[2:].replace("-", "_"): f.name for cls in (SpecSettings, SamplingSettings)
          for f in dataclasses.fields(cls) for alias in f.metadata.get("aliases", ()) if alias.startswith("--")}
_NAMES.update(n_predict="max_tokens", predict="max_tokens")


@click.command()
@click.option("--system", "-sys", "--system-prompt", "system", help="system prompt")
@max_tokens_option(type=click.IntRange(min=1), default=None,
                   help="longest answer in tokens [default: until the model ends its turn or the context is full]")
@click.option("--stop", multiple=True, help="also end an answer when this text appears (repeatable)")
@click.option("--chat-format", help=f"{', '.join(BUILTIN)}, or a Jinja template file [default: the model's "
              "tokenizer.chat_template, else plain]")
@click.option("--show-accepts", is_flag=True, help="colour drafted tokens the target kept (green) and loosely "
              "accepted ones (yellow) when stdout is a terminal; a legend is shown first")
@model_options
@settings_options(SpecSettings)
@settings_options(SamplingSettings)
def chat(system: str | None, max_tokens: int | None, stop: tuple[str, ...], chat_format: str | None,
         show_accepts: bool, **options: Any) -> None:
    """Chat with a target model sped up by a draft model (type /help for commands).

    With no -m/-d, the bundled tiny story model and its draft are used.
    """
    if chat_format is not None and not is_builtin(chat_format) and os.path.isfile(chat_format):
        with open(chat_format, encoding="utf-8") as f:
            chat_format = f.read()
    spec = SpecSettings(**pick(options, SpecSettings))
    sampling = SamplingSettings(**pick(options, SamplingSettings))
    with template_fallback(Fly.from_engine(open_engine(options, spec.max_draft, spec.draft_tree > 0), chat_format=chat_format, spec=spec,
                                           sampling=sampling), chat_format) as fly:
        Session(fly, system, max_tokens, stop, show_accepts).run()


class Session:
    def __init__(self, fly: Fly, system: str | None, max_tokens: int | None, stop: tuple[str, ...],
                 show_accepts: bool) -> None:
        self.fly, self.system, self.max_tokens, self.stop = fly, system, max_tokens, stop
        self.interactive = sys.stdin.isatty()
        self.colour = show_accepts and sys.stdout.isatty()
        self.messages: list[dict[str, str]] = []  # set by reset()
        self.last: Stats | None = None
        self.total = Stats(mode="session")
        self.answers = 0
        self.stop_requested = False
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def run(self) -> None:
        # a line that is not UTF-8 must not end the chat: it arrives with its bad bytes escaped
        # (U+DC80..U+DCFF) and is refused with one line when it is tokenized
        if isinstance(sys.stdin, io.TextIOWrapper):
            sys.stdin.reconfigure(errors="surrogateescape")
        history = _history() if self.interactive else None
        if self.interactive:
            draft = self.fly.info.draft_name or "none (n-gram lookup)"
            note(f"fly-cpp chat: target {self.fly.model}, draft {draft}, chat format {self.fly.chat_format.name}, "
                 f"n_ctx {self.fly.n_ctx}. /help for commands, Ctrl-D to quit.")
        if self.colour:
            note(LEGEND)
        try:
            while True:
                try:
                    line = self.read()
                except KeyboardInterrupt:
                    click.echo("")
                    continue
                except EOFError:
                    if self.interactive:
                        click.echo("")
                    return
                if line.startswith("/"):
                    if not self.command(line):
                        return
                elif line.strip():
                    self.answer(line)
        finally:
            if history is not None:
                history()

    def read(self) -> str:
        readline = _readline() if self.interactive else None
        start = readline.get_current_history_length() if readline is not None else 0
        parts = [input("> " if self.interactive else "")]
        while parts[-1].endswith("\\"):
            parts[-1] = parts[-1][:-1]
            parts.append(input("… " if self.interactive else ""))
        message = "\n".join(parts)
        if readline is not None and len(parts) > 1:  # one history entry for the whole message: Up recalls it
            while readline.get_current_history_length() > start:
                readline.remove_history_item(readline.get_current_history_length() - 1)
            readline.add_history(message)
        return message

    # -- answering ------------------------------------------------------------------------

    def answer(self, text: str) -> None:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:  # bytes that were not UTF-8 (see run)
            bad = ord(text[e.start])
            what = f"byte 0x{bad - 0xDC00:02x}" if 0xDC80 <= bad <= 0xDCFF else f"U+{bad:04X}"
            note(f"fly-cpp: error: that message is not UTF-8 text ({what} at character {e.start}); not sent")
            return
        with self.interruptible():
            self.messages.append({"role": "user", "content": text})
            try:
                prompt = self.fit()
                gen = self.fly.generate(prompt, max_tokens=self.max_tokens,
                                        stop=(*self.fly.chat_format.stop, *self.stop))
            except FlyError as e:
                self.messages.pop()
                note(f"fly-cpp: error: {e}")
                return
            shown = self.write(gen)
        self.messages.append({"role": "assistant", "content": gen.text.strip()})
        s = _shown(gen.stats, shown) if self.stop_requested else gen.stats
        self.count(s)
        footer = (f"[{plural(s.n_tokens, 'token')}, {s.tokens_per_second:.1f} tok/s, "
                  f"mean accepted {s.mean_accepted:.2f}, loose {s.n_loose}")
        if self.stop_requested:
            footer += ", interrupted"
        elif gen.context_full:
            footer += ", context full"
        note(footer + "]", dim=True)
        if not self.stop_requested and (slower := self.fly.engine.slower_note(gen)) is not None:
            note(f"fly-cpp: note: {slower}", dim=True)

    def write(self, gen: Generation) -> list[Step]:
        """Stream the answer to stdout until it ends or Ctrl-C asks it to stop; returns the
        steps shown."""
        out = sys.stdout
        started = False
        shown: list[Step] = []
        if not self.stop_requested:
            for step in gen:
                shown.append(step)
                text = step.text if started else step.text.lstrip()  # as answer_text() does
                started = started or bool(text)
                if self.colour and text and (step.loose or step.drafted):
                    out.write(f"{LOOSE if step.loose else GREEN}{text}{RESET}")
                else:
                    out.write(text)
                out.flush()
                if self.stop_requested:
                    break
        gen.close()
        out.write("\n")
        out.flush()
        return shown

    def fit(self) -> list[int]:
        """Prompt tokens for the conversation, dropping the oldest turns while it leaves too
        little room for an answer."""
        n_ctx = self.fly.n_ctx
        room = min(self.max_tokens or 128, n_ctx // 4)
        dropped = 0
        while True:
            tokens = self.fly.chat_tokens(self.messages)
            first = 1 if self.messages[0]["role"] == "system" else 0
            later = [i for i, m in enumerate(self.messages) if m["role"] == "user" and i > first]
            if len(tokens) + room <= n_ctx or not later:
                break
            del self.messages[first:later[0]]
            dropped += 1
        if dropped:
            note(f"(dropped the {dropped} oldest turn{'s' if dropped > 1 else ''} to fit the context of {n_ctx} tokens)")
        if len(tokens) >= n_ctx:
            raise FlyError(f"the conversation is {len(tokens)} tokens, the context holds {n_ctx}; /reset or shorten it")
        return tokens

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        """First Ctrl-C: stop the answer at the next token. Second: KeyboardInterrupt."""
        self.stop_requested = False

        def on_sigint(signum: int, frame: Any) -> None:
            if self.stop_requested:
                raise KeyboardInterrupt
            self.stop_requested = True

        previous = signal.signal(signal.SIGINT, on_sigint)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def count(self, s: Stats) -> None:
        self.last, self.answers = s, self.answers + 1
        t = self.total
        for name in ("n_prompt", "n_tokens", "n_rounds", "n_drafted", "n_exact", "n_loose", "n_gate_rejected",
                     "n_guard_rejected", "n_eog", "prompt_seconds", "draft_seconds", "target_seconds", "seconds"):
            setattr(t, name, getattr(t, name) + getattr(s, name))

    # -- commands -------------------------------------------------------------------------

    def command(self, line: str) -> bool:
        """Run a /command; False means quit."""
        name, _, arg = line[1:].strip().partition(" ")
        arg = arg.strip()
        if name in ("exit", "quit"):
            return False
        if name == "help":
            click.echo(HELP)
        elif name == "reset":
            self.reset()
            note("(conversation cleared)")
        elif name == "stats":
            if self.last is None:
                click.echo("no answers yet")
            else:
                click.echo(f"last answer: {self.last.summary()}")
                self.total.mode = f"{self.answers} answer{'s' if self.answers > 1 else ''}"
                click.echo(f"session, {self.total.summary()}")
        elif name == "mode":
            self.set("mode", arg)
        elif name == "set":
            if arg:
                key, _, value = arg.partition(" ")
                self.set(key, value.strip())
            else:
                for key, value in {**dataclasses.asdict(self.fly.spec), **dataclasses.asdict(self.fly.sampling),
                                   "max_tokens": self.max_tokens}.items():
                    click.echo(f"  {key} = {value}")
        elif name == "save":
            self.save(arg)
        elif name == "regen":
            if len(self.messages) >= 2 and self.messages[-1]["role"] == "assistant":
                self.messages.pop()  # the answer, then its question, asked again
                self.answer(self.messages.pop()["content"])
            else:
                note("no answer to write again yet")
        else:
            note(f"unknown command /{name}; /help lists the commands")
        return True

    def set(self, key: str, value: str) -> None:
        key = key.replace("-", "_")
        key = _NAMES.get(key, key)
        try:
            if key == "max_tokens":
                n = int(value) if value.lower() not in ("", "none", "0") else None
                if n is not None and n < 0:
                    raise FlyError(f"max_tokens must be >= 0, got {n}")
                self.max_tokens = n
            elif key in _TYPES:
                target = "spec" if key in SpecSettings.__dataclass_fields__ else "sampling"
                new = dataclasses.replace(getattr(self.fly, target), **{key: _parse(key, value)})
                setattr(self.fly, target, new)
            else:
                note(f"unknown setting {key!r}; /set lists them")
                return
        except (ValueError, FlyError) as e:
            note(f"fly-cpp: error: {e}")
            return
        note(f"({key} = {self.max_tokens if key == 'max_tokens' else _parse(key, value)})")

    def save(self, path: str) -> None:
        if not path:
            note("usage: /save FILE")
            return
        info = self.fly.info
        data = {"target": str(info.target.path), "draft": str(info.draft.path) if info.draft is not None else None,
                "chat_format": self.fly.chat_format.name,
                "settings": {**dataclasses.asdict(self.fly.spec), **dataclasses.asdict(self.fly.sampling),
                             "max_tokens": self.max_tokens},
                "messages": self.messages}
        try:
            with open(os.path.expanduser(path), "w", encoding="utf-8") as f:
                json.dump(data, f, indent=2, ensure_ascii=False)
                f.write("\n")
        except OSError as err:
            note(f"fly-cpp: error: cannot write {path}: {err.strerror}")
            return
        note(f"(saved {len(self.messages)} messages to {path})")


def _shown(stats: Stats, shown: list[Step]) -> Stats:
    """The counters of an interrupted answer, for the part that was shown (and kept): the
    rounds that made it, and its tokens (the rest of the last round was never shown)."""
    return dataclasses.replace(stats, n_tokens=len(shown), n_rounds=max((s.round for s in shown), default=0),
                               n_exact=sum(s.drafted and not s.loose for s in shown),
                               n_loose=sum(s.loose for s in shown), n_eog=0, accepted_lengths=[])


def _parse(key: str, value: str) -> Any:
    hint = _TYPES[key]
    if hint == int | str:  # a number or "auto": k, k_gpu
        return value if value == AUTO else int(value)
    if hint is bool:
        if value.lower() not in ("on", "off", "true", "false", "1", "0", "yes", "no"):
            raise ValueError(f"{key} takes on or off, got {value!r}")
        return value.lower() in ("on", "true", "1", "yes")
    if hint in (int | None,) and value.lower() in ("none", ""):
        return None
    if hint in (int, int | None):
        return int(value)
    if hint is float:
        return float(value)
    return value


def note(text: str, dim: bool = False) -> None:
    """Footers, notes and errors go to stderr, so stdout carries only the answers."""
    if dim and sys.stderr.isatty():
        text = f"{DIM}{text}{RESET}"
    click.echo(text, err=True)


def _readline() -> Any:
    try:
        import readline
    except ImportError:
        return None
    return readline


def _history() -> Any:
    """Load readline history; returns the function that saves it (None without readline)."""
    readline = _readline()
    if readline is None:
        return None
    path = os.environ.get("FLY_CPP_HISTORY") or os.path.expanduser("~/.fly_cpp_history")
    try:
        readline.read_history_file(path)
    except (OSError, ValueError):
        pass
    readline.set_history_length(1000)

    def save() -> None:
        try:
            readline.write_history_file(path)
        except OSError:
            pass

    return save

