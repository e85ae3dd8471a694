"""The models `serve` answers with: the one it started with, and any other downloaded model a request
names, loaded when first asked and unloaded once idle for its keep-alive, or sooner, least recently
used first, when a model to load needs their memory.

Each loaded model is a Session with a Service of its own (a worker thread: llama.cpp's contexts are not
shared between threads), all counted in one Metrics. The pool is read and changed on the server's
event loop only; loading and unloading run on a thread of their own meanwhile.
"""

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import store
from .config import Adapter, DrafterKind, Rope, Runtime, Speculation
from .engine.drafters.spec import COSTLY_KINDS
from .errors import InputError, LocalspecError, UnknownModel, UsageError
from .store import GGUFInfo
from .service import Metrics, Service
from .loading import sized
from .session import Session, open_session


class NotKnown(UnknownModel):
    """A request names a model that is neither a registry name nor a file: OpenAI's clients, which send a
    fixed name, are answered by the model serve started with, as llama-server answers. The models that are
    served are listed only when the message is shown (those clients' every request raises it)."""

    def __init__(self, name: str, served: Callable[[], list[store.Local]]):
        super().__init__(name)
        self.name, self._served = name, served

    def __str__(self) -> str:
        names = ", ".join(available.name for available in self._served())
        return (f"the model {self.name!r} is not served here: it is not in the registry (or not downloaded);"
                f" these are: {names}")


class NoRoom(LocalspecError):
    """The model asked for does not fit beside those that are busy."""


@dataclass(eq=False)
class Served:
    name: str  # as the API names it
    session: Session
    service: Service
    keep_alive: float  # seconds it stays loaded once idle (math.inf: while serve runs)
    pinned: bool = False  # the model serve started with: never unloaded
    last_used: float = field(default_factory=time.monotonic)

    @property
    def idle(self) -> bool:
        return self.service.pending == 0

    @property
    def idle_since(self) -> float:
        """Since when (time.monotonic()) nothing has asked for it: keep-alive counts from the end of the
        last request, as Ollama's does, so a long generation does not expire as it finishes."""
        return max(self.last_used, self.service.last_finished)

    @property
    def expires_at(self) -> float | None:
        """When it will be unloaded if nothing asks for it (time.time()); None: not while serve runs."""
        if self.pinned or self.keep_alive == math.inf:
            return None
        return time.time() + max(0.0, self.keep_alive - (time.monotonic() - self.idle_since))

    def expired(self, now: float) -> bool:
        return not self.pinned and self.idle and now - self.idle_since >= self.keep_alive


