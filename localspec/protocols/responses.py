"""OpenAI's Responses API (POST /v1/responses), which the OpenAI Agents SDK and Codex speak: an `input` of
text or typed items (messages, function and custom tool calls and their outputs) after `instructions`, `tools`
as functions (custom tools' and namespaces' among them), `text.format` a JSON schema, `reasoning.effort`, and
`previous_response_id` to go on from an answer this server gave (kept in memory, the newest MOST_KEPT of them).
Answers are a response object with its output items (reasoning, the message, calls), or the stream of typed
events the openai package reads (response.created ... response.completed); errors are OpenAI's error object.
Every response also carries llama-server's `timings` and localspec's `speculation` record."""

import json
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from threading import Lock
from typing import Literal

from pydantic import Field

from ..errors import InputError, loads_json
from ..prompts import ROLES, output_grammar
from ..request import IMAGE_MARKER, Request
from ..service import Job
from ..tool_calls import ToolCall, Tools
from .shared import (ApiError, Answering, Defaults, Parsed, Protocol, Speculative, _Typed, answer_of, effort,
                     image_bytes, name_the_calls_answered, output_told, overridden_or_refused, speculation,
                     speculative_asked, thinking_asked, timings, validated)

MOST_KEPT = 1000  # responses a server keeps for previous_response_id, newest first

# Fields that would change the output if honoured, with the values that leave it as it is.
NEUTRAL = {"top_logprobs": (None, 0), "background": (None, False), "conversation": (None,), "prompt": (None,),
           "max_tool_calls": (None,)}


class Part(_Typed):
    type: str
    text: str | None = None
    image_url: str | None = None  # an input_image's: a data: or http(s) URL


class Item(_Typed):
    """An input item: a message (by its role, `type` "message" or left out), a function call the model made
    earlier, a call's output, or earlier reasoning."""

    type: str | None = None
    role: str | None = None
    content: str | list[Part] | None = None
    call_id: str | None = None
    name: str | None = None
    namespace: str | None = None  # a call's of a tool in a namespace
    arguments: str | None = None
    input: str | None = None  # a custom tool call's
    output: str | list[Part] | None = None
    summary: list[Part] | None = None  # earlier reasoning's, where it gives no content


class FunctionTool(_Typed):
    """A function, a custom tool (its input free text, `format` a grammar it follows), a namespace of them
    (`tools`), or a tool that runs at OpenAI (web_search, ...)."""

    type: str
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None
    format: dict | None = None
    tools: list["FunctionTool"] | None = None


# Tools that run at OpenAI, or whose calls only OpenAI's models write (by type, or its start: web_search_preview,
# computer_use_preview): left out of what the model is offered, as llama-server and LiteLLM leave them.
HOSTED = ("web_search", "file_search", "image_generation", "code_interpreter", "computer", "mcp", "local_shell",
          "shell", "apply_patch", "tool_search")


@dataclass(frozen=True)
class Offered:
    """A tool as the client named it, where the model is offered it otherwise: a namespace's function by one flat
    name; a custom tool as a function of one string, `input`, its calls answered as custom tool calls."""

    name: str
    namespace: str | None = None
    custom: bool = False


class NamedTool(_Typed):
    type: Literal["function"]
    name: str
    namespace: str | None = None


