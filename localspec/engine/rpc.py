"""llama.cpp's RPC backend (ggml-rpc.h, which llama-cpp-python does not wrap): other machines'
workers whose devices this process computes with (Workers), this machine's devices lent to others
(serve), and how the process ends when llama.cpp aborts or a worker stops answering."""

import ctypes
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from time import perf_counter

from ..errors import EngineError, UsageError
from .devices import by_name
from .library import ggml, library, llama

RPC_HELLO = 14  # enum rpc_cmd in ggml-rpc.cpp
RPC_PROTO_MAJOR_VERSION = 7  # ggml-rpc.h at the pinned version: a worker must speak the same
RPC_CONN_CAPS_SIZE = 24
RPC_TIMEOUT_SECONDS = 10
# llama.cpp waits on a worker for as long as its connection stays open, so a worker whose machine went
# away would hang a decode for good: a decode this long makes us look for workers that are gone.
RPC_STALL_SECONDS = 10


def supports_rpc() -> bool:
    return bool(llama.llama_supports_rpc())


def require_rpc() -> None:
    if not supports_rpc():
        raise UsageError("this llama.cpp build has no RPC backend; rebuild it with scripts/setup-venv,"
                         " which builds it with -DGGML_RPC=on")


@cache
def _rpc() -> ctypes.CDLL:
    require_rpc()
    rpc = ctypes.CDLL(str(library("ggml-rpc")))
    rpc.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
    rpc.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
    rpc.ggml_backend_rpc_start_server.restype = None
    rpc.ggml_backend_rpc_start_server.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                                                  ctypes.c_void_p]
    return rpc


def stop_process(message: str) -> None:
    """End the process for good from any thread, llama.cpp's own included."""
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    os._exit(EngineError.exit_code)


class Workers:
    """The RPC workers (--rpc HOST:PORT,...) this process computes with. Each is greeted, then its
    devices become llama.cpp devices (named RPC0, RPC1, ...; described by their endpoint), as llama.cpp's
    --rpc does: llama.cpp aborts the process on a worker it cannot reach or that speaks another protocol,
    and cannot take a worker back, so a process adds its workers once, here.

    A model whose layers may sit on them is given this object as its `watch`: while one of its decodes
    has waited RPC_STALL_SECONDS and a worker accepts no connections any more (a healthy but slow one
    still does: its port queues them), stop(message) ends the process."""

    def __init__(self, endpoints: Sequence[str], stop: Callable[[str], None] | None = None):
        self.endpoints = tuple(endpoints)
        self.decoding_since: float | None = None  # when the decode now running began, if one is
        self._stop = stop or stop_process
        if not self.endpoints:
            return
        rpc, lib = _rpc(), ggml()
        for endpoint in self.endpoints:
            greet_worker(endpoint)
            registry = rpc.ggml_backend_rpc_add_server(endpoint.encode())
            if not registry:
                raise EngineError(f"the RPC worker at {endpoint} offers no devices")
            lib.ggml_backend_register(ctypes.c_void_p(registry))
        threading.Thread(target=self._watch, name="rpc-watch", daemon=True).start()

    def __bool__(self) -> bool:
        return bool(self.endpoints)

    def gone(self, timeout: float = 1.0) -> list[str]:
        """The workers that accept no connections any more."""
        return [endpoint for endpoint in self.endpoints if not worker_listening(endpoint, timeout)]

    def _watch(self) -> None:
        while True:
            time.sleep(1)
            since = self.decoding_since
            if since is None or perf_counter() - since < RPC_STALL_SECONDS:
                continue
            if self.gone(timeout=2):
                self._stop(f"a decode has waited {RPC_STALL_SECONDS} s for the RPC workers")


