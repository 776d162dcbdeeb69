"""Click options derived from the settings dataclasses, so each option is declared once.

Each option is spelled by its field's name (``n_ctx`` -> ``--n-ctx``) and by llama.cpp's
spellings from the field's metadata (``-c``, ``--ctx-size``; the draft copy of a model setting
has its own, e.g. ``-td``). Single-dash names of several letters (``-ngl``, ``-md``, ``-ctk``)
are whole option names, as in llama.cpp, not clusters of one-letter options.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any

import click

from fly_cpp.basics.errors import FlyError
from fly_cpp.config import AUTO, CACHE_TYPES, DRAWS, FLASH_ATTN, FLY_RULES, MODES, ROLLBACK, SPLIT_MODES, STEADY

_CHOICES = {"mode": MODES, "split_mode": SPLIT_MODES, "type_k": CACHE_TYPES, "type_v": CACHE_TYPES,
            "flash_attn": FLASH_ATTN, "fly_rule": FLY_RULES, "steady_batches": STEADY, "rollback": ROLLBACK, "draw": DRAWS}


def aliases(f: dataclasses.Field[Any], prefix: str = "") -> list[str]:
    """llama.cpp's spellings of a field's option (of its draft copy when ``prefix`` is "draft_")."""
    key = {"": "aliases", "draft_": "draft_aliases"}.get(prefix)
    return list(f.metadata.get(key, ())) if key else []


def field_aliases(cls: type, name: str) -> list[str]:
    """llama.cpp's spellings of the option of ``cls``'s field ``name`` (for options a command
    declares by hand, such as bench's list of k)."""
    return aliases(next(f for f in dataclasses.fields(cls) if f.name == name))


def max_tokens_option(**kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``-n/--max-tokens``, also spelled as llama.cpp does (``--n-predict``, ``--predict``)."""
    return click.option("-n", "--max-tokens", "--n-predict", "--predict", "max_tokens", **kwargs)


class NumberList(click.ParamType):
    """A comma-separated list of numbers ("3,1" or "3,5,8"), optionally each >= ``minimum``."""

    def __init__(self, kind: type = float, minimum: float | None = None) -> None:
        self.kind, self.minimum = kind, minimum
        self.name = "INTS" if kind is int else "FLOATS"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[Any, ...]:
        if isinstance(value, tuple):
            return value
        try:
            out = tuple(self.kind(v) for v in str(value).split(",") if v.strip())
        except ValueError:
            self.fail(f"{value!r} is not a comma-separated list of {self.kind.__name__}s", param, ctx)
        if self.minimum is not None and (not out or min(out) < self.minimum):
            self.fail(f"{value!r}: every value must be >= {self.minimum}", param, ctx)
        return out


class TextList(click.ParamType):
    """A comma-separated list of strings ("a:1,b:2")."""

    name = "LIST"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        return tuple(v.strip() for v in str(value).split(","))


class Threshold(click.ParamType):
    """A float that also accepts 'inf'."""

    name = "FLOAT"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            return float(value)
        except ValueError:
            self.fail(f"{value!r} is not a number (use 'inf' for no loose accepts)", param, ctx)


class DraftLength(click.ParamType):
    """'auto' or a number (k, k_gpu, -np; the settings check its range)."""

    name = "auto|N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | str:
        if isinstance(value, int) or value == AUTO:
            return value
        try:
            return int(value)
        except ValueError:
            self.fail(f"{value!r} is neither 'auto' nor a number", param, ctx)


class DraftLengths(click.ParamType):
    """A comma-separated list of draft lengths: 'auto' or numbers >= 1 ("auto,3,5,8")."""

    name = "auto|N,..."

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[Any, ...]:
        if isinstance(value, tuple):
            return value
        out = tuple(DraftLength().convert(v.strip(), param, ctx) for v in str(value).split(",") if v.strip())
        if not out or any(isinstance(k, int) and k < 1 for k in out):
            self.fail(f"{value!r}: every value must be >= 1 (or 'auto')", param, ctx)
        return out


class LogitBias(click.ParamType):
    """llama.cpp's ``--logit-bias TOKEN+BIAS`` / ``TOKEN-BIAS`` (``-inf`` bans), comma-separated."""

    name = "TOKEN±BIAS"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[Any, ...]:
        if isinstance(value, tuple):
            return value
        out = []
        for item in str(value).split(","):
            m = re.fullmatch(r"\s*(\d+)\s*([+-])\s*(inf|[0-9]*\.?[0-9]+(?:[eE][+-]?\d+)?)\s*", item)
            if m is None:
                self.fail(f"{item!r} is not TOKEN+BIAS or TOKEN-BIAS (e.g. 15043+1.5 or 2-inf)", param, ctx)
            bias = float(m.group(3)) * (1 if m.group(2) == "+" else -1)
            out.append((int(m.group(1)), bias))
        return tuple(out)


def _param_type(f: dataclasses.Field[Any], hint: Any) -> Any:
    if f.name == "logit_bias":
        return LogitBias()
    if hint == int | str:  # a number or "auto": k, k_gpu, -np
        return DraftLength()
    if f.name in _CHOICES:
        return click.Choice(_CHOICES[f.name], case_sensitive=False)
    if f.name == "entropy_threshold":
        return Threshold()
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple:
        return TextList() if args[0] is str else NumberList(float)
    if isinstance(hint, types.UnionType):
        hint = next(a for a in args if a is not type(None))
    return {int: int, float: float, str: str}.get(hint, str)


def settings_options(cls: type, *, prefix: str = "", only: Iterable[str] | None = None,
                     skip: Iterable[str] = ()) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add one click option per field of ``cls``. Options default to None (= the dataclass
    default), so callers can tell "unset" from "set to the default". Parameter names are
    ``prefix + field name``."""
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.name not in set(skip) and (only is None or f.name in set(only))]

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        for f in reversed(fields):
            own = f.metadata.get("flag", f.name.replace("_", "-"))
            dashed = prefix.replace("_", "-") + own
            help_text = f.metadata.get("help", "")
            default = f.default
            if prefix == "draft_":  # a draft model's setting: unset, it follows the target's
                help_text = f"the draft model's --{own} [default: the target's]"
            elif default is not dataclasses.MISSING and default not in ((), None):
                shown = "inf" if isinstance(default, float) and math.isinf(default) else default
                help_text += f" [default: {shown}]"
            envvar = f.metadata.get("envvar")
            if envvar:
                help_text += f" [env: {envvar}]"
            if hints[f.name] in (bool, bool | None):
                decls = [f"--{dashed}/--no-{dashed}", prefix + f.name]
                fn = click.option(*decls, default=None, help=help_text)(fn)
            else:
                decls = [f"--{dashed}", *(a for a in aliases(f, prefix) if a != f"--{dashed}"), prefix + f.name]
                bare = {"is_flag": False, "flag_value": f.metadata["bare"]} if "bare" in f.metadata else {}
                fn = click.option(*decls, type=_param_type(f, hints[f.name]), default=None, help=help_text,
                                  envvar=envvar, metavar=f.metadata.get("metavar"), **bare)(fn)
        return fn

    return decorate


def pick(values: dict[str, Any], cls: type, prefix: str = "") -> dict[str, Any]:
    """The set (non-None) values among ``values`` that belong to ``cls``'s fields (a model's
    ``path`` is never an option value: -m/-d name models through the source resolver)."""
    names = {f.name for f in dataclasses.fields(cls)} - {"path"}
    return {k[len(prefix):]: v for k, v in values.items()
            if k.startswith(prefix) and k[len(prefix):] in names and v is not None}


def constraint_files(fn: Callable[..., Any]) -> Callable[..., Any]:
    """llama.cpp's --grammar-file and --json-schema-file: the text of --grammar / --json-schema
    read from a file (``read_constraint_files`` folds them into the options)."""
    fn = click.option("--json-schema-file", "-jf", "json_schema_file", type=click.Path(dir_okay=False),
                      help="read --json-schema from a file")(fn)
    return click.option("--grammar-file", "grammar_file", type=click.Path(dir_okay=False),
                        help="read --grammar (GBNF) from a file")(fn)


def read_constraint_files(options: dict[str, Any]) -> None:
    """Replace --grammar-file / --json-schema-file in ``options`` by the text they name."""
    for name in ("grammar", "json_schema"):
        path = options.pop(f"{name}_file", None)
        if path is None:
            continue
        if options.get(name):
            raise click.UsageError(f"give --{name.replace('_', '-')} or --{name.replace('_', '-')}-file, not both")
        try:
            with open(path, encoding="utf-8") as f:
                options[name] = f.read()
        except OSError as e:
            raise FlyError(f"cannot read {name.replace('_', ' ')} file {path}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise FlyError(f"{name.replace('_', ' ')} file {path} is not UTF-8 text") from None
