"""`localspec worker`: this machine's devices lent to another machine's llama.cpp over RPC.

llama.cpp's RPC server asserts on some malformed messages (a GET_TENSOR out of its buffer's bounds ends
it with GGML_ASSERT), and its loop never returns, so it runs in a child process of its own, started
again when it ends (its client's session ends with it), while this process waits for Ctrl-C or
SIGTERM. What it cannot guard: see docs/rpc.md.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from . import net
from .config import Lending
from .engine import rpc
from .engine.devices import Device, devices
from .errors import UsageError

QUICK_END = 2.0  # seconds: a server that ends sooner than this after starting could not serve at all
QUICK_ENDS = 3  # ... so many times in a row, and the worker gives up


def lend(lending: Lending, say: Callable[[str], None]) -> None:
    rpc.require_rpc()
    lent = _devices(lending.devices)
    if lending.cache_dir:
        _cache_folder(Path(lending.cache_dir))
    net.listen(lending.host, lending.port).close()  # llama.cpp only prints that it could not listen
    if lending.exposure_warning:
        say(lending.exposure_warning)
    endpoint = f"{lending.host}:{lending.port}"
    shown = ", ".join(f"{d.name} ({d.description}, {d.free / 2**30:.1f} GiB free)" for d in lent)
    say(f"localspec worker: lending {shown} on {endpoint}, one client at a time; on the machine that runs the"
        f" model: localspec run MODEL --rpc {endpoint}. Ctrl-C stops.")
    child_args = json.dumps([endpoint, str(lending.cache_dir) if lending.cache_dir else None, lending.threads,
                             [d.name for d in lent]])
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda number, _: stopping.append(number))
    quick = 0
    server = None
    try:
        while not stopping:
            began = time.monotonic()
            server = subprocess.Popen([sys.executable, "-m", "localspec.worker", child_args])
            while server.poll() is None and not stopping:
                time.sleep(0.2)
            if stopping:
                break
            quick = quick + 1 if time.monotonic() - began < QUICK_END else 0
            if quick >= QUICK_ENDS:
                raise UsageError(f"llama.cpp could not serve on {endpoint} (its message is above)")
            say(f"localspec worker: llama.cpp's RPC server ended ({_how(server.returncode)}), its client's session"
                " with it (a message it could not take?); serving again")
    except KeyboardInterrupt:
        pass
    finally:
        if server is not None and server.poll() is None:
            server.terminate()
            server.wait()
    say("localspec worker: stopped")


def _how(code: int) -> str:
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit status {code}"


def _serve_child(arguments: str) -> None:
    """The child's part: llama.cpp's server loop, until it ends or the worker ends it (Ctrl-C is the
    worker's to handle)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_end_with, args=(os.getppid(),), daemon=True).start()
    endpoint, cache_dir, threads, names = json.loads(arguments)
    rpc.serve(endpoint, Path(cache_dir) if cache_dir else None, threads, names)


def _end_with(parent: int) -> None:
    """End this process once the worker that started it is gone (killed, it could not end it): a server
    left behind would go on lending the devices to a port nobody is said to serve on."""
    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(0)


def _devices(names: tuple[str, ...] | None) -> list[Device]:
    local = [d for d in devices() if not d.remote]
    if names is None:
        return [d for d in local if d.is_local_gpu] or [d for d in local if d.kind == "CPU"]
    known = {d.name: d for d in local}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise UsageError(f"no device named {', '.join(unknown)}; this machine has: {', '.join(known)}")
    return [known[name] for name in names]


def _cache_folder(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UsageError(f"--cache-dir {path} is a file, not a folder") from None
    except OSError as error:
        raise UsageError(f"--cache-dir {path} cannot be made a folder: {error.strerror}") from None


if __name__ == "__main__":
    _serve_child(sys.argv[1])
