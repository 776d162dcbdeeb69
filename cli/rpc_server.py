"""``fly-cpp rpc-server``: llama.cpp's RPC server on this machine, for other machines' ``--rpc``.

Same protocol and behaviour as llama.cpp's own ``rpc-server`` binary (the GPUs, else the CPU;
one client at a time), without building llama.cpp: it runs the ggml that llama-cpp-python
ships, which must have been built with ``-DGGML_RPC=ON``.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import click

from fly_cpp.basics.errors import FlyError

WARNING = ("llama.cpp's RPC protocol has no authentication: anyone who can reach {where} can use this "
           "machine's memory and compute. Bind rpc-servers to trusted networks only.")


@click.command("rpc-server")
@click.option("-H", "--host", default="127.0.0.1", show_default=True, help="address to listen on (IPv4)")
@click.option("-p", "--port", type=click.IntRange(1, 65535), default=50052, show_default=True, help="TCP port")
@click.option("-t", "--threads", type=click.IntRange(min=0), default=0,
              help="CPU threads; 0 = $FLY_CPP_THREADS, else all cores")
@click.option("-c", "--cache", is_flag=True, help="cache received tensors on disk, like llama.cpp's rpc-server -c "
              "($LLAMA_CACHE/rpc, else ~/.cache/llama.cpp/rpc): reloads send hashes, not weights")
@click.option("--trusted-network", is_flag=True,
              help="allow a non-loopback --host (no authentication: trusted networks only)")
def rpc_server(host: str, port: int, threads: int, cache: bool, trusted_network: bool) -> None:
    """Serve this machine's GPUs (or its CPU) to other fly-cpp or llama.cpp processes, which
    put model layers here with --rpc HOST:PORT. Stop it with Ctrl-C.
    """
    from fly_cpp.backend import rpc
    from fly_cpp.backend.lib import library

    where = f"{host}:{port}"
    if not rpc.is_loopback(host):
        if not trusted_network:
            raise click.UsageError(f"refusing to listen on {host}, which is not a loopback address: "
                                   + WARNING.format(where=where) + " Add --trusted-network to do it anyway")
        click.echo("fly-cpp: WARNING: " + WARNING.format(where=where), err=True)
    rpc.check_port(host, port)
    lib = library()
    if not rpc.supported(lib):
        raise FlyError(f"this build of llama-cpp-python has no RPC support; rebuild it with: {rpc.INSTALL}")
    cache_dir = _cache_dir() if cache else None
    n_threads = threads or int(os.environ.get("FLY_CPP_THREADS") or 0) or os.cpu_count() or 1
    click.echo(f"fly-cpp: rpc-server on {where} ({', '.join(rpc.device_names(lib))}, threads: {n_threads}); "
               f"clients: --rpc {where}", err=True)
    # ggml's server loop never returns while it runs, and a thread inside a C call cannot take
    # Python's signals: it runs on its own thread so that Ctrl-C reaches this one.
    server = threading.Thread(target=rpc.serve, args=(lib, host, port, n_threads, cache_dir), daemon=True)
    server.start()
    try:
        while server.is_alive():
            server.join(0.5)
    except KeyboardInterrupt:
        sys.stdout.flush()
        click.echo("", err=True)
        os._exit(130)  # the server thread is inside ggml: skip the interpreter's teardown around it
    raise FlyError(f"the rpc-server on {where} stopped (see ggml's message above)")


def _cache_dir() -> str:
    root = os.environ.get("LLAMA_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "llama.cpp")
    path = Path(root) / "rpc"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FlyError(f"cannot create the cache directory {path}: {e.strerror}") from None
    return str(path)
