"""llama.cpp's RPC backend: a model's layers on ``rpc-server`` processes, reached over TCP.

Client. ``Runner.devices`` checks each server with the RPC handshake first (so an unreachable
or foreign server is one clear error, not llama.cpp's abort), adds it through ggml's backend
registry ("RPC" -> ``ggml_backend_rpc_add_server``, as llama.cpp's ``--rpc`` does) and returns
its devices. The model names them in ``llama_model_params.devices``; they are not registered
globally, so other models in the process (the draft) stay local unless given servers too.

A server that dies. ggml-rpc aborts the process when a server stops answering (``GGML_ABORT``
on the thread that talked to it: the connection's dispatcher thread, or the loading thread).
The abort callback installed here records the loss, wakes whoever waits for llama.cpp, and
parks the aborting thread for good: it cannot return (ggml calls ``abort()`` next) and cannot
unwind the C++ frames under it. So that the caller can stop waiting, every llama.cpp call of a
model on rpc servers runs on that model's own ``Runner`` thread; on a loss the caller raises
``RpcServerLost`` while the runner stays blocked inside llama.cpp. The lost model can be
neither used nor freed (freeing talks to the dead connection, and blocks), and ggml-rpc keeps
one connection per HOST:PORT for as long as buffers on it exist, so a reload in the same
process would reuse the dead one: recovery is a restart of the process. A loss is process-wide
(the callback cannot tell which connection failed), which is the same thing for one engine.

Server. ``serve`` runs ggml's RPC server on this machine's devices (``fly-cpp rpc-server``).

Every function takes ``lib``, the ctypes handle of libllama (``fly_cpp.backend.lib`` hands it over): the
ggml symbols resolve through its dependencies, i.e. in the very ggml copy llama.cpp uses.
"""

from __future__ import annotations

import ctypes
import ipaddress
import queue
import re
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from fly_cpp.backend.rpc_handshake import handshake, reachable  # noqa: F401 (reachable: for callers of this module)
from fly_cpp.basics.errors import FlyError, RpcServerLost

T = TypeVar("T")

INSTALL = ('CMAKE_ARGS="-DGGML_RPC=ON" pip install --force-reinstall --no-cache-dir --no-deps '
           "llama-cpp-python==0.3.36")
_DEV_CPU, _DEV_GPU, _DEV_IGPU = 0, 1, 2  # enum ggml_backend_dev_type

_P = ctypes.c_void_p


class _Ggml:
    """The few ggml functions used here, as fresh prototypes (llama_cpp's own stay untouched)."""

    _SIGNATURES: dict[str, tuple[Any, ...]] = {
        "ggml_backend_reg_by_name": (_P, ctypes.c_char_p),
        "ggml_backend_reg_get_proc_address": (_P, _P, ctypes.c_char_p),
        "ggml_backend_reg_dev_count": (ctypes.c_size_t, _P),
        "ggml_backend_reg_dev_get": (_P, _P, ctypes.c_size_t),
        "ggml_backend_reg_name": (ctypes.c_char_p, _P),
        "ggml_backend_dev_count": (ctypes.c_size_t,),
        "ggml_backend_dev_get": (_P, ctypes.c_size_t),
        "ggml_backend_dev_type": (ctypes.c_int, _P),
        "ggml_backend_dev_name": (ctypes.c_char_p, _P),
        "ggml_backend_dev_backend_reg": (_P, _P),
        "ggml_backend_dev_by_type": (_P, ctypes.c_int),
        "ggml_set_abort_callback": (_P, _P),
        "ggml_print_backtrace": (None,),
    }
    _cache: dict[int, _Ggml] = {}

    def __init__(self, lib: ctypes.CDLL) -> None:
        for name, (restype, *argtypes) in self._SIGNATURES.items():
            setattr(self, name.removeprefix("ggml_"), ctypes.CFUNCTYPE(restype, *argtypes)((name, lib)))

    @classmethod
    def of(cls, lib: ctypes.CDLL) -> _Ggml:
        key = id(lib)
        if key not in cls._cache:
            cls._cache[key] = cls(lib)
        return cls._cache[key]

    def rpc_function(self, name: str, prototype: Any) -> Any:
        """A function of ggml's RPC backend, or None when this build has none."""
        reg = self.backend_reg_by_name(b"RPC")
        address = reg and self.backend_reg_get_proc_address(reg, name.encode())
        return prototype(address) if address else None

    def local_devices(self) -> list[int]:
        """This machine's accelerators in llama.cpp's default order (GPUs; integrated GPUs only
        when there is no GPU), leaving out RPC devices anyone registered."""
        gpus, igpus = [], []
        for i in range(self.backend_dev_count()):
            dev = self.backend_dev_get(i)
            if self.backend_reg_name(self.backend_dev_backend_reg(dev)) == b"RPC":
                continue
            kind = self.backend_dev_type(dev)
            (gpus if kind == _DEV_GPU else igpus if kind == _DEV_IGPU else []).append(dev)
        return gpus or igpus


