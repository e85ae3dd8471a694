"""localspec's own stream: a Request in (request.to_wire), the engine's events out as they come, one JSON
object a line (events.to_wire), Steps included, so that `run` and `chat` (remote.py) show a running
serve's generation with the same live view and statistics as their own. Errors are `{"error": ...,
"status": ...}`, as a line of the stream once it has begun."""

import json
from dataclasses import asdict, replace

from ..errors import LocalspecError
from ..events import to_wire
from ..request import Request, from_wire
from ..service import Job
from ..session import Session
from .shared import ApiError, Answering, Defaults, Parsed, Protocol

PATH = "/localspec/v1/generate"
INFO_PATH = "/localspec/v1/info"  # what is loaded: what `chat` shows and steers
TOKENS_PATH = "/localspec/v1/tokens"  # a request's prompt counted: `chat` drops old turns by it


def info(session: Session) -> dict:
    return asdict(session.info) | {"describe": session.describe(), "thinks": session.thinks,
                                   "default_mode": str(session.default_mode), "draft_limit": session.draft_limit,
                                   "most_draft": session.most_draft}


def request_of(body: dict) -> Request:
    """The request a body is; a 400 where it is none."""
    try:
        return from_wire(body)
    except LocalspecError as error:
        raise ApiError(400, str(error), param=getattr(error, "setting", None)) from None


class Stream(Answering):
    media_type = "application/x-ndjson"
    every_event = True

    def event(self, item) -> list[str]:
        return [json.dumps(to_wire(item)) + "\n"]

    def error(self, failure: ApiError) -> str:
        return json.dumps(NATIVE.error_body(failure)) + "\n"

    def closing(self, job: Job, called: bool) -> list[str]:
        return []  # (the Done event has said it)


class Native(Protocol):
    name = "localspec"

    def error_body(self, failure: ApiError) -> dict:
        return {"error": failure.message, "status": failure.status}

    def parse(self, body: dict, chat: bool, defaults: Defaults) -> Parsed:
        """The request a body is, with serve's own settings for what it leaves out (the web page's)."""
        request = request_of(body)
        kept = {name: getattr(defaults, name) for name in ("sampling", "limits", "thinking") if name not in body}
        return Parsed(replace(request, **kept), stream=True, include_usage=False)

    def answering(self, chat: bool, model: str, parsed: Parsed) -> Stream:
        return Stream(chat, model)


NATIVE = Native()
