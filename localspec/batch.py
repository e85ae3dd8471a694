"""Prompt files for scripts: read items, generate each, write one JSON line per item as it finishes.

Input lines are JSON objects (`id`, `prompt` or `messages`, optional `temperature`, `top_k`,
`top_p`, `min_p`, `seed`, `max_tokens`, `stop`) or plain text, one prompt a line. Output
lines are written whole and flushed, so a killed run loses at most the item in flight
and `resume` can pick up where it stopped.
"""

import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

from .config import Limits, Sampling
from .errors import LocalspecError
from .events import Done
from .session import Session

SAMPLING_FIELDS = {"temperature": "temperature", "temp": "temperature", "top_k": "top_k", "top_p": "top_p",
                   "min_p": "min_p", "seed": "seed"}


@dataclass(frozen=True)
class Item:
    id: str
    prompt: str | None = None
    messages: list | None = None
    options: dict = field(default_factory=dict)
    error: str | None = None  # set when the line itself could not be understood


def read_items(lines: Iterable[str]) -> Iterator[Item]:
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text:
            continue
        if not text.startswith("{"):
            yield Item(id=str(number), prompt=text)
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as error:
            yield Item(id=f"line {number}", error=f"not valid JSON: {error.msg} at column {error.colno}")
            continue
        item_id = str(record.get("id", number))
        prompt, messages = record.get("prompt"), record.get("messages")
        if not isinstance(prompt, str) and not isinstance(messages, list):
            yield Item(id=item_id, error="needs a 'prompt' string or a 'messages' list")
            continue
        options = {k: v for k, v in record.items() if k not in ("id", "prompt", "messages")}
        yield Item(id=item_id, prompt=prompt if isinstance(prompt, str) else None, messages=messages, options=options)


def done_ids(output: Path) -> set[str]:
    """Ids already in an output file. A last line cut short by a kill is removed first."""
    if not output.exists():
        return set()
    data = output.read_bytes()
    if data and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
        with open(output, "r+b") as f:
            f.truncate(keep)
        data = data[:keep]
    ids = set()
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            ids.add(str(json.loads(line)["id"]))
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    return ids


def settings(item: Item, sampling: Sampling, limits: Limits) -> tuple[Sampling, Limits]:
    unknown = set(item.options) - set(SAMPLING_FIELDS) - {"max_tokens", "stop"}
    if unknown:
        raise LocalspecError(f"unknown field(s) {', '.join(sorted(unknown))}")
    overrides = {SAMPLING_FIELDS[k]: v for k, v in item.options.items() if k in SAMPLING_FIELDS}
    stop = item.options.get("stop", limits.stop)
    try:
        return (
            replace(sampling, **overrides),
            replace(limits, max_tokens=item.options.get("max_tokens", limits.max_tokens),
                    stop=tuple([stop] if isinstance(stop, str) else stop)),
        )
    except TypeError as error:
        raise LocalspecError(f"bad field value ({error})") from None


def run_item(session: Session, item: Item, sampling: Sampling, limits: Limits, raw: bool) -> dict:
    """One output record; errors become the record instead of stopping the batch."""
    try:
        if item.error:
            raise LocalspecError(item.error)
        item_sampling, item_limits = settings(item, sampling, limits)
        tokens = session.chat_tokens(item.messages) if item.messages else session.tokenize(item.prompt, raw)
        done = next(e for e in session.generate(tokens, item_sampling, item_limits) if isinstance(e, Done))
    except LocalspecError as error:
        return {"id": item.id, "error": str(error)}
    return {"id": item.id, "text": done.text, "finish_reason": done.finish_reason, "stats": done.summary.as_dict()}


def run(session: Session, items: list[Item], out: IO[str], sampling: Sampling, limits: Limits, raw: bool,
        progress: Callable[[dict], None], durable: bool) -> list[dict]:
    """durable: out is a file on disk, fsynced after every record so a crash cannot lose it."""
    records = []
    for item in items:
        record = run_item(session, item, sampling, limits, raw)
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
        out.flush()
        if durable:
            os.fsync(out.fileno())
        records.append(record)
        progress(record)
    return records
