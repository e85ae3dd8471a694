"""LM Studio's own REST APIs beside OpenAI's on the same port, as clients set up for LM Studio call them. Its v0:
Zed lists models at /api/v0/models (reading each one's state, context lengths and capabilities) and chats at
/api/v0/chat/completions; Cline reads /api/v0/models for the context window. Its requests and streams are OpenAI's;
a whole answer carries LM Studio's `stats` (its speculative decoding counts among them), `model_info` and `runtime`
beside OpenAI's fields. Its v1 (LM Studio 0.4): a chat of its own shape, its conversations kept by response id and
streamed as named events, and its model list, load, unload and download routes."""

import asyncio
import json
import math
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import Field

from .. import __version__, reasoning, store
from ..config import DrafterKind
from ..errors import FetchError, UsageError
from ..events import Reading
from ..request import Request
from ..service import Job
from ..session import Session
from ..stats import Recorder, Summary
from ..store import GGUFInfo, ModelEntry
from . import openai
from .responses import Kept
from .shared import (ApiError, Answering, Defaults, Parsed, Protocol, Speculative, _Typed, image_bytes,
                     overridden_or_refused, speculation, speculative_asked, thinking_asked, timings, validated)

# LM Studio's stop reasons (its SDK's LLMPredictionStopReason) for the recorder's finish reasons
STOP_REASONS = {"stop": "eosFound", "length": "maxPredictedTokensReached", "context": "contextLengthReached"}


def model_object(name: str, info: GGUFInfo, entry: ModelEntry | None, session: Session | None, loading: bool) -> dict:
    """/api/v0/models/{id}: a model that can be served, as LM Studio describes one (Zed refuses a list whose entries
    lack id, object, type, publisher, compatibility_type or state)."""
    vision = session is not None and session.info.vision
    kind = "embeddings" if not info.generates else "vlm" if vision else "llm"
    capabilities = store.capabilities(info, session.prompts.template if session else None)
    out = {"id": name, "object": "model", "type": kind, "publisher": _publisher(info, entry),
           "arch": info.architecture, "compatibility_type": "gguf", "quantization": info.quantization,
           "state": "loaded" if session else "loading" if loading else "not-loaded",
           "max_context_length": info.context_length or 0,
           "capabilities": ["tool_use"] * ("tools" in capabilities) + ["vision"] * vision}
    if session is not None:
        out["loaded_context_length"] = session.info.n_ctx
    return out


def _publisher(info: GGUFInfo, entry: ModelEntry | None) -> str:
    """Who published the model, as LM Studio says it: its Hub repository's owner, else its file's organization."""
    return entry.repo.split("/")[0] if entry and entry.repo else info.get("general.organization") or "local"


def ttl(body: dict) -> float | None:
    """LM Studio's `ttl`: the seconds a model stays loaded once idle, as Ollama's keep_alive (None: as it is)."""
    value = body.get("ttl")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 and value != -1:
        raise ApiError(400, f"ttl is a number of seconds a model stays loaded once idle (-1: while serve runs),"
                       f" not {value!r}", param="ttl")
    return math.inf if value == -1 else float(value)


class Extras(NamedTuple):
    """What LM Studio's clients send beside OpenAI's request: `ttl` (ttl's seconds) and `draft_model` (as asked,
    and as draft_file reads it)."""

    ttl: float | None
    draft_asked: str | None
    draft: str | None


def extras(body: dict) -> Extras:
    """LM Studio's extras of an OpenAI request, each checked (ApiError 400 for one that is none)."""
    return Extras(ttl(body), body.get("draft_model"), draft_file(body))


def draft_file(body: dict) -> str | None:
    """The file of the draft model a request names in LM Studio's `draft_model` (Roo Code sends it with every request
    where its user chose one), as a registry name, a file or the file's name."""
    asked = body.get("draft_model")
    if asked is None:
        return None
    if not isinstance(asked, str) or not asked:
        raise ApiError(400, f"draft_model is a draft model's name, not {asked!r}", param="draft_model")
    try:
        found = store.find(asked)
    except UsageError:
        return asked.rsplit("/", 1)[-1]
    if isinstance(found, ModelEntry):
        return (store.installed(found) or Path(found.file)).name
    return found.name if isinstance(found, Path) else asked  # (a Hub repository's quantization: no file of ours)


