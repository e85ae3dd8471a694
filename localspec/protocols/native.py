"""localspec's own stream: a Request in (request.to_wire), the engine's events out as they come, one JSON
object a line (events.to_wire), Steps included, so that `run` and `chat` (remote.py) show a running
serve's generation with the same live view and statistics as their own. Errors are `{"error": ...,
"status": ...}`, as a line of the stream once it has begun."""

import json

from ..errors import LocalspecError
from ..events import to_wire
from ..request import from_wire
from ..service import Job
from .shared import ApiError, Answering, Defaults, Parsed, Protocol

PATH = "/localspec/v1/generate"


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
        try:
            return Parsed(from_wire(body), stream=True, include_usage=False)
        except LocalspecError as error:
            raise ApiError(400, str(error), param=getattr(error, "setting", None)) from None

    def answering(self, chat: bool, model: str, parsed: Parsed) -> Stream:
        return Stream(chat, model)


NATIVE = Native()
