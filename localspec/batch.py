"""Prompt files for scripts: read items, generate each, write one JSON line per item as it finishes.

Input lines are JSON objects (`id`, `prompt` or `messages`, optional `temperature`, `top_k`,
`top_p`, `min_p`, `seed`, the penalties `repeat_penalty`, `repeat_last_n`, `presence_penalty` and
`frequency_penalty`, `logit_bias` (OpenAI's object of token ids to biases, or llama-server's [token, bias]
pairs; a bias of false bans the token), `ignore_eos`, DRY's `dry_multiplier`, `dry_base`, `dry_allowed_length`,
`dry_penalty_last_n` and `dry_sequence_breakers`, XTC's `xtc_probability` and `xtc_threshold`, `typical_p`,
`dynatemp_range`, `dynatemp_exponent`, `top_n_sigma`, `mirostat`, `mirostat_tau` and `mirostat_eta` (llama-server's), `max_tokens`, `stop`, `prediction`: the text the
answer is expected to be, which drafts wherever the answer follows it, `grammar` (GBNF) or `json_schema`: what the
answer must follow, `lora`: the LoRA adapters' scales, `[{"id", "scale"}, ...]` as serve's requests give them, and
`images`: image files' paths or base64, before the prompt's text, as a message's `images` are before its content)
or plain text, one prompt a line; ids are
unique. Output lines are written whole and flushed, so a killed run loses at most the item
in flight and `resume` can pick up where it stopped.
"""

import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

try:
    import fcntl
except ImportError:  # Windows: no advisory locks through fcntl, and the output opens unlocked
    fcntl = None

from . import paths
from .config import OVERRIDABLE, Limits, Sampling, Thinking, meant, overridden
from .errors import InputError, LocalspecError, UsageError, json_trouble, loads_json
from .request import Request, image_of_base64
from .scheduler import ENDED, Scheduler
from .prompts import ROLES, is_message, output_grammar
from .session import Session
from .stats import Recorder


@dataclass(frozen=True)
class Item:
    id: str
    prompt: str | None = None
    messages: list | None = None
    options: dict = field(default_factory=dict)
    prediction: str | None = None
    lora: dict[int, float] | None = None  # the LoRA adapters' scales by id (Request's)
    images: list[bytes] = field(default_factory=list)  # a prompt's (a message carries its own)
    error: str | None = None  # set when the line itself could not be understood


def read_items(lines: Iterable[str]) -> list[Item]:
    """Every item of a prompt file; a line that cannot be understood becomes a failed item.
    Raises UsageError if two items share an id (resume and readers match outputs by id)."""
    items = list(_items(lines))
    seen: set[str] = set()
    for item in items:
        if item.id in seen:
            raise UsageError(f"id {item.id!r} is used by two items: ids must be unique, since outputs and --resume"
                             " match items by id")
        seen.add(item.id)
    return items


