"""The OpenAI API's shapes: requests checked and turned into a Request, responses and stream
chunks built from a finished job. With ollama.py (Ollama's shapes), the modules of serve's that know
pydantic (store/registry.py checks models.toml with it too); it knows no web framework.

Beyond OpenAI's fields every response carries llama-server's `timings` (tools such as llama-swap
read those names) and a `speculation` object: which drafters ran, how many draft tokens were tried
and kept, by position, and what the output is guaranteed to match.
"""

import base64
import json
import struct
import time
import uuid
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .config import Limits, Sampling, overridden
from .errors import ContextOverflow, InputError, LocalspecError, UsageError
from .request import Request
from .service import Busy, Closing, Job, WorkerStopped
from .prompts import ROLES, output_grammar
from .session import Session
from .tool_calls import ToolCall, Tools, ToolStream, UnfinishedCall

# OpenAI's finish reasons: a full context ends a reply the way max_tokens does (as llama-server says).
FINISH_REASONS = {"stop": "stop", "length": "length", "context": "length"}

# Fields that would change the output if honoured, with the values that leave it as it is: a request
# that sets one otherwise is refused instead of silently answered as if it had not.
NEUTRAL = {
    "logprobs": (None, False, 0), "top_logprobs": (None, 0), "logit_bias": (None, {}), "tools": (None, []),
    "tool_choice": (None, "none", "auto"), "functions": (None, []), "function_call": (None, "none", "auto"),
    "presence_penalty": (None, 0), "frequency_penalty": (None, 0),
    "repeat_penalty": (None, 1), "echo": (None, False), "suffix": (None, ""), "best_of": (None, 1),
    "typical_p": (None, 1), "mirostat": (None, 0),
    "audio": (None,), "modalities": (None, ["text"]), "prediction": (None,), "n_probs": (None, 0),
}