class Pool:
    def __init__(self, first: Session, name: str, runtime: Runtime, speculation: Speculation, queue: int,
                 keep_alive: float, log: Callable[[str], None]):
        """first, name: the model serve started with, as the API names it. runtime, speculation: how
        others are loaded (each with its registry draft where that is downloaded too, unless serve was
        started without drafting). keep_alive: --keep-alive, in seconds (math.inf: while serve runs)."""
        self.runtime, self.speculation, self.queue, self.keep_alive, self.log = (
            runtime, speculation, queue, keep_alive, log)
        self.metrics = Metrics()
        self.first = Served(name, first, Service(first, queue, log, self.metrics), math.inf, pinned=True)
        self.loaded: dict[store.Key, Served] = {_key(first): self.first}
        self._loading: dict[store.Key, asyncio.Future] = {}
        # serve's --lora (and --mmproj) adapt the model it serves, whatever name a request gives its file; a model
        # made with an ADAPTER (or a projector) that serve started with is that model, its base another
        made = store.made(name)
        self._adapted_by_serve = (len(first.adapters) > 0 or first.vision is not None) and not (
            made and (made.adapters or made.projector))
        # One load at a time: the memory check of one sees the models loaded before it (three first requests
        # for different models at once all passed it together, 3 x 6 GiB on 10 GiB).
        self._load_lock = asyncio.Lock()
        self._headers: dict[Path, GGUFInfo] = {}

    def available(self) -> list[store.Local]:
        """What can be served: the first model, then every downloaded registry model (and Hub file), then
        the models made with `create` from any of these or from a file."""
        out = [self._served_first()]
        for entry in (*store.known().values(), *store.hub_downloads()):
            if entry.drafts:  # a drafter published beside a model drafts for it, never answers alone
                continue
            path = store.installed(entry)
            if path is not None and self._readable(path):
                found = store.Local(entry.command_name, path.resolve(), entry)
                if not self._is_first(found, out[0]):  # (its name answers with serve's own adapters: listed once)
                    out.append(found)
        for made in store.every_made():
            if made.name == out[0].name:  # (serve's first model is one made or another app's: listed once)
                continue
            try:
                out.append(replace(self.find(made.name), name=made.name))
            except (NotKnown, UnknownModel):  # (what it is made from is not here)
                continue
        return out

    def _served_first(self) -> store.Local:
        session = self.first.session
        return store.Local(self.first.name, session.target_info.path.resolve(), None,
                           tuple(str(path) for path in session.adapters.paths),
                           str(session.vision.path) if session.vision else None)

    def _unless_first(self, wanted: store.Local) -> store.Local:
        """The model wanted, or the first one where that is the same file with the same adapters (or with serve's
        own, where the name asks for none)."""
        first = self._served_first()
        return first if self._is_first(wanted, first) else wanted

    def _is_first(self, wanted: store.Local, first: store.Local) -> bool:
        return wanted.key == first.key or (self._adapted_by_serve and not wanted.adapters and not wanted.projector
                                           and wanted.path == first.path)

    def loading(self, wanted: store.Local) -> bool:
        """Whether the model is being loaded now."""
        return wanted.key in self._loading

    def header(self, path: Path) -> GGUFInfo:
        if path not in self._headers:
            self._headers[path] = store.header(path)
        return self._headers[path]

    def _readable(self, path: Path) -> bool:
        """Whether a file's header reads: another app's partial or broken download is listed nowhere (every list of
        models failed on one), as Ollama leaves out a pull under way; a request naming it hears what is wrong."""
        try:
            self.header(path.resolve())
        except InputError:
            return False
        return True

    def find(self, name: str | None) -> store.Local:
        """The model a request names: the first one where it names none; UnknownModel else."""
        if not name or name == self.first.name:  # (every request that names no model: no walk of the registry)
            return self._served_first()
        found = store.local(name)
        if found is None:
            raise NotKnown(name, self.available)
        return self._unless_first(found)

    async def get(self, name: str | None, keep_alive: float | None = None) -> Served:
        """The loaded model a request names, loaded first where it is not (on a thread; requests for the
        same model wait for the one load). keep_alive: the request's own (Ollama's), in seconds; None: as it is."""
        wanted = self.find(name)
        served = self.loaded.get(wanted.key)
        if served is None:
            loading = self._loading.get(wanted.key)
            if loading is None:
                loading = self._loading[wanted.key] = asyncio.ensure_future(self._load(wanted))
            try:
                served = await asyncio.shield(loading)
            finally:
                if loading.done():
                    self._loading.pop(wanted.key, None)
        served.last_used = time.monotonic()
        if keep_alive is not None and not served.pinned:
            served.keep_alive = keep_alive
        return served

    async def _load(self, wanted: store.Local) -> Served:
        asked = time.monotonic()
        async with self._load_lock:
            return await self._load_alone(wanted, asked)

    async def _load_alone(self, wanted: store.Local, asked: float) -> Served:
        await self._make_room(self.header(wanted.path), asked)
        drafting = self.speculation.drafting
        draft = self._draft_for(wanted.entry) if drafting != DrafterKind.PLAIN else None
        if drafting in COSTLY_KINDS and draft is None:
            drafting = DrafterKind.NGRAM  # what serve's --spec fixed does without a draft model
        speculation = replace(self.speculation, drafting=drafting)
        self.log(f"loading {wanted.name} ({wanted.path.name}{f', drafted by {draft.name}' if draft else ''})")
        started = time.perf_counter()
        # (RoPE's scaling, the LoRA adapters, control vectors and projector are the first model's: another's file says
        # its own RoPE, a model made with an ADAPTER its own adapters, and a control vector or projector is made for
        # one model)
        runtime = replace(self.runtime, rope=Rope(), lora=tuple(Adapter(path) for path in wanted.adapters),
                          control_vectors=(), mmproj=wanted.projector)
        session = await asyncio.to_thread(open_session, str(wanted.path), str(draft) if draft else None, runtime,
                                          speculation, True)
        await asyncio.to_thread(session.warm)
        served = Served(wanted.name, session, Service(session, self.queue, self.log, self.metrics), self.keep_alive)
        self.loaded[wanted.key] = served
        self.log(f"loaded {wanted.name} in {time.perf_counter() - started:.1f} s"
                 + "".join(f"; {note}" for note in session.notes))
        return served

    @staticmethod
    def _draft_for(entry: store.ModelEntry | None) -> Path | None:
        """The registry's draft for the model, where that is downloaded too."""
        if entry is None or not entry.draft:
            return None
        try:
            draft = store.find(entry.draft)
        except UsageError:
            return None
        return store.installed(draft) if isinstance(draft, store.ModelEntry) else None

    async def _make_room(self, info: GGUFInfo, asked: float) -> None:
        """Unload idle models, least recently used first, while the one to load would not fit beside
        them; NoRoom where it cannot fit even so. A model loaded or handed out since this load was asked
        for (`asked`) is not idle but about to be used: a request that raced this one has it, and has not
        queued its work yet."""
        sequences = max(1, self.runtime.parallel)
        needed = store.estimate_bytes(info, sized(self.runtime, info).ctx_size * sequences, sequences,
                                      self.runtime.kv_bytes)
        while needed > store.machine().memory_free:
            idle = sorted((s for s in self.loaded.values() if not s.pinned and s.idle and s.last_used < asked),
                          key=lambda s: s.idle_since)
            if not idle:
                raise NoRoom(f"{info.path.name} needs about {needed / 2**30:.1f} GiB and only"
                             f" {store.machine().memory_free / 2**30:.1f} GiB are free beside the models in use;"
                             " try again once they are idle, or serve a smaller model")
            await self.unload(idle[0], "to make room")

    def holds(self, path: Path) -> bool:
        """Whether a model loaded here, or loading, reads this file."""
        return any(path in (key[0], key[2]) for key in [*self.loaded, *self._loading])

    async def unload_when_idle(self, name: str | None) -> bool:
        """Unload the model a request names, where it is loaded and not the first (Ollama's keep_alive 0): now
        if it is idle, else as soon as its requests end (its keep-alive 0: the reaper's), as Ollama expires a
        busy runner. False where it stays: the model serve started with."""
        served = self.loaded.get(self.find(name).key)
        if served is None:
            return True
        if served.pinned:
            self.log(f"kept {served.name} loaded: asked to unload it, but serve started with it")
            return False
        if served.idle:
            await self.unload(served, "asked to")
        else:
            served.keep_alive = 0.0
        return True

    async def unload(self, served: Served, why: str) -> None:
        self.loaded.pop(_key(served.session), None)
        await asyncio.to_thread(_close, served)
        self.log(f"unloaded {served.name} ({why})")

    async def reap(self) -> None:
        """Unload the models idle for longer than their keep-alive."""
        now = time.monotonic()
        for served in [s for s in self.loaded.values() if s.expired(now)]:
            await self.unload(served, "idle beyond its keep-alive")

    @property
    def pending(self) -> int:
        return sum(served.service.pending for served in self.loaded.values())

    def remembered(self) -> tuple[int, int] | None:
        kept = [r for r in (s.session.remembered for s in self.loaded.values()) if r is not None]
        return (sum(tokens for tokens, _ in kept), sum(size for _, size in kept)) if kept else None

    def cancel_all(self) -> None:
        for served in list(self.loaded.values()):
            served.service.cancel_all()

    def close(self) -> None:
        """Stop every service and close the models loaded on demand (the first one is its opener's)."""
        for served in list(self.loaded.values()):
            served.service.close()
            if not served.pinned:
                served.session.close()
        self.loaded.clear()


def _key(session: Session) -> store.Key:
    return store.key_of(session.target_info.path, session.adapters.paths, session.vision and session.vision.path)


def _close(served: Served) -> None:
    served.service.close()
    served.session.close()
