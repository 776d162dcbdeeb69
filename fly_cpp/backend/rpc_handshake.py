"""The RPC handshake with an ``rpc-server`` (llama.cpp's ggml-rpc protocol): HELLO, then
DEVICE_COUNT, over a plain TCP socket, before llama.cpp is handed the server (``fly_cpp.backend.rpc``),
so that an unreachable, busy or foreign server is one clear error, not llama.cpp's abort."""

from __future__ import annotations

import select
import socket
import struct
import sys
from collections.abc import Callable

from fly_cpp.basics.errors import FlyError

HANDSHAKE_TIMEOUT = 10.0  # seconds to connect; then a silent server is said to be busy (one client at a time)
PROTOCOL_MAJOR = 7  # RPC_PROTO_MAJOR_VERSION in the ggml-rpc.h of the pinned llama-cpp-python
_CMD_HELLO, _CMD_DEVICE_COUNT, _CAPS = 14, 15, 24  # rpc_cmd values; RPC_CONN_CAPS_SIZE


def _address(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.partition(":")
    try:
        info = socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise FlyError(f"rpc-server {endpoint}: cannot resolve {host!r}: {e.strerror}") from None
    return info[0][4][:2]


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError
        data += chunk
    return data


def _request(sock: socket.socket, cmd: int, payload: bytes, size: int) -> bytes:
    """One RPC command: | cmd (1 byte) | size (8) | payload | -> | size (8) | response |."""
    sock.sendall(bytes([cmd]) + struct.pack("<Q", len(payload)) + payload)
    return _reply(sock, size)


def _reply(sock: socket.socket, size: int) -> bytes:
    (got,) = struct.unpack("<Q", _recv(sock, 8))
    if got != size:
        raise ConnectionResetError
    return _recv(sock, size)


def handshake(endpoint: str, timeout: float = HANDSHAKE_TIMEOUT, note: Callable[[str], None] | None = None) -> int:
    """Greet the rpc-server at ``endpoint`` as llama.cpp does (HELLO, then DEVICE_COUNT) and
    return its number of devices; a FlyError naming the server when it does not answer so.

    An rpc-server serves one client at a time: one busy with another client answers when that
    client leaves. After ``timeout`` seconds without an answer this says so (``note``, default:
    a line on stderr) and keeps waiting, as llama.cpp's client does. Giving up instead would
    leave a greeting behind that the server answers later, into a closed connection: llama.cpp's
    own rpc-server dies of the SIGPIPE."""
    address = _address(endpoint)
    try:
        sock = socket.create_connection(address, timeout=timeout)
    except ConnectionRefusedError:
        raise FlyError(f"rpc-server {endpoint} is unreachable: connection refused (is rpc-server running there?)") from None
    except TimeoutError:
        raise FlyError(f"rpc-server {endpoint} is unreachable: no answer within {timeout:g} s") from None
    except OSError as e:
        raise FlyError(f"rpc-server {endpoint} is unreachable: {e.strerror or e}") from None
    with sock:
        try:
            sock.sendall(bytes([_CMD_HELLO]) + struct.pack("<Q", _CAPS) + bytes(_CAPS))
            if not select.select([sock], [], [], timeout)[0]:
                (note or _note)(f"no answer yet from rpc-server {endpoint}: it serves one client at a time, and "
                                "another one may be using it; waiting (Ctrl-C gives up)")
            sock.settimeout(None)
            major, minor, patch = _reply(sock, 4 + _CAPS)[:3]
            if major != PROTOCOL_MAJOR:
                raise FlyError(f"rpc-server {endpoint} speaks RPC protocol {major}.{minor}.{patch}, this llama.cpp "
                               f"speaks {PROTOCOL_MAJOR}.x: run an rpc-server built from the same llama.cpp")
            sock.settimeout(timeout)  # it is serving us now
            (count,) = struct.unpack("<I", _request(sock, _CMD_DEVICE_COUNT, b"", 4))
        except OSError:
            raise FlyError(f"{endpoint} did not answer the RPC handshake: not an rpc-server, or one built from "
                           "another llama.cpp version") from None
    if count == 0:
        raise FlyError(f"rpc-server {endpoint} offers no devices")
    return count


def _note(text: str) -> None:
    sys.stderr.write(f"fly-cpp: note: {text}\n")
    sys.stderr.flush()


def reachable(endpoint: str, timeout: float = 2.0) -> bool:
    """Whether anything accepts TCP connections at ``endpoint`` (a busy rpc-server does)."""
    try:
        socket.create_connection(_address(endpoint), timeout=timeout).close()
        return True
    except (OSError, FlyError):
        return False
