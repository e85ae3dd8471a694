"""Which localspec processes hold models now, for `localspec ps`: each writes a small record under the
state folder while it holds them and removes it when it lets go.

A process killed outright (SIGKILL, a crash) cannot remove its record: a record whose process is gone,
or whose pid now belongs to a process started at another time, is stale, and reading removes it.
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
def holding(command: str, model: str, address: str = "") -> Iterator[None]:
    """Listed by `ps` while inside: this process runs `command` with `model` (its description),
    reachable at `address` if it serves."""
    record = {"pid": os.getpid(), "command": command, "model": model, "address": address,
              "started": psutil.Process().create_time()}
    directory = folder()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{record['pid']}.json"
    path.write_text(json.dumps(record))
    try:
        yield
    finally:
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
