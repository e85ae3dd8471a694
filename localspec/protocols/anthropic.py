"""Anthropic's Messages API beside OpenAI's and Ollama's: POST /v1/messages, which Claude-style coding
agents and many frameworks speak when pointed at a local base URL, and /v1/messages/count_tokens.
Requests become the service's Request as the others' do: content blocks (text, tool_use, tool_result,
thinking) become the chat template's messages, tools its functions, `thinking` a reasoning model's
switch and budget. Answers are Anthropic's message object, or its typed events (message_start, a
content block's start, deltas and stop for each of thinking, text and tool_use, message_delta,
message_stop); errors are its error object. Every answer also carries llama-server's `timings` and
localspec's `speculation` record, where Anthropic's objects leave room for extra fields."""

import json
import uuid
from typing import Literal

from pydantic import Field

from ..errors import InputError
from ..prompts import output_grammar
from ..request import IMAGE_MARKER, Request
from ..service import Job
from ..tool_calls import ToolCall, Tools
from .shared import (ApiError, Answering, Defaults, Parsed, Protocol, Speculative, _Typed, answer_of, effort,
                     image_bytes, name_the_calls_answered, overridden_or_refused, speculation, speculative_asked,
                     thinking_asked, timings, validated)

# A stop string ends a reply as stop_sequence; the end of generation as end_turn; a length or a full context
# as max_tokens (as llama-server says of a full context).
STOP_REASONS = {"length": "max_tokens", "context": "max_tokens"}

# Anthropic's error types by status
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
               503: "overloaded_error"}


class ImageSource(_Typed):
    type: Literal["base64", "url"]
    media_type: str | None = None
    data: str | None = None
    url: str | None = None


class Block(_Typed):
    """A content block, read by its type: text, image (a user's), tool_use (an assistant's call), tool_result (a
    user's answer to one), thinking (an assistant's earlier thinking); redacted_thinking is passed over (it cannot
    be read)."""

    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict | None = None
    tool_use_id: str | None = None
    content: "str | list[Block] | None" = None
    is_error: bool | None = None
    thinking: str | None = None
    source: ImageSource | None = None


class MessageIn(_Typed):
    role: Literal["user", "assistant", "system"]  # (system: instructions given as it goes on, as Claude Code gives)
    content: str | list[Block]


class ToolDefinition(_Typed):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,128}$")  # Anthropic's rule for tool names
    description: str | None = None
    input_schema: dict | None = None
    type: str | None = None  # "custom", or one of Anthropic's own server tools (refused: they run at Anthropic)


class ToolChoice(_Typed):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingIn(_Typed):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = Field(None, ge=0)
    display: Literal["summarized", "omitted"] | None = None  # omitted: thinking blocks come back empty


class OutputFormat(_Typed):
    """Structured outputs: the answer a JSON document that follows the schema."""

    type: Literal["json_schema"]
    schema_: dict | bool = Field(alias="schema")


class OutputConfig(_Typed):
    effort: str | None = None  # how hard a reasoning model thinks: low, medium, high, xhigh, max
    format: OutputFormat | None = None


class Edit(_Typed):
    """A context edit (context_management.edits): clear_thinking_20251015, keeping the thinking of the last `keep`
    turns that have some ({"type": "thinking_turns", "value": N}, its default 1) or "all"."""

    type: str
    keep: Literal["all"] | dict | None = None


class ContextManagement(_Typed):
    edits: list[Edit] | None = None


class CountRequest(_Typed):
    model: str | None = None
    messages: list[MessageIn]
    system: str | list[Block] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingIn | None = None
    output_config: OutputConfig | None = None
    context_management: ContextManagement | None = None  # (Claude Code's: its thinking kept)


class MessagesRequest(CountRequest):
    max_tokens: int | None = Field(None, ge=1)
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    metadata: dict | None = None  # the end user's id: nothing to do with it here
    service_tier: str | None = None
    output_config: OutputConfig | None = None
    output_format: OutputFormat | None = None  # output_config.format's earlier name
    speculative: Speculative | None = None  # this request's own speculation (as on /v1/chat/completions)


# Fields that ask for work done at Anthropic, with the values that ask for none of it: others are refused.
NEUTRAL = {"mcp_servers": (None, []), "container": (None,)}