def stop_reason(recorder: Recorder, called: bool) -> str:
    """Why an answer ended, as LM Studio says it."""
    return "toolCalls" if called else "stopStringFound" if recorder.stop_sequence else STOP_REASONS.get(
        recorder.finish_reason, "userStopped")


def used_draft(summary: Summary, session: Session) -> str | None:
    """The draft model an answer's drafts came from, where one drafted (n-gram lookup and the rest need none)."""
    return session.info.draft if DrafterKind.DRAFT in summary.drafters else None


class Reply(openai.Reply):
    """OpenAI's answer, a whole one with LM Studio's stats, model_info and runtime beside it (its stream's chunks
    carry none, as LM Studio's carry none)."""

    def __init__(self, chat: bool, model: str, parsed: Parsed, session: Session):
        super().__init__(chat, model, parsed.include_usage, parsed.thinking_apart, parsed.echo, parsed.choices,
                         parsed.token_ids)
        self.session = session

    def full(self, job: Job) -> dict:
        whole = super().full(job)
        info = self.session.target_info
        summary = job.recorder.summary()
        stats = {"tokens_per_second": summary.tokens_per_second, "time_to_first_token": summary.prefill_seconds,
                 "generation_time": summary.decode_seconds,
                 "stop_reason": stop_reason(job.recorder, whole["choices"][0]["finish_reason"] == "tool_calls")}
        if summary.drafted:
            draft = used_draft(summary, self.session)
            stats |= ({"draft_model": draft} if draft else {}) | {
                "total_draft_tokens_count": summary.drafted, "accepted_draft_tokens_count": summary.accepted,
                "rejected_draft_tokens_count": summary.drafted - summary.accepted, "ignored_draft_tokens_count": 0}
        return whole | {
            "stats": stats,
            "model_info": {"arch": info.architecture, "quant": info.quantization, "format": "gguf",
                           "context_length": self.session.info.n_ctx},
            "runtime": {"name": "localspec-llama.cpp-" + "-".join(self.session.plan.target.held_by).lower(),
                        "version": __version__, "supported_formats": ["gguf"]}}


# LM Studio's v1 REST API (LM Studio 0.4, which recommends it for new code): /api/v1/models, /api/v1/chat (a
# conversation kept by response id), and the models' load, unload and download routes.

V1_ERROR_CODES = ("model_not_found", "job_not_found")  # codes that are error types of LM Studio's own
REASONING = {"off": False, "on": True}  # v1 chat's `reasoning`, where it is no effort (low, medium, high)


def v1_error_body(failure: ApiError) -> dict:
    """LM Studio's v1 error object (its type one of its own: invalid_request, model_not_found, job_not_found, ...)."""
    kind = failure.code if failure.code in V1_ERROR_CODES else "not_implemented" if failure.status == 501 else (
        "internal_error" if failure.status >= 500 else "invalid_request")
    return {"error": {"type": kind, "message": failure.message}
            | {name: value for name, value in (("code", failure.code), ("param", failure.param)) if value}}