class TextFormat(_Typed):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict | bool | None = Field(None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextConfig(_Typed):
    format: TextFormat | None = None
    verbosity: str | None = None


class Reasoning(_Typed):
    effort: str | None = None
    summary: str | None = None  # a summary of the thinking asked for: the thinking itself comes back as one


class ResponsesRequest(_Typed):
    model: str | None = None
    input: str | list[Item]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedTool | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    previous_response_id: str | None = None
    # auto: a conversation that leaves the answer no room loses its oldest turns (as Ollama's truncate drops them)
    truncation: Literal["auto", "disabled"] | None = None
    store: bool | None = None
    stream: bool | None = False
    metadata: dict | None = None
    speculative: Speculative | None = None  # this request's own speculation (as on /v1/chat/completions)


class Kept:
    """The conversations of the responses this server gave (each with its answer), by response id, the
    newest MOST_KEPT; shared by the request threads and the event loop."""

    def __init__(self, most: int = MOST_KEPT):
        self.most, self._lock, self._kept = most, Lock(), OrderedDict()

    def get(self, response_id: str) -> list[dict]:
        with self._lock:
            if response_id not in self._kept:
                raise ApiError(404, f"previous_response_id: no response {response_id!r} is kept here (this server"
                               f" keeps the newest {self.most:,} while it runs)", param="previous_response_id",
                               code="previous_response_not_found")
            return list(self._kept[response_id])

    def put(self, response_id: str, messages: list[dict]) -> None:
        with self._lock:
            self._kept[response_id] = messages
            while len(self._kept) > self.most:
                self._kept.popitem(last=False)


class Responses(Protocol):
    """OpenAI's Responses API, with the responses it gave kept for previous_response_id (one a server)."""

    name = "responses"

    def __init__(self):
        self.kept = Kept()

    def error_body(self, failure: ApiError) -> dict:
        return failure.body()

    def parse(self, body: dict, chat: bool, defaults: Defaults) -> Parsed:
        asked = _validate(body)
        # what went before, without its instructions (each request gives its own, as on OpenAI's API)
        carried = self.kept.get(asked.previous_response_id) if asked.previous_response_id else []
        carried += conversation(asked.input)
        messages = ([{"role": "system", "content": asked.instructions}] if asked.instructions else []) + carried
        _refuse_outputs_of_no_call(messages)
        name_the_calls_answered(messages)
        sampling, limits = overridden_or_refused(defaults, temperature=asked.temperature, top_p=asked.top_p,
                                                 max_tokens=asked.max_output_tokens, grammar=_grammar(asked))
        given = asked.reasoning.effort if asked.reasoning else None
        level = effort(given, "reasoning.effort") if given else None
        thinking = thinking_asked(defaults.thinking, False if given == "none" else None, level)
        form = asked.text.format if asked.text else None
        told = {"response_format": output_told(form.schema_ if form.type == "json_schema" else None, form.name)} \
            if form and form.type != "text" else None
        tools, offered = _tools(asked)
        request = Request(sampling, limits, messages=messages, tools=tools, thinking=thinking,
                          template_variables=told, **speculative_asked(asked.speculative, defaults))
        summarized = bool(asked.reasoning and asked.reasoning.summary not in (None, "none"))
        return Parsed(request, bool(asked.stream), include_usage=True, carried=carried, offered=offered,
                      summarized=summarized, fits=asked.truncation == "auto")

    def answering(self, chat: bool, model: str, parsed: Parsed) -> "Answer":
        return Answer(model, parsed, self.kept)


def _validate(body: dict) -> ResponsesRequest:
    asked = validated(ResponsesRequest, body, NEUTRAL)
    if asked.input in ("", []):
        raise ApiError(400, "input is empty", param="input")
    return asked


def conversation(given: str | list[Item]) -> list[dict]:
    """Input items as chat templates take messages: a function call joins the assistant message before it
    (or makes one), its output is a tool message, earlier reasoning the next assistant message's."""
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    messages, thought = [], None
    for i, item in enumerate(given):
        where = f"input.{i}"
        kind = item.type or "message"
        if kind == "message":
            role = {"developer": "system"}.get(item.role or "", item.role)
            if role not in ROLES:
                raise ApiError(400, f"{where}.role: {item.role!r}; use system, developer, user or assistant",
                               param=f"{where}.role")
            images = _images(item.content, f"{where}.content") if role == "user" else []
            message = {"role": role, "content": _text(item.content, f"{where}.content", bool(images))}
            if images:
                message["images"] = images
            if role == "assistant" and thought:
                message["reasoning_content"], thought = thought, None
            messages.append(message)
        elif kind == "function_call":
            if not (item.call_id and item.name and item.arguments is not None):
                raise ApiError(400, f"{where}: a function call needs call_id, name and arguments", param=where)
            try:
                arguments = loads_json(item.arguments)
            except ValueError:
                arguments = None
            if not isinstance(arguments, dict):
                raise ApiError(400, f"{where}.arguments: not a JSON object", param=f"{where}.arguments")
            _called(messages, item, arguments)
        elif kind == "custom_tool_call":
            if not (item.call_id and item.name and isinstance(item.input, str)):
                raise ApiError(400, f"{where}: a custom tool call needs call_id, name and input", param=where)
            _called(messages, item, {"input": item.input})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            if not item.call_id or item.output is None:
                raise ApiError(400, f"{where}: a function call's output needs call_id and output", param=where)
            images = _images(item.output, f"{where}.output")  # (Codex's view_image gives one)
            messages.append({"role": "tool", "tool_call_id": item.call_id,
                             "content": _text(item.output, f"{where}.output", bool(images))}
                            | ({"images": images} if images else {}))
        elif kind == "reasoning":  # (its text, else its summary's: another server's, OpenAI's)
            parts = item.content if isinstance(item.content, list) and item.content else item.summary or ()
            thought = "".join(part.text or "" for part in parts) or None
        else:
            raise ApiError(400, f"{where}.type: {kind!r} items are not supported (message, function_call,"
                           " function_call_output, custom_tool_call, custom_tool_call_output, reasoning)",
                           param=f"{where}.type")
    if not messages:
        raise ApiError(400, "input holds no message to answer", param="input")
    return messages


def _refuse_outputs_of_no_call(messages: list[dict]) -> None:
    """A 400 for a call's output whose call_id no call of the conversation has, as OpenAI's (a template would write
    a result of nothing the model asked for)."""
    called = {call["id"] for message in messages for call in message.get("tool_calls", ())}
    for message in messages:
        if message["role"] == "tool" and message["tool_call_id"] not in called:
            raise ApiError(400, f"input: no function call has call_id {message['tool_call_id']!r} (its function_call"
                           " item, or the response previous_response_id names, carries it)", param="input")


def _called(messages: list[dict], item: Item, arguments: dict) -> None:
    """A call the model made earlier, joined to the assistant's message before it (or one made for it), by the
    name the model was offered its tool by."""
    if not messages or messages[-1]["role"] != "assistant":
        messages.append({"role": "assistant", "content": ""})
    name = flat_name(item.namespace, item.name) if item.namespace else item.name
    messages[-1].setdefault("tool_calls", []).append(
        {"id": item.call_id, "type": "function", "function": {"name": name, "arguments": arguments}})


def _images(content: str | list[Part] | None, where: str) -> list[bytes]:
    """The images of a user's message or a call's output: its input_image parts'."""
    return [image_bytes(part.image_url, f"{where}.{j}.image_url")
            for j, part in enumerate(content) if part.type == "input_image"] if isinstance(content, list) else []


def _text(content: str | list[Part] | None, where: str, images: bool = False) -> str:
    """Text parts joined by lines (images: a user's input_image parts read, each an IMAGE_MARKER where it stands)."""
    if content is None:
        raise ApiError(400, f"{where} is missing", param=where)
    if isinstance(content, str):
        return content
    kinds = {part.type for part in content}
    read = {"input_text", "output_text", "text"} | ({"input_image"} if images else set())
    if kinds - read or any(part.text is None for part in content if part.type != "input_image"):
        raise ApiError(400, f"{where}: only {'text and input_image' if images else 'text'} parts are supported here,"
                       f" got {sorted(kinds)}", param=where)
    return "\n".join(IMAGE_MARKER if part.type == "input_image" else part.text for part in content)


def flat_name(namespace: str, name: str) -> str:
    """The one name a function of a namespace is offered to the model by (as vLLM and Codex's bridges flatten it:
    `mcp__node_repl` and `js`, `mcp__node_repl__js`)."""
    return f"{namespace}__{name}"


def _tools(asked: ResponsesRequest) -> tuple[Tools | None, dict[str, Offered]]:
    """The functions a request offers the model: its functions, its custom tools (each a function of its input),
    those of its namespaces by their flat names; and how each of these last two is named back. The tools that run at
    OpenAI (HOSTED: Codex offers web_search in every request) are left out."""
    offered: dict[str, Offered] = {}
    functions: list[dict] = []

    def offer(tool: FunctionTool, where: str, namespace: str | None = None) -> None:
        if tool.type not in ("function", "custom"):
            if namespace is not None or not tool.type.startswith(HOSTED):
                raise ApiError(400, f"{where}.type: {tool.type!r} tools are not supported (function, custom, namespace;"
                               " those that run at OpenAI are left out)", param=f"{where}.type")
            return
        if not tool.name:
            raise ApiError(400, f"{where}.name: a {tool.type} tool needs a name", param=f"{where}.name")
        name = flat_name(namespace, tool.name) if namespace else tool.name
        if namespace or tool.type == "custom":
            offered[name] = Offered(tool.name, namespace, tool.type == "custom")
        functions.append(_as_function(tool, name))

    for i, tool in enumerate(asked.tools or ()):
        if tool.type != "namespace":
            offer(tool, f"tools.{i}")
        elif not tool.name:
            raise ApiError(400, f"tools.{i}.name: a namespace needs a name", param=f"tools.{i}.name")
        else:
            for j, member in enumerate(tool.tools or ()):
                offer(member, f"tools.{i}.tools.{j}", tool.name)
    choice = asked.tool_choice
    if not functions:
        if choice not in (None, "none", "auto"):
            raise ApiError(400, "tool_choice asks for a tool call, but the request offers no tools", param="tool_choice")
        return None, offered
    taken = "auto" if choice is None else choice if isinstance(choice, str) else \
        flat_name(choice.namespace, choice.name) if choice.namespace else choice.name
    try:
        return Tools(tuple({"type": "function", "function": f} for f in functions), taken,
                     asked.parallel_tool_calls is not False), offered
    except InputError as error:
        raise ApiError(400, str(error), param="tools" if "same name" in str(error) else "tool_choice") from None


def _as_function(tool: FunctionTool, name: str) -> dict:
    """A tool as the function the model is offered: a custom tool's input one string, held to its grammar where
    that is a regular expression, told it where it is Lark's (which no grammar here reads)."""
    if tool.type == "function":
        return tool.model_dump(exclude_none=True, include={"description", "parameters"}) | {"name": name}
    form, described = tool.format or {}, tool.description or ""
    given = {"type": "string"}
    if form.get("type") == "grammar" and form.get("syntax") == "regex":
        definition = str(form.get("definition") or "")  # (matched whole: anchored, where it is not, for the reader)
        given["pattern"] = definition if definition.startswith("^") and definition.endswith("$") else f"^({definition})$"
    elif form.get("type") == "grammar":
        described += f"\n\nThe input follows this {form.get('syntax')} grammar:\n{form.get('definition')}"
    return {"name": name, "description": described,
            "parameters": {"type": "object", "properties": {"input": given}, "required": ["input"]}}


def _grammar(asked: ResponsesRequest) -> str | None:
    form = asked.text.format if asked.text else None
    if form is None or form.type == "text":
        return None
    if form.type == "json_schema" and form.schema_ is None:
        raise ApiError(400, "text.format.schema is missing: the schema the output must follow", param="text.format.schema")
    try:
        return output_grammar(None, form.schema_, any_object=form.type == "json_object")
    except InputError as error:
        raise ApiError(400, str(error), param="text.format", code="invalid_schema") from None


class Answer(Answering):
    """One response, whole or as the Responses API's events: response.created and .in_progress, then an
    output item for each of the thinking (reasoning), the text (a message with one output_text part) and
    every function call, each added, filled by deltas and done, then response.completed with them all.
    Once answered, its conversation is kept for a later previous_response_id."""

    media_type = "text/event-stream"
    keepalive = ": reading the prompt\n\n"
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

    def __init__(self, model: str, parsed: Parsed, kept: Kept):
        super().__init__(True, model)
        self.id, self.created = "resp_" + uuid.uuid4().hex, int(time.time())
        self.carried, self.kept, self.offered = parsed.carried, kept, parsed.offered or {}
        self.summarized = parsed.summarized
        self.items: list[dict] = []  # the output items streamed so far, the last one maybe still open
        self.calls: list[ToolCall] = []  # the calls among them, as the model made them
        self.open = False  # whether the last item is still being filled
        self.sequence = 0

    def _response(self, status: str, output: list, job: Job | None) -> dict:
        out = {"id": self.id, "object": "response", "created_at": self.created, "status": status, "model": self.model,
               "output": output, "error": None, "incomplete_details": None, "parallel_tool_calls": True,
               "tool_choice": "auto", "tools": [], "metadata": {}, "text": {"format": {"type": "text"}}}
        if job is None:
            return out
        r = job.recorder
        if status == "incomplete":
            out["incomplete_details"] = {"reason": "max_output_tokens"}
        out["usage"] = {"input_tokens": r.prompt_tokens, "output_tokens": r.tokens,
                        "input_tokens_details": {"cached_tokens": r.reused_prompt_tokens},
                        "output_tokens_details": {"reasoning_tokens": r.parts["thinking"].tokens},
                        "total_tokens": r.prompt_tokens + r.tokens}
        return out | {"timings": timings(job), "speculation": speculation(job)}

    def _finished(self, job: Job, items: list[dict], calls: list[ToolCall]) -> dict:
        """The whole response, its conversation kept (the calls as the model made them)."""
        assistant = {"role": "assistant", "content": "".join(part["text"] for item in items if item["type"] == "message"
                                                             for part in item["content"])}
        thought = "".join(_part(item)["text"] for item in items if item["type"] == "reasoning")
        if thought:
            assistant["reasoning_content"] = thought
        if calls:
            assistant["tool_calls"] = [{"id": call.id, "type": "function", "function": {
                "name": call.name, "arguments": call.argument_values}} for call in calls]
        self.kept.put(self.id, [*self.carried, assistant])
        status = "incomplete" if job.recorder.finish_reason in ("length", "context") and not calls else "completed"
        return self._response(status, items, job)

    def full(self, job: Job) -> dict:
        content, calls = answer_of(job)
        thought = job.recorder.reasoning
        items = [_reasoning(thought, self.summarized)] if thought else []
        items += [_message(content)] if content or not calls else []
        items += [self._call(call, "completed") for call in calls]
        return self._finished(job, items, calls)

    def _event(self, kind: str, data: dict) -> str:
        self.sequence += 1
        data = {"type": kind, "sequence_number": self.sequence} | data
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def opening(self, job: Job) -> list[str]:
        started = self._response("in_progress", [], None)
        return [self._event("response.created", {"response": started}),
                self._event("response.in_progress", {"response": started})]

    def _into(self, kind: str) -> str:
        """The events that close the item being filled and add one of this kind, where it is another kind."""
        if self.open and self.items[-1]["type"] == kind:
            return ""
        frames = self._close()
        item = _reasoning("", self.summarized) if kind == "reasoning" else _message("")
        self.items.append(item)
        self.open = True
        frames += self._event("response.output_item.added", {"output_index": len(self.items) - 1,
                                                              "item": _in_progress(item)})
        if kind == "reasoning" and self.summarized:
            frames += self._event("response.reasoning_summary_part.added", {
                "item_id": item["id"], "output_index": len(self.items) - 1, "summary_index": 0,
                "part": {"type": "summary_text", "text": ""}})
        if kind == "message":
            frames += self._event("response.content_part.added", {
                "item_id": item["id"], "output_index": len(self.items) - 1, "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []}})
        return frames

    def _close(self) -> str:
        if not self.open:
            return ""
        self.open = False
        item, index = self.items[-1], len(self.items) - 1
        part = _part(item)
        at = {"item_id": item["id"], "output_index": index, self._part_index(item["type"]): 0}
        if item["type"] == "reasoning" and self.summarized:
            frames = (self._event("response.reasoning_summary_text.done", at | {"text": part["text"]})
                      + self._event("response.reasoning_summary_part.done", at | {"part": part}))
        elif item["type"] == "reasoning":
            frames = self._event("response.reasoning_text.done", at | {"text": part["text"]})
        else:
            frames = (self._event("response.output_text.done", at | {"text": part["text"], "logprobs": []})
                      + self._event("response.content_part.done", at | {"part": part}))
        return frames + self._event("response.output_item.done", {"output_index": index, "item": item})

    def _delta(self, kind: str, event: str, text: str) -> str:
        frames = self._into(kind)
        item = self.items[-1]
        _part(item)["text"] += text
        return frames + self._event(event, {"item_id": item["id"], "output_index": len(self.items) - 1,
                                            self._part_index(kind): 0, "delta": text}
                                    | ({"logprobs": []} if kind == "message" else {}))

    def _part_index(self, kind: str) -> str:
        """The field that numbers an item's part its events fill: a summary's, or its content's."""
        return "summary_index" if kind == "reasoning" and self.summarized else "content_index"

    def piece(self, text: str) -> str:
        return self._delta("message", "response.output_text.delta", text)

    def thought(self, text: str) -> str:
        return self._delta("reasoning", "response.reasoning_summary_text.delta" if self.summarized
                           else "response.reasoning_text.delta", text)

    def call(self, call: ToolCall, index: int) -> str:
        frames = self._close()
        item = self._call(call, "completed")
        self.items.append(item)
        self.calls.append(call)
        at = {"item_id": item["id"], "output_index": len(self.items) - 1}
        given, events = ("input", "custom_tool_call_input") if item["type"] == "custom_tool_call" else \
            ("arguments", "function_call_arguments")
        return (frames + self._event("response.output_item.added", {"output_index": at["output_index"],
                                                                     "item": _in_progress(item)})
                + self._event(f"response.{events}.delta", at | {"delta": item[given]})
                + self._event(f"response.{events}.done", at | {given: item[given]})
                + self._event("response.output_item.done", {"output_index": at["output_index"], "item": item}))

    def _call(self, call: ToolCall, status: str) -> dict:
        """A call's output item: a function call, by the name and namespace the client gave its tool, or a custom
        tool's call with its input."""
        told = self.offered.get(call.name, Offered(call.name))
        named = {"name": told.name} | ({"namespace": told.namespace} if told.namespace else {})
        if told.custom:
            return {"type": "custom_tool_call", "id": "ctc_" + uuid.uuid4().hex, "call_id": call.id, **named,
                    "input": str(call.argument_values.get("input", "")), "status": status}
        return {"type": "function_call", "id": "fc_" + uuid.uuid4().hex, "call_id": call.id, **named,
                "arguments": call.arguments, "status": status}

    def error(self, failure: ApiError) -> str:
        return self._event("error", {"code": failure.code, "message": failure.message, "param": failure.param})

    def closing(self, job: Job, called: bool) -> list[str]:
        frames = self._close()
        if not self.items:  # nothing was said: the message is there all the same, empty
            frames += self._into("message") + self._close()
        done = self._finished(job, self.items, self.calls)
        return [frames, self._event(f"response.{done['status']}", {"response": done})]


def _reasoning(text: str, summarized: bool) -> dict:
    """A reasoning item: the thinking as its text, or as its summary (one summary_text)."""
    item = {"type": "reasoning", "id": "rs_" + uuid.uuid4().hex}
    if summarized:
        return item | {"summary": [{"type": "summary_text", "text": text}]}
    return item | {"summary": [], "content": [{"type": "reasoning_text", "text": text}]}


def _part(item: dict) -> dict:
    """The part of an output item its text fills: a message's output_text, a reasoning's text or summary."""
    return item["content"][0] if item.get("content") else item["summary"][0]


def _message(text: str) -> dict:
    return {"type": "message", "id": "msg_" + uuid.uuid4().hex, "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _in_progress(item: dict) -> dict:
    """An item as it is added, before its content: empty, in progress."""
    if item["type"] in ("function_call", "custom_tool_call"):
        return item | {"arguments" if item["type"] == "function_call" else "input": "", "status": "in_progress"}
    if item.get("content") is None:  # (a summary's reasoning)
        return item | {"summary": []}
    return item | {"content": [], **({"status": "in_progress"} if item["type"] == "message" else {})}
