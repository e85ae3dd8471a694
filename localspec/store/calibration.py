"""Auto's costs, kept between runs: measuring them at every load cost seconds (issue 29), and they change
only when the model files, the machine or the settings that decide how llama.cpp computes do.

One JSON file in the state folder lists each key (what the costs depend on, see Session) with the
costs the last session on it left: measured at load, then corrected by every real step. A file that
cannot be read or was written by another version is ignored and replaced, as if it were not there;
LOCALSPEC_RECALIBRATE=1 measures anew whatever it holds.
"""

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from .. import paths, running
from ..engine.costs import Costs

NAME = "calibration.json"
VERSION = 1
KEPT = 64  # keys, the latest used: old model files and settings drop out
QUIET_CORES = 0.25  # of a core, that other processes may take from llama.cpp's threads for costs to be kept


def path() -> Path:
    return paths.state_dir() / NAME


def file_identity(model: Path) -> dict:
    """A model file as its costs know it: where it is, its size and when it was written (a hash of
    gigabytes would cost more than the calibration it saves)."""
    resolved = model.resolve()
    stat = resolved.stat()
    return {"path": str(resolved), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def costs(key: dict, measure: Callable[[], Costs]) -> Costs:
    """The costs kept for key, else (and with LOCALSPEC_RECALIBRATE=1) measure()'s. The session keeps
    them as soon as measured where the machine was quiet while they were (quiet()), and again at its
    close, corrected by its real steps, where it was quiet all along."""
    key = _plain(key)
    if os.environ.get("LOCALSPEC_RECALIBRATE", "") in ("", "0"):
        found = next((entry["costs"] for entry in _entries() if entry["key"] == key), None)
        if found is not None:
            return Costs.from_dict(found)
    return measure()


def quiet(others: running.OtherWork, threads: int, unknown: bool = True) -> bool:
    """Whether other processes left `threads` cores free since `others` began watching. Costs measured
    while they did not are that moment's, not the machine's: a calibration on a 2-core machine with a
    neighbour's tests running read verify(2) at a quarter of verify(1), which kept would have misled
    every later load. They still serve the session that measured them; real steps correct them."""
    busy = others.cores()  # (None: too short a time to tell, as for a tiny model's session: `unknown`)
    return unknown if busy is None else busy <= (os.cpu_count() or 1) - threads + QUIET_CORES


def keep(key: dict, measured: Costs) -> None:
    """Remember costs for key (replacing what was kept for it), written whole or not at all."""
    key = _plain(key)
    entries = [entry for entry in _entries() if entry["key"] != key][-(KEPT - 1):]
    entries.append({"key": key, "costs": asdict(measured)})
    target = path()
    temporary = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=NAME, suffix=".tmp")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump({"version": VERSION, "entries": entries}, out)
        os.replace(temporary, target)
    except OSError:
        pass  # a state folder we cannot write costs only the next load's calibration
    finally:
        if temporary:
            Path(temporary).unlink(missing_ok=True)


def _entries() -> list[dict]:
    """The kept entries whose costs can be read back; none from a missing, corrupt or foreign file."""
    try:
        data = json.loads(path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("entries"), list):
        return []
    return [entry for entry in data["entries"] if _readable(entry)]


def _readable(entry) -> bool:
    try:
        found = Costs.from_dict(entry["costs"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return False
    # a level of 0 would divide by zero in the policy
    return "key" in entry and found.level > 0 and bool(found.verify) and all(r > 0 for r in found.verify.values())


def _plain(key: dict) -> dict:
    """The key as JSON reads it back (tuples as lists), so a kept key compares equal to a new one."""
    return json.loads(json.dumps(key))
