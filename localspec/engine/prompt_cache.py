"""Prompts kept on disk between runs: a sequence's cache after a prompt that took long to read, written to a file
of llama.cpp's own sequence-state format (the one llama-cli's --prompt-cache and llama-server's slot save write:
the tokens, then the state), and read back for a later prompt that begins with the same tokens, in this process
or the next, instead of decoding them again.

One folder a model file (its path, size and time: a file replaced is another model), and in it one a client of
a server with API keys, under one cap for all of them, the least recently used file going first. A file names the
hash of its tokens and how long each of them took to read, so that one is read back only where that saves more
time than reading the file costs.

A file is written on a thread of its own: the state is copied out of the context where the prompt was read (the
context is that thread's alone), the disk is left to the writer, so that the first token does not wait on it (a
long prompt's state on a GPU is gigabytes, seconds to write, as long as reading the prompt took there). The
process waits for the writer at its exit."""

import atexit
import hashlib
import os
import queue
import re
import struct
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import paths
from ..config import PROMPT_CACHE_LEAST_SECONDS

SEQ_MAGIC, SEQ_VERSION = 0x67677371, 3  # 'ggsq': llama.h's LLAMA_STATE_SEQ_MAGIC and _VERSION
# what llama_state_seq_get_data writes before the state that a file holds: a magic number of its own and the
# sequence's id (which set_data reads past)
STATE_HEAD = struct.Struct("<Ii")
STATE_MAGIC = 0xAF143CD8
NAME = re.compile(r"p-([0-9a-f]{16})-(\d+)\.bin")  # the tokens' hash, microseconds a token took to read
READ_BYTES_PER_SECOND = 1e9  # a file from the page cache or an SSD: what reading one back is reckoned to cost
LEAST_TOKENS = 16  # fewer tokens read than this are neither looked for nor kept here
STALE_SECONDS = 3600  # a partial file older than this was left by a process that ended while writing it
# states copied out and not yet written, at most: a state is a prompt's whole cache, held in memory until written,
# so one more is not kept while this many wait
MOST_WAITING = 2



class _Writer:
    """The one writer of every prompt cache of the process: a thread taking its jobs in order. The process waits
    at exit for the states copied out (_finish); a Ctrl-C meanwhile gives up on them, as on any other wait, where
    a pool's threads, joined at exit, ended in a traceback (a file half written stays a .partial, which a later
    eviction deletes)."""

    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._starting = threading.Lock()

    def submit(self, work: Callable, *args) -> Future:
        job = Future()
        self._jobs.put((job, work, args))
        with self._starting:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="prompt-cache", daemon=True)
                self._thread.start()
        return job

    def _run(self) -> None:
        while True:
            job, work, args = self._jobs.get()
            if job.set_running_or_notify_cancel():
                try:
                    job.set_result(work(*args))
                except BaseException as error:  # (settled() raises it where a test or a caller waits)
                    job.set_exception(error)


_writer = _Writer()
_waiting: list[Future] = []  # its jobs not yet collected by settled() (done ones that went well are let go)
_queue = threading.Lock()


@atexit.register
def _finish() -> None:
    try:
        wait(list(_waiting))
    except KeyboardInterrupt:
        pass


@dataclass(frozen=True)
class Entry:
    path: Path
    tokens: np.ndarray
    seconds_per_token: float
    size: int


def _hash(tokens: Sequence[int]) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).hexdigest()[:16]


def _read_tokens(file) -> np.ndarray | None:
    """The tokens a sequence-state file holds (its header), or None where it is not one."""
    head = file.read(12)
    if len(head) < 12:
        return None
    magic, version, n = struct.unpack("<III", head)
    tokens = np.fromfile(file, dtype="<i4", count=n)
    return tokens if magic == SEQ_MAGIC and version == SEQ_VERSION and len(tokens) == n else None


def tokens_of(path: Path) -> np.ndarray | None:
    try:
        with open(path, "rb") as file:
            return _read_tokens(file)
    except OSError:
        return None