class ApiError(Exception):
    """An answer other than 200, as OpenAI's error object."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def api_error(error: LocalspecError, prompt_field: str = "messages") -> ApiError:
    """What the client is told of an error met while serving its request (prompt_field: where the
    request's prompt was, for a prompt too long for the context)."""
    if isinstance(error, Busy):
        return ApiError(429, str(error), "rate_limit_error", code="queue_full",
                        headers={"Retry-After": str(error.retry_after)})
    if isinstance(error, Closing):
        return ApiError(503, str(error), "server_error", code="shutting_down")
    if isinstance(error, WorkerStopped):
        return ApiError(503, str(error), "server_error", code="worker_stopped")
    if isinstance(error, ContextOverflow):
        return ApiError(400, str(error), param=prompt_field, code="context_length_exceeded")
    if isinstance(error, (InputError, UsageError)):
        return ApiError(400, str(error))
    return ApiError(500, str(error), "server_error")


class _Strict(BaseModel):
    # strict: "0.5" is not a number and 1 is not a bool; unknown fields are kept to be looked at
    model_config = ConfigDict(strict=True, extra="allow")


class StreamOptions(_Strict):
    include_usage: bool = False


class ContentPart(_Strict):
    # typed like every other field: a part's type compared as a set member must be a string
    type: str
    text: str | None = None


class Prediction(_Strict):
    type: Literal["content"]
    content: str | list[ContentPart]

    @property
    def text(self) -> str:
        return _text(self.content, "prediction.content", "")


class JsonSchema(_Strict):
    name: str | None = None
    description: str | None = None
    schema_: dict | bool | None = Field(None, alias="schema")
    strict: bool | None = None  # enforced either way: the grammar admits nothing else


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None


class Function(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")  # OpenAI's rule for function names
    description: str | None = None
    parameters: dict | None = None  # a JSON schema of the arguments
    strict: bool | None = None  # enforced either way: the grammar admits only the schema


class Tool(_Strict):
    type: Literal["function"]
    function: Function


class Called(_Strict):
    name: str
    arguments: str  # JSON text


class CalledTool(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: Called


class ChosenFunction(_Strict):
    name: str


class ToolChoice(_Strict):
    type: Literal["function"]
    function: ChosenFunction


class Message(_Strict):
    role: str
    content: str | list[ContentPart] | None = None
    tool_calls: list[CalledTool] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # the call a tool message answers


class _Common(_Strict):
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, lt=1)
    seed: int | None = Field(None, ge=-1)  # -1: a random one, as in llama.cpp
    stop: str | list[str] | None = None
    n: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    prediction: Prediction | None = None
    response_format: ResponseFormat | None = None
    grammar: str | None = None  # llama-server's: GBNF the output must follow
    json_schema: dict | bool | None = None  # llama-server's: a JSON schema the output must follow


class ChatRequest(_Common):
    messages: list[Message]
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoice | None = None
    parallel_tool_calls: bool | None = None


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int]


class EmbeddingRequest(_Strict):
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None


def parse_embeddings(body: dict, n_embd: int) -> EmbeddingRequest:
    request = _validate(EmbeddingRequest, body)
    if request.dimensions not in (None, n_embd):
        raise ApiError(400, f"dimensions: this model's embeddings have {n_embd}, and localspec does not shorten"
                       " them", param="dimensions", code="unsupported_parameter")
    if request.input in ("", []) or isinstance(request.input, list) and any(item in ("", []) for item in request.input):
        raise ApiError(400, "input: an input to embed is empty", param="input")
    return request


def inputs_of(request: EmbeddingRequest) -> list[str | list[int]]:
    """The texts or token id lists to embed, one each."""
    given = request.input
    if isinstance(given, str):
        return [given]
    return checked_count([given] if given and isinstance(given[0], int) else list(given))


# Inputs one embedding request may hold: OpenAI's own limit. 10,000 ran 344 s on a 2-core CPU (issue 46).
MOST_EMBEDDING_INPUTS = 2048


def checked_count(inputs: list) -> list:
    """The inputs, or a 400 where there are more than one request may embed."""
    if len(inputs) > MOST_EMBEDDING_INPUTS:
        raise ApiError(400, f"input: {len(inputs):,} inputs to embed; at most {MOST_EMBEDDING_INPUTS:,} a request"
                       " (send the rest in further requests)", param="input")
    return inputs


def embedding_list(vectors: list[list[float]], tokens: int, model: str, encoding: str) -> dict:
    """OpenAI's answer to /v1/embeddings; base64 is the float32 bytes, as OpenAI's clients ask by default."""
    def encoded(vector: list[float]):
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode() if encoding == "base64" else vector

    return {"object": "list", "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "data": [{"object": "embedding", "index": i, "embedding": encoded(v)} for i, v in enumerate(vectors)]}


@dataclass(frozen=True)
class Defaults:
    """What a request that leaves a field out gets: the server's command-line settings."""

    sampling: Sampling = field(default_factory=Sampling)
    limits: Limits = field(default_factory=Limits)


@dataclass(frozen=True)
class Parsed:
    request: Request
    stream: bool
    include_usage: bool


def parse_chat(body: dict, defaults: Defaults) -> Parsed:
    chat = _validate(ChatRequest, body)
    if not chat.messages:
        raise ApiError(400, "messages is empty: a conversation needs at least one message", param="messages")
    messages = [_message(m, i) for i, m in enumerate(chat.messages)]
    _name_the_calls_answered(messages)
    return _parsed(chat, defaults, chat.max_completion_tokens or chat.max_tokens, messages=messages,
                   tools=_tools(chat))


def _tools(chat: ChatRequest) -> Tools | None:
    if not chat.tools:
        if chat.tool_choice not in (None, "none", "auto"):
            raise ApiError(400, "tool_choice asks for a tool call, but the request offers no tools", param="tool_choice")
        return None
    choice = chat.tool_choice or "auto"
    try:
        return Tools(tuple(tool.model_dump(exclude_none=True) for tool in chat.tools),
                     choice if isinstance(choice, str) else choice.function.name, chat.parallel_tool_calls is not False)
    except InputError as error:
        raise ApiError(400, str(error), param="tools" if "same name" in str(error) else "tool_choice") from None


def _name_the_calls_answered(messages: list[dict]) -> None:
    """A tool message's `name`, from the call it answers: some templates write it (OpenAI's clients
    send only the call's id)."""
    names = {call["id"]: call["function"]["name"] for m in messages for call in m.get("tool_calls", ())}
    for message in messages:
        if message["role"] == "tool" and message.get("tool_call_id") in names:
            message.setdefault("name", names[message["tool_call_id"]])


def parse_completion(body: dict, defaults: Defaults) -> Parsed:
    completion = _validate(CompletionRequest, body)
    prompt = completion.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise ApiError(400, f"prompt holds {len(prompt)} prompts: localspec answers one per request",
                           param="prompt")
        prompt = prompt[0]
    return _parsed(completion, defaults, completion.max_tokens, prompt=prompt)


def _validate(model: type[BaseModel], body: dict):
    try:
        request = model.model_validate(body)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        raise ApiError(400, f"{param}: {first['msg']}" if param else first["msg"], param=param,
                       code=first["type"]) from None
    for name, neutral in NEUTRAL.items():
        value = (request.model_extra or {}).get(name)
        if value not in neutral:
            raise ApiError(400, f"{name} is not supported by localspec", param=name, code="unsupported_parameter")
    return request


def _message(message: Message, index: int) -> dict:
    """A message as chat templates take it; an earlier call's arguments as the object they are (the
    templates write them with `tojson`)."""
    where = f"messages.{index}"
    role = {"developer": "system"}.get(message.role, message.role)
    if role not in (*ROLES, "tool"):
        raise ApiError(400, f"{where}.role: {message.role!r} messages are not supported; use system, developer,"
                       " user, assistant or tool", param=f"{where}.role")
    content = message.content
    if isinstance(content, list):
        content = _text(content, f"{where}.content", "\n")
    if content is None:
        if role != "assistant":
            raise ApiError(400, f"{where}.content is missing", param=f"{where}.content")
        content = ""
    out = {"role": role, "content": content}
    if message.tool_calls:
        if role != "assistant":
            raise ApiError(400, f"{where}.tool_calls: only an assistant's message makes tool calls",
                           param=f"{where}.tool_calls")
        out["tool_calls"] = [{"id": call.id, "type": "function",
                              "function": {"name": call.function.name,
                                           "arguments": _arguments(call.function.arguments, f"{where}.tool_calls.{i}")}}
                             for i, call in enumerate(message.tool_calls)]
    if role == "tool":
        if message.tool_call_id is None:
            raise ApiError(400, f"{where}.tool_call_id is missing: which call this answers",
                           param=f"{where}.tool_call_id")
        out["tool_call_id"] = message.tool_call_id
    return out


def _arguments(text: str, where: str) -> dict:
    try:
        arguments = json.loads(text)
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        raise ApiError(400, f"{where}.function.arguments: not a JSON object", param=f"{where}.function.arguments")
    return arguments


def _text(content: str | list[ContentPart], where: str, joiner: str) -> str:
    """A content field's text: a string, or text parts joined (a message's by lines, a prediction's as is)."""
    if isinstance(content, str):
        return content
    kinds = {part.type for part in content}
    if kinds - {"text"} or any(part.text is None for part in content):
        raise ApiError(400, f"{where}: only text parts are supported, got {sorted(kinds)}", param=where)
    return joiner.join(part.text for part in content)


def _parsed(request: _Common, defaults: Defaults, max_tokens: int | None, **what) -> Parsed:
    if request.n not in (None, 1):
        raise ApiError(400, f"n must be 1: localspec generates one choice per request, got {request.n}", param="n",
                       code="unsupported_parameter")
    asked = {"temperature": request.temperature, "top_p": request.top_p, "top_k": request.top_k,
             "min_p": request.min_p, "seed": request.seed}
    try:
        sampling, limits = overridden(defaults.sampling, defaults.limits, **asked, max_tokens=max_tokens or None,
                                      stop=request.stop, grammar=_grammar(request))
    except UsageError as error:
        raise ApiError(400, f"{error.setting}: {error}" if error.setting else str(error), param=error.setting) from None
    include_usage = bool(request.stream_options and request.stream_options.include_usage)
    prediction = request.prediction.text if request.prediction else None
    return Parsed(Request(sampling, limits, prediction=prediction, **what), bool(request.stream), include_usage)


def _grammar(request: _Common) -> str | None:
    """The GBNF the request's output must follow: from response_format (OpenAI's), grammar or json_schema
    (llama-server's), one of them; None: free text."""
    form = request.response_format if request.response_format and request.response_format.type != "text" else None
    given = [name for name, value in (("response_format", form), ("grammar", request.grammar),
                                      ("json_schema", request.json_schema)) if value is not None]
    if len(given) > 1:
        raise ApiError(400, f"{' and '.join(given)} each constrain the output; give one", param=given[1])
    schema = request.json_schema
    if form is not None and form.type == "json_schema":
        if form.json_schema is None or form.json_schema.schema_ is None:
            raise ApiError(400, "response_format.json_schema.schema is missing: the schema the output must follow",
                           param="response_format.json_schema.schema")
        schema = form.json_schema.schema_
    try:
        return output_grammar(request.grammar, schema, any_object=form is not None and form.type == "json_object")
    except InputError as error:
        raise ApiError(400, str(error), param=given[0], code="invalid_schema") from None


class Reply:
    """The responses to one request, full or as stream chunks, in chat or completion shape."""

    def __init__(self, chat: bool, model: str):
        self.chat = chat
        self.model = model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.prompt_field = "messages" if chat else "prompt"
        self.created = int(time.time())

    def _envelope(self, stream: bool, choices: list) -> dict:
        kind = ("chat.completion" if self.chat else "text_completion") + (".chunk" if stream and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    def full(self, job: Job) -> dict:
        recorder = job.recorder
        content, calls = answer_of(job)
        finish = "tool_calls" if calls else FINISH_REASONS[recorder.finish_reason]
        if self.chat:
            message = {"role": "assistant", "content": content or (None if calls else "")}
            if calls:
                message["tool_calls"] = [_called(call) for call in calls]
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": recorder.text, "logprobs": None, "finish_reason": finish}
        return self._envelope(False, [choice]) | statistics(job, usage=True)

    def chunk(self, text: str | None = None, finish_reason: str | None = None, role: bool = False,
              call: ToolCall | None = None, index: int = 0) -> dict:
        """One piece of the stream: a role (the first chunk of a chat), text, a tool call (the index-th), or
        the finish reason."""
        if self.chat:
            if call is not None:
                delta = {"tool_calls": [{"index": index, **_called(call)}]}
            else:
                delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return self._envelope(True, [choice])

    def last_chunks(self, job: Job, include_usage: bool, called: bool = False) -> list[dict]:
        """The finish reason, then the usage if asked for; the last one carries timings and speculation."""
        finish = "tool_calls" if called else FINISH_REASONS[job.recorder.finish_reason]
        chunks = [self.chunk(finish_reason=finish)]
        if include_usage:
            chunks.append(self._envelope(True, []))
        chunks[-1] |= statistics(job, usage=include_usage)
        return chunks


def _called(call: ToolCall) -> dict:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def tool_reader(job: Job) -> ToolStream | None:
    """What reads the answer's tool calls as it streams, where the model was offered tools to call."""
    tools = job.request.tools
    if not tools or tools.choice == "none" or not job.tool_format:
        return None
    return ToolStream(job.tool_format, required=tools.choice != "auto")


def answer_of(job: Job) -> tuple[str, list[ToolCall]]:
    """A whole answer's content and the tool calls it makes."""
    reader = tool_reader(job)
    if reader is None:
        return job.recorder.text, []
    try:
        pieces = reader.feed(job.recorder.text) + reader.end()
    except InputError as error:
        raise tool_call_error(job, error) from None
    return "".join(p for p in pieces if isinstance(p, str)), [p for p in pieces if isinstance(p, ToolCall)]


def tool_call_error(job: Job, error: InputError) -> ApiError:
    """The answer's calls could not be read: one cut off (by max_tokens, a stop string or a full context),
    or, outside the grammar, one the model got wrong."""
    if isinstance(error, UnfinishedCall):
        return ApiError(400, f"{error} ({job.recorder.tokens} tokens, finish reason {job.recorder.finish_reason});"
                        " raise max_tokens", code="tool_call_unfinished")
    return ApiError(500, str(error), "server_error", code="tool_call_invalid")


def statistics(job: Job, usage: bool) -> dict:
    out = {"usage": usage_of(job)} if usage else {}
    return out | {"timings": timings(job), "speculation": speculation(job)}


def usage_of(job: Job) -> dict:
    r = job.recorder
    return {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.tokens,
            "total_tokens": r.prompt_tokens + r.tokens,
            "prompt_tokens_details": {"cached_tokens": r.reused_prompt_tokens},
            "completion_tokens_details": r.summary().prediction_tokens(job.predicted)}


def timings(job: Job) -> dict:
    """llama-server's timings object, under its names."""
    r = job.recorder
    prompt_n = r.prompt_tokens - r.reused_prompt_tokens
    prompt_ms, predicted_ms = r.prefill_seconds * 1e3, r.decode_seconds * 1e3
    return {"prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": prompt_n / r.prefill_seconds if r.prefill_seconds else 0.0,
            "predicted_n": r.tokens, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / r.tokens if r.tokens else 0.0,
            "predicted_per_second": r.tokens / r.decode_seconds if r.decode_seconds else 0.0,
            "cache_n": r.reused_prompt_tokens, "draft_n": r.drafted, "draft_n_accepted": r.accepted}


def speculation(job: Job) -> dict:
    """The provenance of a response: whether speculation ran, which proposers, what was tried and kept,
    and what the output is expected to match."""
    s = job.recorder.summary()
    shared = job.recorder.shared_steps
    if not s.drafted:
        equivalence = "plain decoding: no draft was verified"
    elif job.request.sampling.greedy:
        equivalence = ("same tokens as plain greedy decoding: each is the target's argmax on its verification"
                       " row (batched and single-token logits can round a near-tie differently)")
    else:
        equivalence = ("same distribution as plain sampling: drafts pass the target's rejection rule, so every"
                       " token follows the target's own distribution (a seed need not give the same text)")
    if shared:
        equivalence += ("; steps shared one batch with other requests' rows, whose logits round otherwise than"
                        " alone: a near-tie may go the other way than with this request alone")
    return {
        "drafting": str(job.drafting) if job.drafting else None,
        "speculated": s.drafted > 0,
        "equivalence": equivalence,
        "steps": s.steps,
        "sequence": job.sequence,  # serve -np's slot (llama-server's id_slot)
        "steps_shared": shared,
        "draft_tokens": s.drafted,
        "accepted_tokens": s.accepted,
        "acceptance_rate": s.acceptance_rate,
        "mean_accepted_length": s.mean_accepted_length,
        "acceptance_by_position": s.per_position_acceptance,
        "drafts_by_position": s.per_position_drafted,
        "estimated_speedup": s.estimated_speedup,
        "drafters": {str(kind): {"steps": t.steps, "draft_tokens": t.drafted, "accepted_tokens": t.accepted,
                                 "probes": t.probes, "probes_lost": t.probes_lost,
                                 "probe_lost_ms": t.probe_lost_seconds * 1e3}
                     for kind, t in s.drafters.items()},
    }


def model_list(models: list[tuple[str, Session | None]], created: int) -> dict:
    """/v1/models: what can be served, by name, with the session of each one loaded (None: loaded when asked)."""
    def meta(session) -> dict:
        if session is None:
            return {"loaded": False}
        draft = session.info.draft
        return {"loaded": True, "draft": draft, "drafting": str(session.default_mode)}

    return {"object": "list", "data": [{"id": name, "object": "model", "created": created, "owned_by": "localspec",
                                        "meta": meta(session)} for name, session in models]}

