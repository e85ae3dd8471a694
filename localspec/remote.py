"""A running `localspec serve` used as a session: `run` and `chat` hand it their Request and show its
events (serve's own stream, protocols/native.py) with the same live view and statistics as a
generation of their own, without loading the model again. Found through `ps`'s records (a serve that
holds the same files) or named by --host."""

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from . import net, running
from .config import DrafterKind, Limits, Sampling, Thinking
from .errors import EngineError, InputError, LocalspecError, UsageError
from .events import Event, from_wire

if TYPE_CHECKING:
    from .request import Request
    from .session import Conversation, Info

# The serve's protocol, the request's wire form, the session's Conversation and the store are imported where a
# generation or a name needs them: `ps`, `stop` and `load` only ask serves what they hold.

OLLAMA_PS, OLLAMA_GENERATE = "/api/ps", "/api/generate"  # Ollama's routes, which serve answers too
# to reach the serve, and then between two events: a queue or a long prompt's prefill may take minutes
SILENCE_SECONDS = 600.0
LISTING_SECONDS = 5.0  # for what a serve holds: `ps` waits no longer for a serve that does not answer


class Remote:
    """A serve at url (api_key: one of its --api-key), generating for the model it started with: what `run`
    and `chat` ask of a Session (generate, chat, info, and the drafting chat's /draft steers, which here
    rides on each request rather than changing the serve)."""

    def __init__(self, url: str, api_key: str | None = None, certificate: str | None = None):
        """certificate: the one alone to trust (a serve on this machine over HTTPS, by its record)."""
        # (ps records a serve by its OpenAI base URL, http://HOST:PORT/v1)
        self.url, self.api_key = url.rstrip("/").removesuffix("/v1"), api_key
        self.mode: DrafterKind | None = None  # None: the serve's own
        self.draft_max: int | None = None
        self.load_seconds = None  # nothing loads here (a Session's: its models' load)
        try:
            self._tls = net.trusting(certificate) if certificate else None
        except (OSError, ssl.SSLError) as error:
            raise EngineError(f"localspec serve at {self.url}: its certificate {certificate} cannot be read"
                              f" ({getattr(error, 'strerror', None) or error}; --local runs the model here)") from None

    @classmethod
    def of(cls, record: dict) -> "Remote":
        """The serve a record of `ps` names."""
        return cls(record["address"], certificate=record.get("certificate"))

    def describe(self) -> str:
        return f"{self._info['describe']} (localspec serve at {self.url})"

    @cached_property
    def _info(self) -> dict:
        from .protocols.native import INFO_PATH

        return json.loads(b"".join(self._asked(INFO_PATH)))

    @property
    def info(self) -> "Info":
        from .session import Info

        return Info(**{name: self._info[name] for name in Info.__dataclass_fields__})

    @property
    def thinks(self) -> bool:
        return self._info["thinks"]

    @property
    def default_mode(self) -> DrafterKind:
        return DrafterKind(self._info["default_mode"])

    @property
    def can_speculate(self) -> bool:
        return self.default_mode != DrafterKind.PLAIN

    def use(self, mode: DrafterKind) -> None:
        self.mode = None if mode == self.default_mode else DrafterKind(mode)

    def set_draft_max(self, draft_max: int | None) -> None:
        if draft_max is not None and draft_max > self._info["most_draft"]:
            raise UsageError(f"draft length {draft_max} exceeds this session's batch of {self._info['most_draft']}")
        self.draft_max = draft_max

    @property
    def draft_limit(self) -> int:
        return self._info["draft_limit"] if self.draft_max is None else self.draft_max

    def chat(self, system: str | None = None, sampling: Sampling | None = None, limits: Limits | None = None,
             thinking: Thinking = Thinking(), opening: Sequence[dict] = (), template_variables: dict | None = None
             ) -> "Conversation":
        from .session import Conversation

        return Conversation(self, system, sampling or Sampling(), limits or Limits(), thinking, opening,
                            template_variables)

    def count_tokens(self, request: "Request") -> int:
        from .protocols.native import TOKENS_PATH
        from .request import to_wire

        return json.loads(b"".join(self._asked(TOKENS_PATH, to_wire(request))))["tokens"]

    def generate(self, request: "Request") -> Iterator[Event]:
        """The events of one generation on the serve; closing the iterator (Ctrl-C) closes the connection,
        which stops the generation there."""
        from .protocols.native import PATH
        from .request import to_wire

        request = replace(request, drafting=request.drafting or self.mode,
                          draft_max=self.draft_max if request.draft_max is None else request.draft_max)
        for line in self._asked(PATH, to_wire(request)):
            data = json.loads(line)
            if "error" in data:
                raise _refusal(data.get("status", 500), line)
            yield from_wire(data)

    def loaded(self, timeout: float = LISTING_SECONDS) -> list[dict]:
        """The models the serve holds now, the one it started with first: each one's `name`, when it will be
        unloaded unless asked for (`expires_at`, as Ollama's /api/ps says it) and the share of its layers on
        GPUs (`on_gpu`, of Ollama's size_vram)."""
        return [{"name": model["name"], "expires_at": model["expires_at"],
                 "on_gpu": model.get("size_vram", 0) / model["size"] if model.get("size") else 0.0}
                for model in json.loads(b"".join(self._asked(OLLAMA_PS, timeout=timeout)))["models"]]

    def load(self, name: str, keep_alive: float | None) -> None:
        """Ask the serve to load a model, as a request naming it would (Ollama's empty prompt), for keep_alive
        seconds once idle (None: the serve's --keep-alive; -1: while it runs)."""
        b"".join(self._asked(OLLAMA_GENERATE, {"model": name, "stream": False}
                             | ({} if keep_alive is None else {"keep_alive": keep_alive})))

    def unload(self, name: str) -> None:
        """Ask the serve to unload a model it loaded on demand, if it is idle (Ollama's keep_alive 0)."""
        b"".join(self._asked(OLLAMA_GENERATE, {"model": name, "keep_alive": 0, "stream": False}))

    def _asked(self, path: str, body: dict | None = None, timeout: float = SILENCE_SECONDS) -> Iterator[bytes]:
        """The lines of the serve's answer to a GET (body None) or a POST of body; its refusal as the error a
        local session would raise."""
        asked = urllib.request.Request(self.url + path, data=None if body is None else json.dumps(body).encode(),
                                       method="GET" if body is None else "POST",
                                       headers={"Content-Type": "application/json"}
                                       | ({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}))
        try:
            response = urllib.request.urlopen(asked, timeout=timeout, context=self._tls)
        except urllib.error.HTTPError as error:
            raise _refusal(error.code, error.read()) from None
        except (urllib.error.URLError, OSError) as error:
            raise EngineError(f"localspec serve at {self.url} does not answer: {getattr(error, 'reason', error)}"
                              " (--local runs the model here)") from None
        with response:
            yield from response