_ADD_SERVER = ctypes.CFUNCTYPE(_P, ctypes.c_char_p)
_START_SERVER = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                                 ctypes.POINTER(_P))
_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)


def supported(lib: ctypes.CDLL) -> bool:
    return _Ggml.of(lib).rpc_function("ggml_backend_rpc_add_server", _ADD_SERVER) is not None


def _unsupported() -> FlyError:
    return FlyError(f"this build of llama-cpp-python has no RPC support; rebuild it with: {INSTALL}")


# -- losses -------------------------------------------------------------------------------

_changed = threading.Condition()  # notified when a call finishes or a loss is recorded
_loss: str | None = None  # llama.cpp's message for the first failure of any rpc connection
_dead: dict[tuple[str, ...], list[str]] = {}  # per set of servers: those found dead after the loss
_in_use: Counter[str] = Counter()  # live runners per server: each holds ggml's connection to it
_in_use_lock = threading.Lock()
_callback: Any = None  # keeps the ctypes callback alive


def lost() -> str | None:
    """llama.cpp's message when an rpc-server connection has failed in this process, else None."""
    return _loss


def _install_abort_callback(g: _Ggml) -> None:
    global _callback
    if _callback is not None:
        return

    @_ABORT_CALLBACK
    def on_abort(message: bytes) -> None:
        global _loss
        text = message.decode("utf-8", errors="replace")
        m = re.match(r"(.*?):(\d+): (.*)", text, re.S)
        if m is None or "ggml-rpc" not in m.group(1):
            sys.stderr.write(text + "\n")  # what ggml prints without a callback; abort() follows
            sys.stderr.flush()
            g.print_backtrace()
            return
        with _changed:
            if _loss is None:
                _loss = " ".join(m.group(3).split())
            _changed.notify_all()
        threading.Event().wait()  # park this thread for good: returning would abort the process

    _callback = on_abort
    g.set_abort_callback(ctypes.cast(on_abort, _P))


def _lost_error(endpoints: tuple[str, ...]) -> RpcServerLost:
    if endpoints not in _dead:  # probed once per loss (a racing second probe gives the same answer)
        dead = [e for e in endpoints if not reachable(e)]
        if not dead:  # a dying process may still hold its listening socket for a moment
            time.sleep(0.5)
            dead = [e for e in endpoints if not reachable(e)]
        _dead[endpoints] = dead
    dead = _dead[endpoints]
    which = (f"rpc-server {', '.join(dead)}" if dead else f"one of the rpc-servers {', '.join(endpoints)}")
    return RpcServerLost(f"{which} stopped answering (llama.cpp: {_loss}); the model layers it held are lost: "
                         "restart the rpc-server, then this process")


# -- the runner ---------------------------------------------------------------------------


class _Call:
    def __init__(self, fn: Callable[..., Any], args: Sequence[Any]) -> None:
        self.fn, self.args = fn, args
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.value = self.fn(*self.args)
        except BaseException as e:  # handed to the caller
            self.error = e
        with _changed:
            self.done = True
            _changed.notify_all()