def v1_model_entry(name: str, info: GGUFInfo, entry: ModelEntry | None, session: Session | None) -> dict:
    """/api/v1/models: a model that can be served, with its loaded instance (serve's one, named as the model)."""
    generates = info.generates
    out = {"type": "llm" if generates else "embedding",
           "publisher": _publisher(info, entry), "key": name,
           "display_name": info.get("general.name") or name, "architecture": info.architecture,
           "quantization": {"name": info.quantization, "bits_per_weight": _bits_per_weight(info)},
           "size_bytes": info.file_size, "params_string": info.parameter_size if generates else None,
           "loaded_instances": [] if session is None else [{"id": name, "config": {
               "context_length": session.info.n_ctx, "parallel": len(session.sequences)}}],
           "max_context_length": info.context_length or 0, "format": "gguf"}
    if generates:
        template = session.prompts.template if session else info.chat_template
        found = store.capabilities(info, template)
        out["capabilities"] = {"vision": session is not None and session.info.vision,
                               "trained_for_tool_use": "tools" in found}
        if "thinking" in found:
            efforts = reasoning.family(template) is reasoning.HARMONY
            out["capabilities"]["reasoning"] = {"allowed_options": ["low", "medium", "high"] if efforts
                                                else ["off", "on"], "default": "medium" if efforts else "on"}
        out["description"] = None
    return out


def _bits_per_weight(info: GGUFInfo) -> float | None:
    """Bits a weight on average, the file's size over its parameters (its metadata and vocabulary counted)."""
    return round(info.file_size * 8 / info.parameters, 2) if info.parameters else None


class InputItem(_Typed):
    type: Literal["message", "text", "image"]  # (its schema says message; its own image example sends text)
    content: str | None = None
    data_url: str | None = None


class ChatBody(_Typed):
    model: str | None = None
    input: str | list[InputItem]
    system_prompt: str | None = None
    integrations: list | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, lt=1)
    repeat_penalty: float | None = Field(None, gt=0)
    max_output_tokens: int | None = Field(None, ge=1)
    reasoning: Literal["off", "low", "medium", "high", "on"] | None = None
    context_length: int | None = Field(None, ge=1)
    store: bool = True
    previous_response_id: str | None = None
    speculative: Speculative | None = None  # this request's own speculation (as on /v1/chat/completions)


class V1(Protocol):
    """LM Studio's v1 chat: `input` (a text, or text and image items) as the user's message after the conversation a
    previous_response_id names (the newest MOST_KEPT kept), `system_prompt` ahead of it; answered as `output` items
    (reasoning, message) with its stats, or streamed as its named events."""

    name = "lmstudio"

    def __init__(self):
        self.kept = Kept()

    def error_body(self, failure: ApiError) -> dict:
        return v1_error_body(failure)

    def parse(self, body: dict, chat: bool, defaults: Defaults) -> Parsed:
        asked = validated(ChatBody, body, {})
        if asked.integrations:
            raise ApiError(400, "integrations (LM Studio's plugins and MCP servers) are not served by localspec:"
                           " offer tools through /v1/chat/completions or /v1/responses", param="integrations",
                           code="not_implemented")
        if asked.previous_response_id is not None and not asked.previous_response_id.startswith("resp_"):
            raise ApiError(400, "previous_response_id is a response_id an earlier chat answered (resp_...)",
                           param="previous_response_id")
        # (what went before, without its system prompt: each chat gives its own)
        carried = (self.kept.get(asked.previous_response_id) if asked.previous_response_id else []) + [
            _user_message(asked.input)]
        messages = ([{"role": "system", "content": asked.system_prompt}] if asked.system_prompt else []) + carried
        sampling, limits = overridden_or_refused(
            defaults, temperature=asked.temperature, top_p=asked.top_p, top_k=asked.top_k, min_p=asked.min_p,
            repeat_penalty=asked.repeat_penalty, max_tokens=asked.max_output_tokens)
        level = None if asked.reasoning in REASONING else asked.reasoning  # (an effort: low, medium, high)
        thinking = None if asked.reasoning is None else thinking_asked(defaults.thinking,
                                                                       REASONING.get(asked.reasoning), level)
        request = Request(sampling, limits, messages=messages, **({"thinking": thinking} if thinking else {}),
                          **speculative_asked(asked.speculative, defaults))
        return Parsed(request, asked.stream, include_usage=True, carried=carried if asked.store else None,
                      shows_reading=True)

    def answering(self, chat: bool, model: str, parsed: Parsed) -> "Chat":
        return Chat(model, parsed, self.kept)