def greet_worker(endpoint: str, timeout: float = RPC_TIMEOUT_SECONDS) -> None:
    """The RPC handshake (HELLO, and the protocol version back), with a time limit; UsageError naming
    the worker if it cannot be reached, does not answer, or answers in another protocol."""
    where = f"the RPC worker at {endpoint}"
    try:
        with socket.create_connection(_address(endpoint), timeout=timeout) as connection:
            connection.sendall(bytes([RPC_HELLO]) + struct.pack("<Q", RPC_CONN_CAPS_SIZE) + bytes(RPC_CONN_CAPS_SIZE))
            size = struct.unpack("<Q", _receive(connection, 8))[0]
            answer = _receive(connection, size) if size < 2**16 else b""
    except TimeoutError:
        raise UsageError(f"{where} did not answer within {timeout:g} s (a worker serves one client at a time:"
                         " is another localspec using it?)") from None
    except (OSError, ConnectionError, struct.error) as error:
        reason = getattr(error, "strerror", None) or str(error) or "the connection closed"
        raise UsageError(f"cannot reach {where}: {reason} (is `localspec worker` running there?)") from None
    if len(answer) < 3 or answer[0] != RPC_PROTO_MAJOR_VERSION:
        raise UsageError(f"{where} does not speak llama.cpp's RPC protocol v{RPC_PROTO_MAJOR_VERSION}"
                         " (another program, or a llama.cpp of another version?)")


def worker_listening(endpoint: str, timeout: float = 1.0) -> bool:
    """Whether anything still accepts connections at a worker's endpoint (a worker busy with another
    client still does: the connection waits in its queue)."""
    try:
        socket.create_connection(_address(endpoint), timeout=timeout).close()
    except OSError:
        return False
    return True


def abort_hint(endpoints: Sequence[str]) -> str:
    """What is known of why llama.cpp aborted, as a clause to follow its message: which worker is gone
    (a killed worker's port closes a moment after the abort), or the question to ask."""
    for _ in range(5 if endpoints else 0):
        gone = [endpoint for endpoint in endpoints if not worker_listening(endpoint)]
        if gone:
            return f"; the RPC worker at {', '.join(gone)} is gone"
        time.sleep(0.1)
    return "; is every --rpc worker still running?" if endpoints else ""


def _address(endpoint: str) -> tuple[str, int]:
    """HOST:PORT (or [IPv6]:PORT, as checked by Runtime) as a socket address."""
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


def _receive(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the connection closed")
        data += chunk
    return data


def serve(endpoint: str, cache_dir: Path | None, threads: int, device_names: Sequence[str]) -> None:
    """Serve these devices to other machines' llama.cpp over RPC: blocks for as long as the server
    runs (llama.cpp returns only if it cannot listen)."""
    chosen = by_name(device_names)
    array = (ctypes.c_void_p * len(chosen))(*chosen)
    _rpc().ggml_backend_rpc_start_server(endpoint.encode(), str(cache_dir).encode() if cache_dir else None,
                                         threads, len(chosen), ctypes.cast(array, ctypes.c_void_p))


_abort_callback = None  # ggml's one abort callback for the process, kept referenced while ggml may call it


def stop_on_abort(say: Callable[[str], None]) -> Callable[[str], None]:
    """When llama.cpp aborts (an assertion, or a worker that stopped answering), say so in one line
    through say(message) and exit with EngineError's code, instead of a backtrace and a core dump.
    say runs on whichever thread llama.cpp aborted in; the process ends right after it. Returns that
    way of stopping, for Workers to stop the same way."""
    global _abort_callback

    def stop(message: str) -> None:
        try:
            say(message)
        finally:
            os._exit(EngineError.exit_code)

    def on_abort(message: bytes) -> None:
        text = message.decode("utf-8", errors="replace").strip()
        place, _, what = text.partition(": ")
        stop(f"{what.strip()} ({Path(place).name})" if what else text)

    _abort_callback = ctypes.CFUNCTYPE(None, ctypes.c_char_p)(on_abort)
    lib = ggml()
    lib.ggml_set_abort_callback.restype = ctypes.c_void_p
    lib.ggml_set_abort_callback.argtypes = [ctypes.c_void_p]
    lib.ggml_set_abort_callback(ctypes.cast(_abort_callback, ctypes.c_void_p))
    return stop