def parse_messages(body: dict, defaults: Defaults) -> Parsed:
    asked = _validate(MessagesRequest, body)
    form, where = asked.output_format, "output_format.schema"
    if asked.output_config is not None and asked.output_config.format is not None:
        form, where = asked.output_config.format, "output_config.format.schema"
    grammar = None
    if form is not None:
        try:
            grammar = output_grammar(None, form.schema_)
        except InputError as error:
            raise ApiError(400, str(error), param=where, code="invalid_schema") from None
    sampling, limits = overridden_or_refused(defaults, temperature=asked.temperature, top_p=asked.top_p,
                                             top_k=asked.top_k, max_tokens=asked.max_tokens,
                                             stop=asked.stop_sequences, grammar=grammar)
    request = Request(sampling, limits, messages=conversation(asked), tools=_tools(asked),
                      thinking=_thinking(asked, defaults), **speculative_asked(asked.speculative, defaults))
    return Parsed(request, bool(asked.stream), include_usage=True,
                  thinking_shown=not (asked.thinking and asked.thinking.display == "omitted"))


def parse_count(body: dict, defaults: Defaults) -> Request:
    """A count_tokens request as the Request whose prompt it counts."""
    asked = _validate(CountRequest, body)
    return Request(defaults.sampling, defaults.limits, messages=conversation(asked), tools=_tools(asked),
                   thinking=_thinking(asked, defaults))


def _validate(model: type[CountRequest], body: dict):
    asked = validated(model, body, NEUTRAL, "{name}: localspec runs no tools or containers of its own")
    if not asked.messages:
        raise ApiError(400, "messages: at least one message is needed", param="messages")
    return asked


def conversation(asked: CountRequest) -> list[dict]:
    """The request's system prompt and messages as chat templates take them: a user's tool results become
    tool messages (before its text, in the order given), an assistant's tool uses its tool calls and its
    thinking its reasoning_content."""
    messages = []
    if asked.system:
        messages.append({"role": "system", "content": _text(asked.system, "system")})
    for i, message in enumerate(asked.messages):
        where = f"messages.{i}.content"
        if message.role == "system":
            messages.append({"role": "system", "content": _text(message.content, where)})
            continue
        blocks = [Block(type="text", text=message.content)] if isinstance(message.content, str) else message.content
        texts, calls, thoughts, results, images = [], [], [], 0, []
        for j, block in enumerate(blocks):
            at = f"{where}.{j}"
            if block.type == "text" and block.text is not None:
                texts.append(block.text)
            elif block.type == "image" and message.role == "user" and block.source is not None:
                images.append(_image(block, at))
                texts.append(IMAGE_MARKER)
            elif block.type == "tool_result" and message.role == "user" and block.tool_use_id:
                shown: list[bytes] = []  # (a screenshot's, an image file's read)
                content = "" if block.content is None else _text(block.content, f"{at}.content", shown)
                messages.append({"role": "tool", "tool_call_id": block.tool_use_id,
                                 "content": f"Error: {content}" if block.is_error else content}
                                | ({"images": shown} if shown else {}))
                results += 1
            elif block.type == "tool_use" and message.role == "assistant" and block.id and block.name:
                calls.append({"id": block.id, "type": "function",
                              "function": {"name": block.name, "arguments": block.input or {}}})
            elif block.type == "thinking" and message.role == "assistant" and block.thinking is not None:
                thoughts.append(block.thinking)
            elif block.type != "redacted_thinking":
                raise ApiError(400, f"{at}: a {message.role}'s {block.type!r} block is not supported here"
                               " (text, tool_use and thinking from the assistant, text, image and tool_result from"
                               " the user)",
                               param=at)
        if message.role == "assistant" or texts or not results:  # a user's tool results alone make no user turn
            out = {"role": message.role, "content": "\n".join(texts)} | ({"images": images} if images else {})
            if thoughts:
                out["reasoning_content"] = "\n".join(thoughts)
            if calls:
                out["tool_calls"] = calls
            messages.append(out)
    name_the_calls_answered(messages)
    return _thinking_cleared(messages, asked.context_management)


