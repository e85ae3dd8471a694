"""`localspec worker`: this machine's devices lent to another machine's llama.cpp over RPC.

llama.cpp's server loop never returns and has no way to be stopped, so it runs on a thread of its
own while the main thread waits for Ctrl-C or SIGTERM, and then the process simply ends.
"""

import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from . import net
from .config import Lending
from .engine import rpc
from .engine.devices import Device, devices
from .errors import UsageError


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
    server = threading.Thread(target=rpc.serve, name="rpc-server", daemon=True,
                              args=(endpoint, lending.cache_dir, lending.threads, [d.name for d in lent]))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server.start()
    try:
        while server.is_alive() and not stop.wait(0.2):
            pass
    except KeyboardInterrupt:
        pass
    if not server.is_alive():
        raise UsageError(f"llama.cpp could not serve on {endpoint} (its message is above)")
    say("localspec worker: stopped")
    sys.stdout.flush()
    # llama.cpp's server thread cannot be stopped or joined: end the process without waiting for it.
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
