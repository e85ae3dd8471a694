"""Model files' headers kept between runs. A header is read whole to be trusted (its tensor table says whether the
download is complete), and a vocabulary of 150,000 tokens and their merges takes 25-40 ms to walk: `ls` over an
Ollama store of twenty models spent most of its time there, every time. A file's header is read once while the
file stays the same (its path, inode, size and modification time) and the reader stays the same (its source's digest)."""

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
from pathlib import Path

from . import gguf_meta
from .gguf_meta import GGUFInfo, RawArray
from .. import paths

MOST_KEPT = 512  # headers kept; past it the oldest half goes (a big model's is ~50 KB)


def read(path: Path) -> GGUFInfo:
    """A file's header (gguf_meta.read), from what was kept of it where the file has not changed since."""
    path = Path(path)
    try:
        stat = path.stat()
        where = paths.headers_dir() / f"{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:24]}.json"
    except (OSError, RuntimeError, ValueError):  # (no file, a link's loop, a NUL in the name: as the reader says it)
        return gguf_meta.read(path)
    stamp = [_reader(), stat.st_size, stat.st_mtime_ns, stat.st_ino]
    try:
        kept = json.loads(where.read_bytes())
        if kept["stamp"] == stamp:
            return _info(kept["info"], path)
    except (OSError, ValueError, KeyError, TypeError):  # (none kept, or not as this reader keeps it)
        pass
    info = gguf_meta.read(path)
    _keep(where, {"stamp": stamp, "info": _fields(info)})
    return info


@functools.cache
def _reader() -> str:
    """The header reader's own source's digest: a reader that reads more, or differently, reads every file anew."""
    return hashlib.sha256(Path(gguf_meta.__file__).read_bytes()).hexdigest()[:16]


def _fields(info: GGUFInfo) -> dict:
    """The header as JSON. A metadata value is a number, a string or an array left undecoded: only an array is kept
    as an object ({"array": its RawArray's fields}), and the keys keep the file's order (`show --verbose`'s)."""
    metadata = [[key, {"array": dataclasses.astuple(value)} if isinstance(value, RawArray) else value]
                for key, value in info.metadata.items()]
    return {field.name: getattr(info, field.name) for field in dataclasses.fields(GGUFInfo)
            if field.name != "path"} | {"metadata": metadata}


def _info(fields: dict, path: Path) -> GGUFInfo:
    metadata = {}
    for key, value in fields["metadata"]:
        if isinstance(value, dict):
            item_type, count, start, end, values = value["array"]
            value = RawArray(item_type, count, start, end, None if values is None else tuple(values))
        metadata[key] = value
    return GGUFInfo(path=path, **(fields | {"metadata": metadata}))


def _keep(where: Path, kept: dict) -> None:
    """Kept for the next read, or not where the cache cannot be written (a read-only home, a full disk): it only
    saves time."""
    partial = where.with_name(f"{where.stem}.{os.getpid()}.partial")
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps(kept))
        os.replace(partial, where)  # (another process reading it sees the old whole or the new whole)
        entries = sorted(where.parent.glob("*.json"), key=_age)
        for old in entries[: len(entries) - MOST_KEPT // 2] if len(entries) > MOST_KEPT else ():
            old.unlink(missing_ok=True)
    except OSError:
        with contextlib.suppress(OSError):  # (a disk that filled while it was written: no half a file left behind)
            partial.unlink(missing_ok=True)


def _age(entry: Path) -> int:
    try:
        return entry.stat().st_mtime_ns
    except OSError:
        return 0