def _thinking_cleared(messages: list[dict], management: ContextManagement | None) -> list[dict]:
    """The conversation after its context edits: clear_thinking_20251015 leaves the earlier thinking of all but the
    last turns it keeps out (the only edit taken: the others clear what Anthropic's servers keep)."""
    edits = (management.edits or []) if management else []
    for j, edit in enumerate(edits):
        where = f"context_management.edits.{j}"
        if edit.type != "clear_thinking_20251015":
            raise ApiError(400, f"{where}.type: {edit.type!r} is not supported here (clear_thinking_20251015 is)",
                           param=f"{where}.type")
        keep = edit.keep if edit.keep is not None else {"type": "thinking_turns", "value": 1}
        if keep == "all":
            continue
        if keep.get("type") != "thinking_turns" or not isinstance(keep.get("value"), int) or keep["value"] < 0:
            raise ApiError(400, f"{where}.keep: \"all\" or {{\"type\": \"thinking_turns\", \"value\": N}}",
                           param=f"{where}.keep")
        thinking = [i for i, m in enumerate(messages) if "reasoning_content" in m]
        cleared = set(thinking[: max(len(thinking) - keep["value"], 0)])
        messages = [{k: v for k, v in m.items() if k != "reasoning_content"} if i in cleared else m
                    for i, m in enumerate(messages)]
    return messages


def _text(content: str | list[Block], where: str, images: list[bytes] | None = None) -> str:
    """A system prompt's or a tool result's text: a string, or text blocks joined by lines (images: a tool result's
    image blocks read into it, each an IMAGE_MARKER where it stands)."""
    if isinstance(content, str):
        return content
    kinds = {block.type for block in content}
    if kinds - ({"text", "image"} if images is not None else {"text"}) \
            or any(block.text is None for block in content if block.type == "text"):
        what = "text and image" if images is not None else "text"
        raise ApiError(400, f"{where}: only {what} blocks are supported here, got {sorted(kinds)}", param=where)
    texts = []
    for j, block in enumerate(content):
        if block.type == "image":
            images.append(_image(block, f"{where}.{j}"))
        texts.append(IMAGE_MARKER if block.type == "image" else block.text)
    return "\n".join(texts)


def _image(block: Block, where: str) -> bytes:
    """An image block's image: its base64 data, or what its http(s) URL serves."""
    source = block.source
    if source is None:
        raise ApiError(400, f"{where}.source is missing", param=f"{where}.source")
    if source.type == "url" and not (source.url or "").startswith(("http://", "https://")):
        raise ApiError(400, f"{where}.source.url: an http(s) URL", param=f"{where}.source.url")
    return image_bytes(source.data if source.type == "base64" else source.url, f"{where}.source")


def _tools(asked: CountRequest) -> Tools | None:
    choice = asked.tool_choice
    if not asked.tools:
        if choice is not None and choice.type in ("any", "tool"):
            raise ApiError(400, "tool_choice asks for a tool call, but the request offers no tools", param="tool_choice")
        return None
    for i, tool in enumerate(asked.tools):
        if tool.type not in (None, "custom") or tool.input_schema is None:
            raise ApiError(400, f"tools.{i}: {tool.type or tool.name!r} is one of Anthropic's own tools; localspec"
                           " offers the model tools you define (name, description, input_schema)", param=f"tools.{i}")
    if choice is not None and choice.type == "tool" and not choice.name:
        raise ApiError(400, "tool_choice.name: the tool to call is missing", param="tool_choice.name")
    taken = {None: "auto", "auto": "auto", "any": "required", "none": "none"}.get(choice and choice.type)
    definitions = tuple({"type": "function", "function": {"name": tool.name, "parameters": tool.input_schema}
                         | ({"description": tool.description} if tool.description else {})} for tool in asked.tools)
    try:
        return Tools(definitions, taken or choice.name, not (choice and choice.disable_parallel_tool_use))
    except InputError as error:
        raise ApiError(400, str(error), param="tools" if "same name" in str(error) else "tool_choice") from None


def _thinking(asked: CountRequest, defaults: Defaults):
    """A reasoning model's thinking: enabled (with a budget of tokens), disabled, or the model's own way
    (adaptive, between tools), at output_config's effort."""
    given, level = asked.thinking, None
    if asked.output_config is not None and asked.output_config.effort is not None:
        level = effort(asked.output_config.effort, "output_config.effort")
    if given is not None and given.type == "disabled":
        return thinking_asked(defaults.thinking, think=False)
    if given is not None and given.type == "enabled":
        return thinking_asked(defaults.thinking, True, level, given.budget_tokens)
    return thinking_asked(defaults.thinking, level=level)


def _event(kind: str, data: dict) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind} | data, ensure_ascii=False)}\n\n"