def _user_message(given: str | list[InputItem]) -> dict:
    if isinstance(given, str):
        return {"role": "user", "content": given}
    if not given:
        raise ApiError(400, "input is empty", param="input")
    texts, images = [], []
    for index, item in enumerate(given):
        if item.type == "image":
            if not item.data_url:
                raise ApiError(400, "an image item needs its data_url", param=f"input.{index}.data_url")
            images.append(image_bytes(item.data_url, f"input.{index}.data_url"))
        elif item.content is None:
            raise ApiError(400, f"a {item.type} item needs its content", param=f"input.{index}.content")
        else:
            texts.append(item.content)
    return {"role": "user", "content": "\n".join(texts)} | ({"images": images} if images else {})


def _event(kind: str, data: dict | None = None) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind} | (data or {}), ensure_ascii=False)}\n\n"


class Chat(Answering):
    """One v1 chat's answer: whole, or as LM Studio's named events (chat.start, prompt_processing.*, reasoning.* and
    message.* blocks as the model turns from one to the other, chat.end with the whole answer)."""

    media_type = "text/event-stream"
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    shows_reading = True

    def __init__(self, model: str, parsed: Parsed, kept: Kept):
        super().__init__(True, model)
        self.carried, self.kept = parsed.carried, kept
        self.response_id = "resp_" + uuid.uuid4().hex if parsed.carried is not None else None
        self.block: str | None = None  # reasoning or message: the block open in the stream
        self.processing = False  # the prompt's reading was said to start, and not yet to end
        self.load_seconds: float | None = None  # how long this request waited for its model's load, where it did

    def full(self, job: Job) -> dict:
        recorder = job.recorder
        content, thought = recorder.text, recorder.reasoning
        if self.response_id is not None:
            self.kept.put(self.response_id, [*self.carried, {"role": "assistant", "content": content}
                                              | ({"reasoning_content": thought} if thought else {})])
        summary = recorder.summary()
        stats = {"input_tokens": summary.prompt_tokens, "total_output_tokens": summary.tokens,
                 "reasoning_output_tokens": recorder.parts["thinking"].tokens,
                 "tokens_per_second": summary.tokens_per_second, "time_to_first_token_seconds": summary.prefill_seconds}
        if self.load_seconds is not None:
            stats["model_load_time_seconds"] = self.load_seconds
        output = ([{"type": "reasoning", "content": thought}] if thought else []) + (
            [{"type": "message", "content": content}] if content or not thought else [])  # (all of it thinking: none)
        return {"model_instance_id": self.model, "output": output, "stats": stats} | (
            {"response_id": self.response_id} if self.response_id else {}) | {
            "timings": timings(job), "speculation": speculation(job)}

    def opening(self, job: Job) -> list[str]:
        self.processing = True
        return [_event("chat.start", {"model_instance_id": self.model}), _event("prompt_processing.start")]

    def reading(self, job: Job, reading: Reading) -> list[str]:
        return [_event("prompt_processing.progress", {"progress": reading.read / reading.total})]

    def _into(self, block: str) -> str:
        """The events that end the prompt's reading or the open block and start this one, where it is another."""
        if self.block == block:
            return ""
        out = _event("prompt_processing.end") if self.processing else self._end()
        self.processing, self.block = False, block
        return out + _event(f"{block}.start")

    def _end(self) -> str:
        return "" if self.block is None else _event(f"{self.block}.end")

    def piece(self, text: str, tokens=()) -> str:
        return self._into("message") + _event("message.delta", {"content": text})

    def thought(self, text: str) -> str:
        return self._into("reasoning") + _event("reasoning.delta", {"content": text})

    def error(self, failure: ApiError) -> str:
        return _event("error", v1_error_body(failure))

    def closing(self, job: Job, called: bool) -> list[str]:
        ended = _event("prompt_processing.end") if self.processing else self._end()
        return [frame for frame in (ended, _event("chat.end", {"result": self.full(job)})) if frame]


