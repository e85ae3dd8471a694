"""What else runs on this machine: the localspec processes that hold models now (for `localspec ps`),
and how busy other processes keep the cores.

Each process that holds models writes a small record under the state folder and removes it when it
lets go. A process killed outright (SIGKILL, a crash) cannot remove its record: a record whose process
is gone, or whose pid now belongs to a process started at another time, is stale, and reading removes it.
"""

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from . import paths


def folder() -> Path:
    return paths.state_dir() / "running"


@contextmanager
def holding(command: str, model: str, address: str = "", files: tuple[Path, ...] = (),
            certificate: Path | None = None, on_gpu: float | None = None) -> Iterator[None]:
    """Listed by `ps` while inside: this process runs `command` with `model` (its description) from
    `files` (target, then draft model), reachable at `address` if it serves (`run` and `chat` use it), over
    HTTPS with this certificate where one is given; on_gpu: the share of the target's layers on GPUs."""
    record = {"pid": os.getpid(), "command": command, "model": model, "address": address,
              **({"on_gpu": on_gpu} if on_gpu is not None else {}),
              **({"certificate": str(certificate.resolve())} if certificate else {}),
              "files": [str(path) for path in files], "started": psutil.Process().create_time()}
    path = folder() / f"{record['pid']}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record))
    except OSError:  # a state folder we cannot write costs only this process's line in `ps`
        path = None
    try:
        yield
    finally:
        if path is not None:
            path.unlink(missing_ok=True)


def processes() -> list[dict]:
    """The records of live localspec processes, oldest first, each with its `uptime` in seconds;
    stale records are removed on the way."""
    live = []
    for path in sorted(folder().glob("*.json")) if folder().is_dir() else []:
        try:
            record = json.loads(path.read_text())
            alive = _alive(record["pid"], record["started"])
        except (OSError, ValueError, KeyError, TypeError):  # half-written by a process killed while writing
            alive = False
        if not alive:
            path.unlink(missing_ok=True)
            continue
        live.append(record | {"uptime": time.time() - record["started"]})
    return sorted(live, key=lambda record: record["started"])


def _alive(pid: int, started: float) -> bool:
    try:
        # a pid is reused once its process has gone: the same pid started at another time is another process
        return abs(psutil.Process(pid).create_time() - started) < 1
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


class OtherWork:
    """The cores that other processes keep busy, measured from now until cores() is asked: the
    machine's user CPU time less this process's own. A load average would count this process's last
    minute too, and a run right after a run would look like a busy machine."""

    def __init__(self):
        self._start = self._now()

    @staticmethod
    def _now() -> tuple[float, float]:
        machine, own = psutil.cpu_times(), psutil.Process().cpu_times()
        # Processes' own work only: the kernel's (writing a just-downloaded model back to disk, reading the
        # file into the page cache) passes, where a process that keeps a core busy stays.
        return time.monotonic(), machine.user + getattr(machine, "nice", 0) - own.user

    def cores(self) -> float | None:
        """None when too little time has passed to tell (CPU times tick every 10 ms)."""
        (start, others_before), (now, others) = self._start, self._now()
        if now - start < 0.1:
            return None
        return max(0.0, (others - others_before) / (now - start))


def crowded_cores(threads: int, busy: float | None) -> str | None:
    """A warning when other processes keep busy (`busy` cores) the cores that llama.cpp's threads need.
    Its threads wait for each other at every layer, so one that must share its core holds all of them
    up: on a loaded 2-core machine 2 threads made 0.3 tok/s where -t 1 made 10-14."""
    cores = os.cpu_count() or 1
    free = max(1, round(cores - (busy or 0.0)))
    if threads <= free:
        return None
    return (f"warning: {threads} threads, but other processes keep about {busy:.1f} of this machine's {cores} cores"
            " busy: llama.cpp's threads wait for each other, so one on a busy core holds the rest up;"
            f" -t {free} may be much faster")