class Answer(Answering):
    """One message, whole or as Anthropic's server-sent events. A stream opens with message_start; each
    piece of thinking, text or a tool call goes into a content block of its kind (started when the kind
    changes, stopped when the next starts or the message ends); message_delta carries the stop reason and
    the usage, message_stop ends it."""

    media_type = "text/event-stream"
    keepalive = _event("ping", {})  # (Anthropic's own, which its clients pass over)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

    def __init__(self, model: str, thinking_shown: bool = True):
        super().__init__(True, model)
        self.thinking_shown = thinking_shown
        self.id = "msg_" + uuid.uuid4().hex
        self.block: str | None = None  # the kind of the content block open in the stream
        self.index = -1  # its index

    def _message(self, content: list, stop_reason: str | None, stop_sequence: str | None, usage: dict) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": usage}

    def full(self, job: Job) -> dict:
        content, calls = answer_of(job)
        thought = job.recorder.reasoning
        shown = thought if self.thinking_shown else ""
        blocks = [{"type": "thinking", "thinking": shown, "signature": ""}] if thought else []
        blocks += [{"type": "text", "text": content}] if content or not calls else []
        blocks += [_tool_use(call) for call in calls]
        return self._message(blocks, *stop_of(job, bool(calls)), usage_of(job)) | statistics(job)

    def opening(self, job: Job) -> list[str]:
        usage = usage_of(job) | {"output_tokens": 0}
        return [_event("message_start", {"message": self._message([], None, None, usage)}), _event("ping", {})]

    def _into(self, kind: str, start: dict) -> str:
        """The events that leave the open content block for a new one of this kind, where it is another kind."""
        if self.block == kind:
            return ""
        stopped = self._stop()
        self.index += 1
        self.block = kind
        return stopped + _event("content_block_start", {"index": self.index, "content_block": start})

    def _stop(self) -> str:
        return "" if self.block is None else _event("content_block_stop", {"index": self.index})

    def piece(self, text: str) -> str:
        return (self._into("text", {"type": "text", "text": ""})
                + _event("content_block_delta", {"index": self.index, "delta": {"type": "text_delta", "text": text}}))

    def thought(self, text: str) -> str:
        return (self._into("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                + (_event("content_block_delta", {"index": self.index,
                                                  "delta": {"type": "thinking_delta", "thinking": text}})
                   if self.thinking_shown else ""))

    def call(self, call: ToolCall, index: int) -> str:
        # each call a block of its own: the one open is stopped, this one started, filled and stopped
        opened = self._into(f"tool_use {index}", {"type": "tool_use", "id": call.id, "name": call.name, "input": {}})
        return opened + _event("content_block_delta", {"index": self.index, "delta": {
            "type": "input_json_delta", "partial_json": call.arguments}})

    def error(self, failure: ApiError) -> str:
        return _event("error", error_body(failure))

    def closing(self, job: Job, called: bool) -> list[str]:
        stop_reason, stop_sequence = stop_of(job, called)
        usage = {"input_tokens": usage_of(job)["input_tokens"], "output_tokens": job.recorder.tokens}
        frames = [self._stop(), _event("message_delta", {"delta": {"stop_reason": stop_reason,
                                                                   "stop_sequence": stop_sequence},
                                                         "usage": usage} | statistics(job)),
                  _event("message_stop", {})]
        return [frame for frame in frames if frame]


def stop_of(job: Job, called: bool) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence."""
    recorder = job.recorder
    if called:
        return "tool_use", None
    if recorder.stop_sequence is not None:
        return "stop_sequence", recorder.stop_sequence
    return STOP_REASONS.get(recorder.finish_reason, "end_turn"), None


def _tool_use(call: ToolCall) -> dict:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": json.loads(call.arguments)}


def usage_of(job: Job) -> dict:
    """Anthropic's usage: the prompt's tokens read anew, apart from those read from the cache (its input is their
    sum; counted in both, a client took a cached conversation for twice its length)."""
    r = job.recorder
    return {"input_tokens": r.prompt_tokens - r.reused_prompt_tokens, "output_tokens": r.tokens,
            "cache_read_input_tokens": r.reused_prompt_tokens, "cache_creation_input_tokens": 0}


def statistics(job: Job) -> dict:
    return {"timings": timings(job), "speculation": speculation(job)}


def error_body(failure: ApiError) -> dict:
    kind = ERROR_TYPES.get(failure.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": failure.message}}


class Anthropic(Protocol):
    name = "anthropic"

    def error_body(self, failure: ApiError) -> dict:
        return error_body(failure)

    def parse(self, body: dict, chat: bool, defaults: Defaults) -> Parsed:
        return parse_messages(body, defaults)

    def answering(self, chat: bool, model: str, parsed: Parsed) -> Answer:
        return Answer(model, parsed.thinking_shown)


ANTHROPIC = Anthropic()