def _items(lines: Iterable[str]) -> Iterator[Item]:
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text:
            continue
        conversation = _conversation(text)
        if conversation is None and not text.startswith("{"):
            yield Item(id=str(number), prompt=text)
            continue
        try:
            record = conversation or loads_json(text)
        except json.JSONDecodeError as error:
            yield Item(id=f"line {number}", error=f"not valid JSON: {error.msg} (column {error.colno})")
            continue
        except (ValueError, RecursionError) as error:  # a number of over 4,300 digits; deep nesting
            yield Item(id=f"line {number}", error=f"not JSON that can be read: {json_trouble(error)}")
            continue
        item_id = record.get("id", number)
        if not isinstance(item_id, (str, int)) or isinstance(item_id, bool):
            yield Item(id=f"line {number}", error="'id' must be a string or a whole number")
            continue
        item_id = str(item_id)
        prompt, messages = record.get("prompt"), record.get("messages")
        if not isinstance(prompt, str) and not isinstance(messages, list):
            yield Item(id=item_id, error="needs a 'prompt' string or a 'messages' list")
            continue
        if messages is not None and not _well_formed(messages):
            yield Item(id=item_id, error=("a line that is a JSON list is read as a conversation's messages: "
                                          if conversation else "")
                       + "each message needs a 'role' and a 'content' string, the role one of " + ", ".join(ROLES))
            continue
        try:
            messages = messages and [_with_images(m) for m in messages]
            images = _images(record.get("images") or [])
        except (InputError, UsageError) as error:
            yield Item(id=item_id, error=str(error))
            continue
        if images and not isinstance(prompt, str):
            yield Item(id=item_id, error="'images' go with a 'prompt' (a message carries its own)")
            continue
        prediction = record.get("prediction")
        if prediction is not None and not isinstance(prediction, str):
            yield Item(id=item_id, error="'prediction' must be a string: the text the answer is expected to be")
            continue
        lora = record.get("lora")
        if lora is not None and not (isinstance(lora, list) and all(
                isinstance(entry, dict) and set(entry) == {"id", "scale"} and _whole(entry["id"])
                and _number(entry["scale"]) for entry in lora)):
            yield Item(id=item_id, error="'lora' must be a list of {\"id\": adapter, \"scale\": number} (as serve's"
                       " requests give it)")
            continue
        options = {k: v for k, v in record.items()
                   if k not in ("id", "prompt", "messages", "prediction", "lora", "images")}
        yield Item(id=item_id, prompt=prompt if isinstance(prompt, str) else None, messages=messages, options=options,
                   prediction=prediction, lora=None if lora is None else {e["id"]: e["scale"] for e in lora},
                   images=images)


def _conversation(text: str) -> dict | None:
    """A line that is a JSON list, as an item of its messages (a conversation a line; its text was sent as a prompt,
    brackets and quotes and all); None for any other line, text that opens with a bracket (`[INST] ...`) too."""
    if not text.startswith("["):
        return None
    try:
        listed = loads_json(text)
    except (ValueError, RecursionError):
        return None
    return {"messages": listed} if isinstance(listed, list) else None


def _with_images(message: dict) -> dict:
    return message if message.get("images") is None else message | {"images": _images(message["images"])}


def _images(images) -> list[bytes]:
    """An item's images: each an image file's path or its bytes as base64 (as Ollama's API carries them)."""
    if not isinstance(images, list) or not all(isinstance(image, str) and image for image in images):
        raise InputError("'images' must be a list of image files' paths or base64 texts")
    out = []
    for image in images:
        path = Path(image).expanduser()
        if len(image) < 4096 and path.is_file():
            try:
                out.append(path.read_bytes())
            except OSError as error:
                raise InputError(f"cannot read the image {image}: {error.strerror}") from None
        else:
            try:
                out.append(image_of_base64(image))
            except UsageError:
                raise InputError(f"the image {image[:40]!r} is neither a file nor base64 text") from None
    return out


def _well_formed(messages: list) -> bool:
    return bool(messages) and all(is_message(m) for m in messages)