def _refusal(status: int, body: bytes) -> LocalspecError:
    """What the serve said of a request it did not answer, as the error a local session would raise."""
    try:
        message = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        message = body.decode("utf-8", errors="replace")[:200]
    message = message if isinstance(message, str) else json.dumps(message)
    kind = UsageError if status in (400, 401, 404) else InputError if status == 413 else EngineError
    return kind(f"localspec serve: {message}")


def serving(target: str, draft: str | None) -> Remote | None:
    """A serve on this machine that started with the files the target and draft name (any draft, where the
    command names none), found through the records `ps` reads; None where there is none."""
    from . import store

    try:
        files = (store.here(target), *([store.here(target, draft)] if draft else []))
    except LocalspecError:
        return None
    if None in files:
        return None
    for record in reversed(running.processes()):  # the newest first
        held = tuple(Path(path) for path in record.get("files", ()))
        if record["command"] == "serve" and record.get("address") and held[:1] == files[:1] \
                and (draft is None or held[1:2] == files[1:2]):
            try:
                return Remote.of(record)
            except EngineError:  # (its certificate gone: the model loads here)
                return None
    return None


def load(name: str, keep_alive: float | None) -> str:
    """Load a downloaded model into the `localspec serve` on this machine (the newest, where several run), as LM
    Studio's `lms load` does; say which serve holds it and until when. UsageError where no serve runs here."""
    from . import store

    if store.here(name) is None:
        raise UsageError(f"{name!r} is not a downloaded model (`localspec pull {name}` downloads a registry model)")
    serves = [record for record in running.processes() if record["command"] == "serve" and record.get("address")]
    if not serves:
        raise UsageError(f"no `localspec serve` runs on this machine to load {name} into (`localspec serve {name}`"
                         " serves it; run and chat load their own)")
    record = serves[-1]
    if Path(record["files"][0]) == store.here(name):  # (a --ttl would not hold: it stays, as `stop` says)
        return (f"{name} is the model localspec serve at {record['address']} (pid {record['pid']}) started with:"
                " loaded while that serve runs")
    serve = Remote.of(record)
    serve.load(name, keep_alive)
    [held] = [model for model in serve.loaded() if _file(model["name"]) == _file(name)] or [None]
    if held is None:
        raise EngineError(f"localspec serve at {serve.url} (pid {record['pid']}) was asked to load {name}, and does"
                          " not hold it")
    until = ("while that serve runs" if held["expires_at"].startswith("9999")
             else f"until {held['expires_at'][:19].replace('T', ' ')} UTC unless asked for")
    return f"loaded {name} into localspec serve at {serve.url} (pid {record['pid']}), {until}"