class LoadBody(_Typed):
    model: str
    context_length: int | None = Field(None, ge=1)
    eval_batch_size: int | None = Field(None, ge=1)
    flash_attention: bool | None = None
    num_experts: int | None = Field(None, ge=1)
    offload_kv_cache_to_gpu: bool | None = None
    echo_load_config: bool = False


def parse_load(body: dict) -> LoadBody:
    return validated(LoadBody, body, {})


def loaded(asked: LoadBody, name: str, session: Session, batch: int, seconds: float) -> dict:
    """The answer to a load, once the model is loaded (batch: the prompt batch serve loads models with; seconds: how
    long the load took): a 400 where a setting asked for is not the one serve loads every model with (its command
    line sets them)."""
    config = {"context_length": session.info.n_ctx, "eval_batch_size": batch}
    for setting, option in (("context_length", "-c"), ("eval_batch_size", "--batch-size")):
        given = getattr(asked, setting)
        if given is not None and given != config[setting]:
            raise ApiError(400, f"{name} is loaded with {setting} {config[setting]}, not {given}: serve's {option}"
                           " sets it for every model it loads", param=setting)
    return {"type": "llm" if session.target_info.generates else "embedding", "instance_id": name,
            "load_time_seconds": round(seconds, 3), "status": "loaded"} | (
        {"load_config": config} if asked.echo_load_config else {})


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Download:
    """One model's download (POST /api/v1/models/download) as its status route tells it: a tqdm-shaped bar a file
    (what localspec's downloader reports to), their bytes summed."""

    def __init__(self, total: int | None, stopping: Callable[[], str]):
        """stopping: why the download stops at its next block, where it does (serve shutting down, its client
        cancelling it); what arrived is kept for the next download to go on from."""
        self.job_id, self.stopping = "job_" + uuid.uuid4().hex[:10], stopping
        self.total, self.started, self.ended = total or 0, time.time(), None
        self.status, self.error = "downloading", None
        self._files: dict[str, list[int]] = {}  # each file's [total, arrived, arrived when this job began]
        self.fetching: asyncio.Future | None = None  # (the thread fetching it, once begun)

    def bar(self, *, total=None, initial=0, desc="", **_) -> "_Bar":
        self._files[desc] = [total or 0, initial, initial]
        self.total = max(self.total, sum(file[0] for file in self._files.values()))
        return _Bar(self._files[desc], self.stopping)

    def end(self, error: Exception | None) -> None:
        self.status, self.error = ("failed", str(error)) if error else ("completed", None)
        self.ended = time.time()

    def started_body(self) -> dict:
        return {"job_id": self.job_id, "status": self.status, "total_size_bytes": self.total,
                "started_at": _iso(self.started)}

    def progress(self) -> tuple[int, int, float]:
        """Bytes arrived, in all, and arriving a second since the job began."""
        arrived = sum(file[1] for file in self._files.values())
        elapsed = time.time() - self.started
        return arrived, self.total, sum(file[1] - file[2] for file in self._files.values()) / elapsed if elapsed > 0 \
            else 0.0

    def status_body(self) -> dict:
        arrived, _, speed = self.progress()
        out = self.started_body() | {"downloaded_bytes": arrived if self.status != "completed" else self.total}
        if self.status == "downloading":
            out["bytes_per_second"] = round(speed)
            if speed > 0:
                out["estimated_completion"] = _iso(time.time() + max(0, self.total - arrived) / speed)
        if self.ended is not None:
            out["completed_at" if self.status == "completed" else "failed_at"] = _iso(self.ended)
        return out | ({"error": self.error} if self.error else {})


class _Bar:
    def __init__(self, counts: list[int], stopping: Callable[[], str]):
        self.counts, self.stopping = counts, stopping

    def update(self, n=1):
        if why := self.stopping():
            raise FetchError(f"{why}: the download stops here (what arrived is kept: download again to go on)")
        self.counts[1] += n

    def close(self):
        pass