@contextmanager
def open_output(output: Path | None, input_file: str, resume: bool, overwrite: bool = False) -> Iterator[IO[str]]:
    """The output, opened for reading and appending and locked, or standard output. A file that holds
    records already is gone on from (resume), started again (overwrite), or refused: an hour of answers
    was lost to a command run again without --resume.

    Opened before the models load, so a wrong path fails at once; locked, so a second batch
    writing the same file is refused instead of interleaving its lines with this one's."""
    if output is None:
        yield sys.stdout
        return
    paths.check_output(output, "--output")
    if output.exists() and not output.is_file():
        # resume, the lock and fsync need a file of its own (truncating /dev/null failed with a traceback)
        raise UsageError(f"--output {output} is not a regular file; name a file, or leave -o out to write to"
                         " standard output (and redirect that)")
    if input_file != "-" and output.exists() and output.samefile(input_file):
        raise UsageError(f"--output {output} is the input file; writing it would destroy the prompts")
    try:
        out = open(output, "a+", encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot write --output {output}: {error.strerror}") from None
    with out:
        if not _lock(out):
            raise UsageError(f"another localspec batch is writing {output}; wait for it or choose another --output")
        if not resume:
            out.seek(0)
            records = sum(1 for line in out if line.strip())
            if records and not overwrite:
                raise UsageError(f"--output {output} holds {records} record{'s' if records > 1 else ''} already:"
                                 " --resume goes on from them, --overwrite starts it again")
            out.truncate(0)
        yield out


def _lock(out: IO[str]) -> bool:
    if fcntl is None:
        return True
    try:
        fcntl.flock(out.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def done_ids(out: IO[str], retry_failed: bool = False) -> set[str]:
    """Ids already in an output file opened for reading and writing. A last line cut short by a
    kill is removed first; with retry_failed, so are the records of items that failed."""
    out.seek(0)
    try:
        data = out.read()
    except UnicodeDecodeError as error:
        raise InputError(f"--resume: {out.name} is not UTF-8 text (byte {error.start}), so it is not batch's output;"
                         " choose another --output") from None
    lines = data.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines.pop()
    ids, kept = set(), []
    for line in lines:
        try:
            record = json.loads(line)
            failed = "error" in record
            record_id = str(record["id"])
        except (json.JSONDecodeError, RecursionError, KeyError, TypeError):  # not a record of ours: kept as is
            kept.append(line)
            continue
        if failed and retry_failed:
            continue
        ids.add(record_id)
        kept.append(line)
    if "".join(kept) != data:
        out.seek(0)
        out.truncate()
        out.write("".join(kept))
        out.flush()
    out.seek(0, os.SEEK_END)
    return ids


def settings(item: Item, sampling: Sampling, limits: Limits) -> tuple[Sampling, Limits]:
    """An item's fields over the run's settings, each field checked as a library call's keyword is (overridden):
    JSON's 40.0 is a top_k of 40 here as in a server request, and null keeps the run's value."""
    unknown = set(item.options) - FIELDS
    if unknown:
        first = sorted(unknown)[0]
        raise LocalspecError(f"unknown field(s) {', '.join(sorted(unknown))}" + (f": {hint}" if (hint := meant(
            first, FIELDS)) else ""))
    options = dict(item.options)
    constraints = {name: options.pop(name) for name in ("grammar", "json_schema") if name in options}
    if len(constraints) > 1:
        raise LocalspecError("grammar and json_schema each constrain the answer; give one")
    if not isinstance(constraints.get("json_schema", {}), dict | bool):
        raise LocalspecError(f"json_schema must be a JSON schema (an object), got {_shown(constraints['json_schema'])}")
    if not isinstance(constraints.get("grammar", ""), str):
        raise LocalspecError(f"grammar must be a string (GBNF), got {_shown(constraints['grammar'])}")
    grammar = output_grammar(constraints.get("grammar"), constraints.get("json_schema"))
    return overridden(sampling, limits, grammar=grammar,
                      **{"temperature" if name == "temp" else name: value for name, value in options.items()})


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shown(value) -> str:
    shown = json.dumps(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


# An item's fields: the settings a library call takes (but the log probabilities, which its record does not
# carry), llama.cpp's temp, and a schema for the answer
FIELDS = set(OVERRIDABLE) - {"logprobs", "logprobs_sampled"} | {"temp", "max_tokens", "stop", "json_schema"}


def _request(session: Session, item: Item, sampling: Sampling, limits: Limits, raw: bool, thinking: Thinking,
             conversation: Callable[[list[dict]], list[dict]], template_variables: dict | None) -> Request:
    """What an item asks for: its conversation, or its prompt (wrapped in the chat template unless raw),
    each conversation as the model named asks (conversation: a made model's SYSTEM and MESSAGEs)."""
    if item.error:
        raise LocalspecError(item.error)
    item_sampling, item_limits = settings(item, sampling, limits)
    if not item.messages and not item.prompt:
        raise InputError("the prompt is empty")
    if raw and item.images:
        raise UsageError("an item's images go in the chat template's turn, which --raw leaves out")
    messages = item.messages or (None if raw else [{"role": "user", "content": item.prompt}
                                                   | ({"images": item.images} if item.images else {})])
    prompt = session.prompts.tokenize(item.prompt, raw=True) if messages is None else None
    messages = conversation(messages) if messages is not None else None
    return Request(item_sampling, item_limits, messages=messages, prompt=prompt, prediction=item.prediction,
                   thinking=thinking, template_variables=template_variables, lora=item.lora)


def _record(item: Item, outcome: Recorder, predicted: int | None, thinks: bool) -> dict:
    summary = outcome.summary()
    return ({"id": item.id, "text": outcome.text} | ({"reasoning": outcome.reasoning} if thinks else {})
            | {"finish_reason": outcome.finish_reason, "stats": summary.as_dict()}
            | ({"prediction": summary.prediction_tokens(predicted)} if predicted else {}))


def run(session: Session, items: list[Item], out: IO[str], sampling: Sampling, limits: Limits, raw: bool,
        progress: Callable[[dict], None], durable: bool, running: dict | None = None,
        thinking: Thinking = Thinking(), conversation: Callable[[list[dict]], list[dict]] = list,
        template_variables: dict | None = None) -> list[dict]:
    """Generate the items, as many at once as the session has sequences (--parallel), a record written as
    each finishes; errors become an item's record instead of stopping the batch. durable: out is a file
    on disk, fsynced after every record so a crash cannot lose it. running: the items being generated,
    by sequence (for record_stop). conversation: each conversation as the model named asks for it."""
    records, waiting, scheduler = [], iter(items), Scheduler(session)
    running = {} if running is None else running
    held: tuple[Item, Request] | None = None  # an item of other LoRA scales than those running: it waits for them

    def finish(record: dict) -> None:
        _write(out, record, durable)
        records.append(record)
        progress(record)

    while True:
        while not scheduler.full:
            if held is None:
                if (item := next(waiting, None)) is None:
                    break
                try:
                    held = item, _request(session, item, sampling, limits, raw, thinking, conversation,
                                          template_variables)
                except LocalspecError as error:
                    finish({"id": item.id, "error": str(error)})
                    continue
            item, request = held
            if not scheduler.admits(request):
                break
            held = None
            try:
                started = scheduler.add(request)
            except LocalspecError as error:
                finish({"id": item.id, "error": str(error)})
                continue
            running[started.sequence] = item
        if not scheduler:
            return records
        for started, event in scheduler.step():
            if event is ENDED:
                finish(_record(running.pop(started.sequence), started.recorder, started.predicted or None,
                               session.prompts.thinks))
            elif isinstance(event, LocalspecError):
                finish({"id": running.pop(started.sequence).id, "error": str(event)})
            elif isinstance(event, BaseException):
                raise event


def record_stop(out: IO[str], running: dict, message: str, durable: bool) -> None:
    """llama.cpp is stopping the process (a worker stopped answering): the items it was generating are
    recorded as failed, so that --resume --retry-failed runs them again."""
    for item in running.values():
        _write(out, {"id": item.id, "error": f"llama.cpp stopped: {message}"}, durable)


def _write(out: IO[str], record: dict, durable: bool) -> None:
    # JSON escapes C0 controls but not DEL or C1 ones (\x9b starts a command on a terminal): on a
    # terminal every non-ASCII character is written escaped; files and pipes get the text as is.
    out.write(json.dumps(record, ensure_ascii=out.isatty()) + "\n")
    out.flush()
    if durable:
        os.fsync(out.fileno())