def stop(name: str) -> str:
    """Unload a model that a `localspec serve` on this machine loaded on demand (Ollama's `stop`): now, or one
    answering a request as soon as that ends; say which. LocalspecError where it stays loaded or nothing here
    holds it, saying why."""
    from . import store

    path = store.here(name)
    if path is None:
        raise UsageError(f"{name!r} is not a downloaded model (`localspec ps` lists what is loaded)")
    records = running.processes()
    for record in records:
        if record["command"] == "serve" and record.get("address") and Path(record["files"][0]) == path:
            raise LocalspecError(f"{name} is the model `localspec serve` (pid {record['pid']}) started with: it stays"
                                 f" loaded while that serve runs (Ctrl-C there, or `kill {record['pid']}`, stops it)")
    for record in records:
        if record["command"] != "serve" or not record.get("address"):
            continue
        try:
            serve = Remote.of(record)
        except EngineError:  # (its certificate gone: that serve cannot be asked)
            continue
        held = [model["name"] for model in serve.loaded() if _file(model["name"]) == path]
        if not held:
            continue
        serve.unload(held[0])
        if held[0] in (model["name"] for model in serve.loaded()):
            return (f"stopping {name}: it is answering a request at {serve.url} (pid {record['pid']}), and is"
                    " unloaded as soon as that ends")
        return f"stopped {name}: unloaded by localspec serve at {serve.url} (pid {record['pid']})"
    holders = [record for record in records if path in (Path(file) for file in record.get("files", ()))]
    if holders:
        raise LocalspecError(f"{name} is held by `localspec {holders[0]['command']}` (pid {holders[0]['pid']}),"
                             " which lets it go when it ends")
    raise LocalspecError(f"{name} is not loaded by any localspec process (`localspec ps` lists what is)")


def _file(name: str) -> Path | None:
    """The downloaded file a serve's model name means (None where none here)."""
    from . import store

    try:
        return store.here(name)
    except LocalspecError:
        return None


def with_loaded(records: list[dict]) -> list[dict]:
    """`ps`'s records, each serve's with the models it holds now (`loaded`, Remote.loaded's) where it answers."""
    return [record if (held := _held(record)) is None else record | {"loaded": held} for record in records]


def loaded_on_demand(timeout: float) -> list[str]:
    """The models the serves on this machine loaded on demand, which `stop` unloads, of those that answer within
    timeout seconds (a shell completing `stop`'s word waits no longer)."""
    return [model["name"] for record in running.processes() for model in (_held(record, timeout) or [])[1:]]


def _held(record: dict, timeout: float = LISTING_SECONDS) -> list[dict] | None:
    """What a record's serve holds now, the model it started with first (Remote.loaded's); None where the record is no
    serve's or the serve does not answer."""
    if record["command"] != "serve" or not record.get("address"):
        return None
    try:
        return Remote.of(record).loaded(timeout)
    except (LocalspecError, OSError, ValueError, KeyError, TypeError):  # stopped, behind an API key, ...
        return None