class Runner:
    """The thread that makes every llama.cpp call of one model on rpc servers (and of its
    contexts), so that the caller can give up when a server dies (see the module notes)."""

    def __init__(self, endpoints: Sequence[str]) -> None:
        self.endpoints = tuple(endpoints)
        self._held = False
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name="fly-cpp-rpc", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            call.run()

    def __call__(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the runner thread; RpcServerLost once a server connection failed."""
        self.check()
        call = _Call(fn, args)
        self._calls.put(call)
        with _changed:
            _changed.wait_for(lambda: call.done or _loss is not None)
        if not call.done:
            raise _lost_error(self.endpoints)
        if call.error is not None:
            raise call.error
        return call.value

    def check(self) -> None:
        if _loss is not None:
            raise _lost_error(self.endpoints)

    def release(self, fn: Callable[..., Any], *args: Any) -> None:
        """Free something of the model; after a loss it stays allocated (freeing would block)."""
        try:
            self(fn, *args)
        except RpcServerLost:
            pass

    def devices(self, lib: ctypes.CDLL) -> list[int]:
        """The devices of the runner's servers, in the order given (after the handshake with
        each server this process is not connected to yet)."""
        g = _Ggml.of(lib)
        add_server = g.rpc_function("ggml_backend_rpc_add_server", _ADD_SERVER)
        if add_server is None:
            raise _unsupported()
        _install_abort_callback(g)
        with _in_use_lock:
            for endpoint in self.endpoints:
                if not _in_use[endpoint]:  # a connected server is busy with us: it would not answer
                    handshake(endpoint)
            _in_use.update(self.endpoints)
            self._held = True
        devices = []
        for endpoint in self.endpoints:
            reg = self(add_server, endpoint.encode())
            if not reg:
                raise FlyError(f"rpc-server {endpoint} offers no devices")
            devices += [g.backend_reg_dev_get(reg, i) for i in range(g.backend_reg_dev_count(reg))]
        return devices

    def close(self) -> None:
        """End the thread (a thread stuck in llama.cpp after a loss stays)."""
        self._calls.put(None)
        if self._held:
            with _in_use_lock:
                _in_use.subtract(self.endpoints)
            self._held = False


class Local:
    """How a model without rpc servers calls llama.cpp: directly (the Runner's interface)."""

    endpoints: tuple[str, ...] = ()

    def __call__(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)

    release = __call__

    def check(self) -> None:
        pass

    def close(self) -> None:
        pass


LOCAL = Local()


def device_array(lib: ctypes.CDLL, remote: Sequence[int]) -> ctypes.Array[Any]:
    """The NULL-terminated device list of a model on ``remote`` devices: those first (as
    llama.cpp orders them, to keep network transfers low), then this machine's GPUs."""
    devices = [*remote, *_Ggml.of(lib).local_devices()]
    return (_P * (len(devices) + 1))(*devices, None)


def local_device_names(lib: ctypes.CDLL) -> list[str]:
    """The names of this machine's accelerators (``Ggml.local_devices``)."""
    g = _Ggml.of(lib)
    return [(g.backend_dev_name(dev) or b"?").decode("utf-8", "replace") for dev in g.local_devices()]


# -- the server ---------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback address."""
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise FlyError(f"cannot resolve {host!r}: {e.strerror}") from None
    return all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def check_port(host: str, port: int) -> None:
    """Fail with one line now when ``host:port`` cannot be listened on (ggml would only print)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as e:
        raise FlyError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    finally:
        sock.close()


def serve(lib: ctypes.CDLL, host: str, port: int, n_threads: int, cache_dir: str | None = None) -> None:
    """Run ggml's RPC server at ``host:port`` on this machine's GPUs (the CPU when there is
    none), as llama.cpp's rpc-server does. Returns only when it could not start."""
    g = _Ggml.of(lib)
    start = g.rpc_function("ggml_backend_rpc_start_server", _START_SERVER)
    if start is None:
        raise _unsupported()
    devices = g.local_devices() or [g.backend_dev_by_type(_DEV_CPU)]
    array = (_P * len(devices))(*devices)
    start(f"{host}:{port}".encode(), cache_dir.encode() if cache_dir else None, n_threads, len(devices), array)


def device_names(lib: ctypes.CDLL) -> list[str]:
    """Names of the devices ``serve`` would offer."""
    g = _Ggml.of(lib)
    devices = g.local_devices() or [g.backend_dev_by_type(_DEV_CPU)]
    return [g.backend_dev_name(d).decode() for d in devices]