def write(path: Path, tokens: Sequence[int], state) -> None:
    """A file of llama.cpp's sequence-state format (llama_state_seq_save_file's) from a state as
    llama_state_seq_get_data hands it out, only ever there whole (written beside it, then renamed)."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        with open(partial, "wb") as file:
            file.write(struct.pack("<III", SEQ_MAGIC, SEQ_VERSION, len(tokens)))
            file.write(np.asarray(tokens, dtype="<i4").tobytes())
            file.write(memoryview(state)[STATE_HEAD.size :])
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def settled() -> None:
    """Wait until every state copied out so far is written (raising what failed in the writer, other than the
    disk's trouble, which it keeps to itself)."""
    while True:
        with _queue:
            if not _waiting:
                return
            job = _waiting.pop(0)
        job.result()


def read(path: Path) -> tuple[list[int], bytearray] | None:
    """Such a file's tokens, and its state as llama_state_seq_set_data reads it; None where it is not one."""
    try:
        with open(path, "rb") as file:
            tokens = _read_tokens(file)
            if tokens is None:
                return None
            saved = bytearray(STATE_HEAD.size + os.fstat(file.fileno()).st_size - file.tell())
            STATE_HEAD.pack_into(saved, 0, STATE_MAGIC, 0)
            file.readinto(memoryview(saved)[STATE_HEAD.size :])
    except OSError:
        return None
    return tokens.tolist(), saved


class PromptCache:
    """The prompts of one model file (folder), under root's cap of most_bytes for every model's.

    A context holding one (Context.prompt_cache) looks here before it reads a prompt (recall) and writes what it
    holds after reading one for longer than least_seconds (keep). Trouble on disk (full, not writable, a file
    not of this model after all) only means reading the prompt as without it."""

    def __init__(self, root: Path, model: Path, most_bytes: int, least_seconds: float = PROMPT_CACHE_LEAST_SECONDS,
                 folder: Path | None = None):
        self.root, self.folder = root, folder or paths.prompts_of(model, root)
        self.model, self.most_bytes, self.least_seconds = model, most_bytes, least_seconds
        self._entries: dict[Path, tuple[int, Entry | None]] = {}  # by path: (mtime_ns, its entry) as last listed
        self._failed: set[Path] = set()  # files llama.cpp would not read into this model's context
        self._clients: dict[str, PromptCache] = {}
        self._variants: dict[str, PromptCache] = {}
        self._base = self._origin = self
        self._client: str | None = None

    def of(self, client: str | None) -> "PromptCache":
        """The model's prompts of one client of a server (its API key), kept apart from every other client's, so
        that what is read back tells no client what another's prompts were; None: those of no client's."""
        base = self._base
        if client is None:
            return base
        if client not in base._clients:
            made = PromptCache(base.root, base.model, base.most_bytes, base.least_seconds,
                               base.folder / f"client-{hashlib.sha256(client.encode()).hexdigest()[:16]}")
            made._base, made._origin, made._client = base, base._origin, client
            base._clients[client] = made
        return base._clients[client]

    def beside(self, variant: str) -> "PromptCache":
        """The model's prompts as read under other settings that change what a cache holds (LoRA adapters'
        scales: Adapters.variant), kept in a folder of their own inside the one this was made for ("": its own),
        of the same client's."""
        origin = self._origin
        if variant and variant not in origin._variants:
            made = PromptCache(origin.root, origin.model, origin.most_bytes, origin.least_seconds,
                               origin.folder / variant)
            made._origin = origin
            origin._variants[variant] = made
        return (origin._variants[variant] if variant else origin).of(self._client)

    def entries(self) -> list[Entry]:
        """The files in the model's folder, their headers read once each.

        The writer's thread lists them too, and deletes some (a prefix made needless, the least recently used): no
        lock is shared with it. Each listing is built apart and then put in place whole, so two at once each see a
        listing as it stood; a file deleted after it was listed fails to be read back, which reads the prompt as
        without it. (A listing lock was once shared here, and a test run hung waiting on it, held by no live thread.)
        """
        try:
            named = [Path(item.path) for item in os.scandir(self.folder) if NAME.fullmatch(item.name)]
        except OSError:
            return []
        known, entries = self._entries, {}
        for path in named:
            try:
                stat = path.stat()
            except OSError:  # (deleted since it was listed)
                continue
            mtime, entry = known.get(path, (None, None))
            if mtime != stat.st_mtime_ns:
                tokens = tokens_of(path)
                entry = None if tokens is None else Entry(path, tokens, int(NAME.fullmatch(path.name)[2]) / 1e6,
                                                          stat.st_size)
            entries[path] = (stat.st_mtime_ns, entry)
        self._entries = entries
        return [entry for path, (_, entry) in entries.items() if entry is not None and path not in self._failed]

    def best(self, wanted: Sequence[int], held: int, most: int, whole: bool) -> tuple[Entry, int] | None:
        """The file worth reading back for a cache that holds the first `held` of `wanted` and is to hold up to
        `most` of them, and how many of them it holds; whole: only a file all of whose tokens are wanted (a
        recurrent state cannot be taken back)."""
        if most - held < LEAST_TOKENS:
            return None
        want = np.asarray(wanted[:most], dtype=np.int32)
        best = None
        for entry in self.entries():
            n = min(len(entry.tokens), len(want))
            differing = np.flatnonzero(entry.tokens[:n] != want[:n])
            common = int(differing[0]) if len(differing) else n
            if whole and common < len(entry.tokens):
                continue
            saved = (common - held) * entry.seconds_per_token
            if saved < max(self.least_seconds / 2, entry.size / READ_BYTES_PER_SECOND):
                continue
            if best is None or (common, -entry.size) > (best[1], -best[0].size):
                best = (entry, common)
        return best

    def recall(self, context, wanted: Sequence[int], held: int, most: int) -> int:
        """Read back the file that saves the context most reading of `wanted`, if one does; how many of
        `wanted` it holds then (a file llama.cpp refused leaves it holding none)."""
        found = self.best(wanted, held, most, context.recurrent)
        if found is None:
            return held
        entry, _ = found
        saved = read(entry.path)
        if saved is None or not context.set_state(saved[1], saved[0]):
            self._failed.add(entry.path)
            return context.shares(wanted, 0, most)
        try:
            os.utime(entry.path)  # (the least recently used go first)
        except OSError:
            pass
        return context.shares(wanted, 0, most)

    def keep(self, context, read: int, seconds: float) -> None:
        """Have what the context holds written, after it read `read` tokens of it in `seconds`, where that was long
        (and fewer than MOST_WAITING states wait for the writer); then files it makes needless dropped (a prefix of
        its tokens, where the cache can be taken back) and the least recently used over the cap."""
        if read < LEAST_TOKENS or seconds < self.least_seconds:
            return
        with _queue:
            _waiting[:] = [job for job in _waiting if not job.done() or job.exception() is not None]
            if sum(not job.done() for job in _waiting) >= MOST_WAITING:
                return
        tokens = list(context.tokens)
        state = context.state()
        if state is None:
            return
        job = _writer.submit(self._store, tokens, state, max(1, round(seconds / read * 1e6)), not context.recurrent)
        with _queue:
            _waiting.append(job)

    def _store(self, tokens: list[int], state, us_per_token: int, prefixes_needless: bool) -> None:
        """The writer's part of keep()."""
        path = self.folder / f"p-{_hash(tokens)}-{us_per_token}.bin"
        try:
            if not self.folder.is_dir():
                self.folder.mkdir(parents=True)
                (self.folder / "model.txt").write_text(f"{self.model}\n")  # (for whoever looks in)
            write(path, tokens, state)
            del state
            if prefixes_needless:
                held = np.asarray(tokens, dtype=np.int32)
                for entry in self.entries():
                    if entry.path != path and len(entry.tokens) <= len(held) and (
                            entry.tokens == held[: len(entry.tokens)]).all():
                        entry.path.unlink(missing_ok=True)
            self.evict()
        except OSError:
            pass  # (no worse than no prompt cache)

    def evict(self) -> None:
        """Delete the least recently used files of every model's until they fit the cap, and partial files left
        by a process that ended while writing."""
        files, now = [], time.time()
        for path in self.root.rglob("p-*"):
            try:
                stat = path.stat()
            except OSError:
                continue
            if NAME.fullmatch(path.name):
                files.append((stat.st_mtime, stat.st_size, path))
            elif path.name.endswith(".partial") and now - stat.st_mtime > STALE_SECONDS:
                path.unlink(missing_ok=True)
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.most_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size
