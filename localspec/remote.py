"""A running `localspec serve` used as a session: `run` and `chat` hand it their Request and show its
events (serve's own stream, protocols/native.py) with the same live view and statistics as a
generation of their own, without loading the model again. Found through `ps`'s records (a serve that
holds the same files) or named by --host."""

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from . import running, store
from .errors import EngineError, InputError, LocalspecError, UsageError
from .events import Event, from_wire
from .protocols.native import PATH
from .request import Request, to_wire

# to reach the serve, and then between two events: a queue or a long prompt's prefill may take minutes
SILENCE_SECONDS = 600.0


class Remote:
    """A serve at url (api_key: one of its --api-key), generating for the model it started with."""

    def __init__(self, url: str, model: str = "", api_key: str | None = None):
        # (ps records a serve by its OpenAI base URL, http://HOST:PORT/v1)
        self.url, self.model, self.api_key = url.rstrip("/").removesuffix("/v1"), model, api_key

    def describe(self) -> str:
        return f"{self.model} (localspec serve at {self.url})" if self.model else f"localspec serve at {self.url}"

    def generate(self, request: Request) -> Iterator[Event]:
        """The events of one generation on the serve; closing the iterator (Ctrl-C) closes the connection,
        which stops the generation there."""
        asked = urllib.request.Request(self.url + PATH, data=json.dumps(to_wire(request)).encode(), method="POST",
                                       headers={"Content-Type": "application/json"}
                                       | ({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}))
        try:
            response = urllib.request.urlopen(asked, timeout=SILENCE_SECONDS)
        except urllib.error.HTTPError as error:
            raise _refusal(error.code, error.read()) from None
        except (urllib.error.URLError, OSError) as error:
            raise EngineError(f"localspec serve at {self.url} does not answer: {getattr(error, 'reason', error)}"
                              " (--local runs the model here)") from None
        with response:
            for line in response:
                data = json.loads(line)
                if "error" in data:
                    raise _refusal(data.get("status", 500), line)
                yield from_wire(data)


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
            return Remote(record["address"], record["model"])
    return None
