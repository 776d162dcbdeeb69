"""Entry point: the ``fly-cpp`` command group and its error handling.

Every error reaches the user as one line on stderr and a non-zero exit status: 2 for a bad
command line, 1 for anything else (missing file, incompatible models, ...). No tracebacks.
"""

from __future__ import annotations

import os
import sys

import click

from fly_cpp.backend import rpc
from fly_cpp.basics.errors import FlyError, UsageError


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="fly-cpp", prog_name="fly-cpp")
def cli() -> None:
    """Fast local text generation with loosely speculative decoding (FLy) on llama.cpp."""


# Each command lives in its own module ``fly_cpp.cli.<name>`` exposing a click command or
# group of the same name (rpc_server: the command rpc-server); modules not present in this
# build are skipped.
COMMANDS = ("generate", "chat", "serve", "bench", "models", "profile", "rpc_server")


def _register() -> None:
    import importlib
    import importlib.util

    for name in COMMANDS:
        module_name = f"fly_cpp.cli.{name}"
        if name.replace("_", "-") in cli.commands or importlib.util.find_spec(module_name) is None:
            continue
        cli.add_command(getattr(importlib.import_module(module_name), name))


def _fail(message: str, code: int) -> int:
    click.echo(f"fly-cpp: error: {' '.join(message.split())}", err=True)
    return code


def main(argv: list[str] | None = None) -> int:
    code = _main(argv)
    if rpc.lost():
        # threads are parked inside llama.cpp for good (see fly_cpp.backend.rpc): leave without the
        # interpreter's teardown, which could wait on them or free what they hold
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
    return code


def _main(argv: list[str] | None) -> int:
    _register()
    try:
        cli.main(args=argv, prog_name="fly-cpp", standalone_mode=False)
    except click.UsageError as e:
        hint = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
        return _fail(e.format_message() + hint, 2)
    except click.ClickException as e:
        return _fail(e.format_message(), e.exit_code or 1)
    except UsageError as e:  # arguments that do not go together: a bad command line
        return _fail(str(e), 2)
    except FlyError as e:
        return _fail(str(e), 1)
    except (KeyboardInterrupt, click.Abort):
        click.echo("", err=True)
        return 130
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (e.g. `| head`): nothing more to say
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
