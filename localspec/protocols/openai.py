"""OpenAI's API: requests checked and turned into a Request, answers and stream chunks built from a
finished job, errors as OpenAI's error object. It knows pydantic (as ollama.py and store/registry.py do)
and no web framework.

Beyond OpenAI's fields every response carries llama-server's `timings` (tools such as llama-swap
read those names) and a `speculation` object: which drafters ran, how many draft tokens were tried
and kept, by position, and what the output is guaranteed to match.
"""

import base64
import copy
import json
import struct
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from pydantic import BaseModel, Field

from ..config import MOST_LOGPROBS
from ..engine.vision import is_audio
from ..errors import InputError, loads_json
from ..events import Logprobs, Token
from ..prompts import ROLES, output_grammar
from ..request import IMAGE_MARKER, Opening, Request
from ..service import Job
from ..session import Session
from ..tool_calls import ToolCall, Tools
from .shared import (MOST_CHOICES, REASONING_FORMATS, ApiError, Answering, Defaults, Parsed, Protocol, Sampled, Tool,
                     _Typed, answer_of, candidate, effort, embedding_inputs, ended_by, image_bytes, kept_dimensions,
                     logprobs_of, name_the_calls_answered, neutral_or_refused, overridden_or_refused, prompts_of,
                     speculation, speculative_asked, thinking_asked, timings, token_logprobs, validated)


# An answer's thinking, under each name clients read it by: llama-server's and DeepSeek's, and vLLM's, Ollama's and
# OpenRouter's (vLLM dropped the first; clients read one, else the other)
THOUGHT_FIELDS = ("reasoning_content", "reasoning")

# OpenAI's finish reasons: a full context ends a reply the way max_tokens does (as llama-server says).
FINISH_REASONS = {"stop": "stop", "length": "length", "context": "length"}

# Fields that would change the output if honoured, with the values that leave it as it is: a request
# that sets one otherwise is refused instead of silently answered as if it had not.
NEUTRAL = {
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"), "functions": (None, []), "function_call": (None, "none", "auto"),
    "suffix": (None, ""), "best_of": (None, 1),
    "min_keep": (None, 0, 1), "post_sampling_probs": (None, False),
    "audio": (None,), "modalities": (None, ["text"]), "prediction": (None,), "n_probs": (None, 0),
    # vLLM's
    "min_tokens": (None, 0), "include_stop_str_in_output": (None, False), "skip_special_tokens": (None, True),
    "bad_words": (None, []), "allowed_token_ids": (None,), "truncate_prompt_tokens": (None,),
    "use_beam_search": (None, False), "guided_whitespace_pattern": (None,), "stop_token_ids": (None, []),
}
# What vLLM's structured outputs may ask that would change the output, with the values that leave it as it is
NEUTRAL_STRUCTURED = {"structural_tag": (None,), "whitespace_pattern": (None,), "disable_any_whitespace": (None, False)}


class StreamOptions(_Typed):
    include_usage: bool = False


class ImageURL(_Typed):
    url: str
    detail: str | None = None  # (OpenAI's resolution hint: a projector reads every image at its own)


class InputAudio(_Typed):
    # (optional here: a part missing one is refused naming it, not as a content that is no string)
    data: str | None = None  # base64
    format: str | None = None  # wav or mp3 (OpenAI's), flac (libmtmd decodes it too)


class ContentPart(_Typed):
    # typed like every other field: a part's type compared as a set member must be a string
    type: str
    text: str | None = None
    image_url: ImageURL | str | None = None
    input_audio: InputAudio | None = None


class Prediction(_Typed):
    type: Literal["content"]
    content: str | list[ContentPart]

    @property
    def text(self) -> str:
        return _text(self.content, "prediction.content", "")


class JsonSchema(_Typed):
    name: str | None = None
    description: str | None = None
    schema_: dict | bool | None = Field(None, alias="schema")
    strict: bool | None = None  # enforced either way: the grammar admits nothing else


class ResponseFormat(_Typed):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None


class StructuredOutputs(_Typed):
    """vLLM's structured outputs: the output held to a JSON schema (or its JSON text), a regular expression, one of
    the choices, a grammar (xgrammar's EBNF, which is llama.cpp's GBNF), or any JSON object."""

    json_: dict | bool | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    # (held as asked: no property is added where a schema names none; one grammar sampler, no fallback)
    disable_additional_properties: bool | None = None
    disable_fallback: bool | None = None


class Called(_Typed):
    name: str
    arguments: str  # JSON text


class CalledTool(_Typed):
    id: str
    type: Literal["function"] = "function"
    function: Called


class ChosenFunction(_Typed):
    name: str


class ToolChoice(_Typed):
    type: Literal["function"]
    function: ChosenFunction


class Message(_Typed):
    role: str
    content: str | list[ContentPart] | None = None
    tool_calls: list[CalledTool] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # the call a tool message answers
    reasoning_content: str | None = None  # an assistant's earlier thinking (llama-server's and DeepSeek's name)
    reasoning: str | None = None  # (vLLM's and OpenRouter's name for it)


class _Common(Sampled):
    model: str | None = None
    max_tokens: int | None = Field(None, ge=-1)  # (-1: no limit, as LM Studio's examples and Zed send it)
    n_predict: int | None = Field(None, ge=-1)  # (llama-server's, read before max_tokens there too; -1: no limit)
    stop: str | list[str] | None = None
    n: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    prediction: Prediction | None = None
    response_format: ResponseFormat | None = None
    # vLLM's: the prompt's token ids and the answer's beside the text (prompt_token_ids, token_ids)
    return_token_ids: bool = False
    # vLLM's structured outputs, and their older names
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict | bool | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None  # (one grammar sampler here)


class TemplateArguments(_Typed):
    """llama-server's chat_template_kwargs: a reasoning model's switches, read, and whatever else its chat
    template reads, handed on as llama-server does (a date_string, DeepSeek V3.1's thinking)."""

    enable_thinking: bool | None = None
    reasoning_effort: str | None = None


class ChatRequest(_Common):
    messages: list[Message]
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MOST_LOGPROBS)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # a reasoning model's thinking: OpenAI's effort, llama-server's switches, budget and format
    reasoning_effort: str | None = None
    chat_template_kwargs: TemplateArguments | None = None
    enable_thinking: bool | None = None  # (Qwen's API spells the switch so, beside the messages)
    thinking_budget_tokens: int | None = None
    reasoning_budget_tokens: int | None = None
    reasoning_format: str | None = None
    # llama-server's and vLLM's: whether the assistant's turn is opened, and whether the reply goes on from the last
    # message, the assistant's (true: as it says; "content": in its text; "reasoning_content": in its thinking)
    add_generation_prompt: bool | None = None
    continue_final_message: bool | Literal["content", "reasoning_content"] | None = None


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int] | list[list[int]]
    suffix: str | None = None  # the code after the cursor: the model fills in the middle (Ollama's /v1/completions)
    logprobs: int | None = Field(None, ge=0, le=MOST_LOGPROBS)  # the likeliest tokens beside each one
    # the prompt ahead of the completion, its tokens' logprobs ahead of the completion's (lm-eval's
    # loglikelihood tasks read them so)
    echo: bool = False


class EmbeddingRequest(_Typed):
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    embd_normalize: int = Field(2, ge=-1)  # llama-server's: -1 none, 0 max-abs (int16), 2 unit length, p p-norm


def parse_embeddings(body: dict, n_embd: int) -> tuple[EmbeddingRequest, list[str | list[int]]]:
    """The request and the texts or token id lists it asks to embed, one each."""
    request = _validate(EmbeddingRequest, body)
    kept_dimensions(request.dimensions, n_embd)
    return request, embedding_inputs(request.input)


def embedding_list(vectors: list[list[float]], tokens: int, model: str, encoding: str) -> dict:
    """OpenAI's answer to /v1/embeddings; base64 is the float32 bytes, as OpenAI's clients ask by default."""
    def encoded(vector: list[float]):
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode() if encoding == "base64" else vector

    return {"object": "list", "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "data": [{"object": "embedding", "index": i, "embedding": encoded(v)} for i, v in enumerate(vectors)]}


def parse_chat(body: dict, defaults: Defaults) -> Parsed:
    chat = _validate(ChatRequest, body)
    if not chat.messages:
        raise ApiError(400, "messages is empty: a conversation needs at least one message", param="messages")
    messages = [_message(m, i) for i, m in enumerate(chat.messages)]
    name_the_calls_answered(messages)
    form = chat.reasoning_format or defaults.reasoning_format
    if form not in REASONING_FORMATS:
        raise ApiError(400, f"reasoning_format must be one of {', '.join(REASONING_FORMATS)}, got {form!r}",
                       param="reasoning_format")
    if chat.top_logprobs is not None and not chat.logprobs:
        raise ApiError(400, "top_logprobs goes with logprobs: true", param="top_logprobs")
    # (the answer's form as the client asked it, for the templates that tell the model of it)
    told = {"response_format": chat.response_format.model_dump(by_alias=True, exclude_none=True)} \
        if chat.response_format and chat.response_format.type != "text" else {}
    asked = chat.chat_template_kwargs.model_dump(exclude_unset=True) if chat.chat_template_kwargs else {}
    parsed = _parsed(chat, defaults, chat.max_completion_tokens or chat.max_tokens, messages=messages,
                     tools=_tools(chat), thinking=_thinking(chat, defaults), template_variables=(told | asked) or None,
                     logprobs=(chat.top_logprobs or 0) if chat.logprobs else None, opening=_opening(chat))
    return replace(parsed, thinking_apart=form != "none")


def _opening(chat: ChatRequest) -> Opening | None:
    """Where the reply begins, as add_generation_prompt and continue_final_message ask (vLLM's clients send both,
    false and true; llama-server's go on from an assistant's message last without either)."""
    going_on = None if chat.continue_final_message in (None, False) else {
        True: Opening.CONTINUED, "content": Opening.ANSWER, "reasoning_content": Opening.THINKING}[
        chat.continue_final_message]
    if going_on is not None and chat.add_generation_prompt:
        raise ApiError(400, "add_generation_prompt and continue_final_message: the reply either opens a turn of its"
                       " own or goes on in the last message; ask for one", param="add_generation_prompt")
    return going_on or {None: None, True: Opening.NEW, False: Opening.NONE}[chat.add_generation_prompt]


def _thinking(chat: ChatRequest, defaults: Defaults):
    """How a reasoning model is to think: reasoning_effort ("none": not at all), chat_template_kwargs'
    enable_thinking (or Qwen's, beside the messages) and reasoning_effort, a budget of tokens (-1: none), over the
    server's."""
    arguments = chat.chat_template_kwargs or TemplateArguments()
    switch = arguments.enable_thinking if arguments.enable_thinking is not None else chat.enable_thinking
    if None not in (arguments.enable_thinking, chat.enable_thinking) and switch != chat.enable_thinking:
        raise ApiError(400, "enable_thinking and chat_template_kwargs.enable_thinking say two things: give one",
                       param="enable_thinking")
    # enable_thinking true asks for what a thinking model does by default, or turns it on where serve turned it off
    # (--no-think), as llama-server's request does; a model that does not think lets it pass (clients send it to
    # every model), as llama-server's does
    think, level = switch, None
    for where, given in (("reasoning_effort", chat.reasoning_effort),
                         ("chat_template_kwargs.reasoning_effort", arguments.reasoning_effort)):
        if given is not None:
            level = effort(given, where)
            think = think if level is not None else False
    budget = chat.reasoning_budget_tokens if chat.reasoning_budget_tokens is not None else chat.thinking_budget_tokens
    return thinking_asked(defaults.thinking, think, level, budget, if_able=switch is True)


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


def parse_completion(body: dict, defaults: Defaults) -> Parsed:
    completion = _validate(CompletionRequest, body)
    prompt, prompts = prompts_of(completion.prompt, completion.n or 1, "n")
    suffix = completion.suffix or None
    if suffix is not None and not isinstance(prompt, str):
        raise ApiError(400, "suffix goes with a text prompt (the code before the middle to fill in), not token ids",
                       param="suffix")
    if completion.echo and suffix is not None:
        raise ApiError(400, "echo and suffix: the prompt cannot be echoed around a middle", param="echo")
    parsed = replace(_parsed(completion, defaults, completion.max_tokens, prompt=prompt, suffix=suffix,
                             logprobs=completion.logprobs), prompts=prompts)
    if not completion.echo:
        return parsed
    # (the echoed text is the prompt's tokens' pieces, which its logprobs carry, so they are read even unasked)
    sampling = replace(parsed.request.sampling, prompt_logprobs=completion.logprobs or 0)
    return replace(parsed, request=replace(parsed.request, sampling=sampling), echo=True)


def _validate(model: type[BaseModel], body: dict):
    return validated(model, body, NEUTRAL)


def _message(message: Message, index: int) -> dict:
    """A message as chat templates take it; an earlier call's arguments as the object they are (the
    templates write them with `tojson`)."""
    where = f"messages.{index}"
    role = {"developer": "system"}.get(message.role, message.role)
    if role not in (*ROLES, "tool"):
        raise ApiError(400, f"{where}.role: {message.role!r} messages are not supported; use system, developer,"
                       " user, assistant or tool", param=f"{where}.role")
    content, images = message.content, []
    if isinstance(content, list):
        content, images = _text_and_images(content, f"{where}.content")
    if content is None:
        if role != "assistant":
            raise ApiError(400, f"{where}.content is missing", param=f"{where}.content")
        content = ""
    out = {"role": role, "content": content} | ({"images": images} if images else {})
    thought = message.reasoning_content if message.reasoning_content is not None else message.reasoning
    if thought is not None and role == "assistant":
        out["reasoning_content"] = thought
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
        arguments = loads_json(text)
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        raise ApiError(400, f"{where}.function.arguments: not a JSON object", param=f"{where}.function.arguments")
    return arguments


def _text_and_images(content: list[ContentPart], where: str) -> tuple[str, list[bytes]]:
    """A message's parts as its text, by lines, each image_url or input_audio part an IMAGE_MARKER where it stands,
    and the images' and audio files' bytes in order."""
    kinds = {part.type for part in content}
    if kinds - {"text", *MEDIA_PARTS} or any(part.text is None for part in content if part.type == "text"):
        raise ApiError(400, f"{where}: only text, image_url and input_audio parts are supported, got {sorted(kinds)}",
                       param=where)
    media = [_media(part, f"{where}.{index}") for index, part in enumerate(content) if part.type in MEDIA_PARTS]
    return "\n".join(IMAGE_MARKER if part.type in MEDIA_PARTS else part.text for part in content), media


MEDIA_PARTS = ("image_url", "input_audio")
AUDIO_FORMATS = ("wav", "mp3", "flac")


def _media(part: ContentPart, where: str) -> bytes:
    if part.type == "image_url":
        url = part.image_url.url if isinstance(part.image_url, ImageURL) else part.image_url
        return image_bytes(url, f"{where}.image_url")
    if part.input_audio is None:
        raise ApiError(400, f"{where}.input_audio: an input_audio part carries {{\"data\", \"format\"}}",
                       param=f"{where}.input_audio")
    if not part.input_audio.data or part.input_audio.data.startswith(("http://", "https://", "data:")):
        raise ApiError(400, f"{where}.input_audio.data: the audio file's bytes in base64 (not a URL)",
                       param=f"{where}.input_audio.data")
    if part.input_audio.format not in AUDIO_FORMATS:
        raise ApiError(400, f"{where}.input_audio.format: one of {', '.join(AUDIO_FORMATS)}, got"
                       f" {part.input_audio.format!r}", param=f"{where}.input_audio.format")
    audio = image_bytes(part.input_audio.data, f"{where}.input_audio.data")
    if not is_audio(audio):  # (it was refused later as "this model reads no images")
        raise ApiError(400, f"{where}.input_audio.data: no WAV, MP3 or FLAC file (its first bytes are none of them)",
                       param=f"{where}.input_audio.data")
    return audio


def _text(content: str | list[ContentPart], where: str, joiner: str) -> str:
    """A content field's text: a string, or text parts joined (a message's by lines, a prediction's as is)."""
    if isinstance(content, str):
        return content
    kinds = {part.type for part in content}
    if kinds - {"text"} or any(part.text is None for part in content):
        raise ApiError(400, f"{where}: only text parts are supported, got {sorted(kinds)}", param=where)
    return joiner.join(part.text for part in content)


def _parsed(request: _Common, defaults: Defaults, max_tokens: int | None, logprobs: int | None = None,
            **what) -> Parsed:
    choices = 1 if request.n is None else request.n
    if not 1 <= choices <= MOST_CHOICES:
        raise ApiError(400, f"n must be from 1 to {MOST_CHOICES}, got {request.n}", param="n")
    if max_tokens == 0:
        raise ApiError(400, "max_tokens must be a positive count, or -1 for no limit", param="max_tokens")
    most = request.n_predict if request.n_predict is not None else max_tokens or None
    sampling, limits = overridden_or_refused(defaults, **request.sampled(), logprobs=logprobs,
                                             max_tokens=most, stop=request.stop, grammar=_grammar(request))
    include_usage = bool(request.stream_options and request.stream_options.include_usage)
    prediction = request.prediction.text if request.prediction else None
    return Parsed(Request(sampling, limits, prediction=prediction, **what,
                          **speculative_asked(request.speculative, defaults), **request.adapted()),
                  bool(request.stream), include_usage, choices=choices, token_ids=request.return_token_ids)


def _grammar(request: _Common) -> str | None:
    """The GBNF the request's output must follow: from response_format (OpenAI's), grammar or json_schema
    (llama-server's), structured_outputs or guided_* (vLLM's), one of them; None: free text."""
    form = request.response_format if request.response_format and request.response_format.type != "text" else None
    vllms = _structured(request)
    given = [name for name, value in (("response_format", form), ("grammar", request.grammar),
                                      ("json_schema", request.json_schema)) if value is not None] + list(vllms)
    if len(given) > 1:
        raise ApiError(400, f"{' and '.join(given)} each constrain the output; give one", param=given[1])
    schema = request.json_schema
    if form is not None and form.type == "json_schema":
        if form.json_schema is None or form.json_schema.schema_ is None:
            raise ApiError(400, "response_format.json_schema.schema is missing: the schema the output must follow",
                           param="response_format.json_schema.schema")
        schema = form.json_schema.schema_
    try:
        if vllms:
            return output_grammar(**vllms[given[0]])
        return output_grammar(request.grammar, schema, any_object=form is not None and form.type == "json_object")
    except InputError as error:
        raise ApiError(400, str(error), param=given[0], code="invalid_schema") from None


def _structured(request: _Common) -> dict[str, dict]:
    """vLLM's structured outputs the request asks for, by field: output_grammar's arguments for each."""
    outputs = request.structured_outputs
    if outputs is not None:
        neutral_or_refused(outputs, NEUTRAL_STRUCTURED, where="structured_outputs.")
    kinds = ("json", "regex", "choice", "grammar")
    asked = {(f"guided_{kind}", kind): getattr(request, f"guided_{kind}") for kind in kinds}
    if outputs is not None:
        asked |= {(f"structured_outputs.{kind}", kind): getattr(outputs, "json_" if kind == "json" else kind)
                  for kind in (*kinds, "json_object")}
    arguments = {}
    for (name, kind), value in asked.items():
        if value is None or value is False and kind == "json_object":
            continue
        if kind == "json" and isinstance(value, str):
            try:
                value = loads_json(value)
            except (ValueError, RecursionError) as error:
                raise ApiError(400, f"{name}: not a JSON schema: {error}", param=name) from None
        arguments[name] = {"json": {"schema": value}, "regex": {"regex": value}, "choice": {"choices": value},
                           "grammar": {"grammar": value}, "json_object": {"any_object": True}}[kind]
    return arguments


class Reply(Answering):
    """The responses to one request, full or as server-sent events, in chat or completion shape: a role
    chunk (chat), a chunk per piece of text or tool call, the finish reason (and the usage), [DONE].
    token_ids (vLLM's return_token_ids): the prompt's token ids (a chat's beside its choices, a completion's in
    its choice) and each choice's own (the thinking's too, and the end-of-generation token that ended it, as
    vLLM's), streamed as each chunk's ids, the prompt's with the first."""

    media_type = "text/event-stream"
    keepalive = ": reading the prompt\n\n"
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

    def __init__(self, chat: bool, model: str, include_usage: bool = False, thinking_apart: bool = True,
                 echo: bool = False, per_prompt: int = 1, token_ids: bool = False):
        """echo: a completion's prompt comes ahead of it (the recorder's prompt_logprobs carry its tokens);
        per_prompt: the choices of each prompt (n), which read it once."""
        super().__init__(chat, model)
        self.include_usage, self.thinking_apart, self.echo = include_usage, thinking_apart, echo
        self.per_prompt = per_prompt
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.offset = 0  # characters of the completion's text whose tokens' logprobs were given
        self.index = 0  # the choice its chunks are of (choice() makes the others' replies)
        self.token_ids = token_ids
        self.prompt_ids: list[int] | None = None  # the prompt's, until a streamed chunk carries them

    def _envelope(self, stream: bool, choices: list) -> dict:
        kind = ("chat.completion" if self.chat else "text_completion") + (".chunk" if stream and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    def full(self, job: Job) -> dict:
        recorder = job.recorder
        content, calls = answer_of(job)
        finish = "tool_calls" if calls else FINISH_REASONS[recorder.finish_reason]
        if self.chat:
            thought = recorder.reasoning
            if thought and not self.thinking_apart:
                content, thought = thought + content, ""
            message = {"role": "assistant", "content": content or (None if calls else "")}
            if thought:
                message |= dict.fromkeys(THOUGHT_FIELDS, thought)
            if calls:
                message["tool_calls"] = [_called(call) for call in calls]
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": self._echoed(job) + recorder.text, "logprobs": None,
                      "finish_reason": finish}
        if job.request.sampling.logprobs is not None:
            self.offset = 0
            choice["logprobs"] = self._logprobs([*(recorder.prompt_logprobs if self.echo else ()), *recorder.logprobs])
        whole = self._envelope(False, [choice]) | statistics(job, usage=True)
        if self.token_ids:
            choice["token_ids"] = recorder.ids + ended_by(job)
            (whole if self.chat else choice)["prompt_token_ids"] = job.prompt
        return whole

    def _echoed(self, job: Job) -> str:
        """The prompt, where it is echoed: as sent, or the text of its token ids."""
        if not self.echo:
            return ""
        if isinstance(job.request.prompt, str):
            return job.request.prompt
        return b"".join(entry.chosen.piece for entry in job.recorder.prompt_logprobs).decode("utf-8", errors="replace")

    def choices(self, jobs: list[Job]) -> dict:
        """n whole answers, a choice each at its index with its own timings and speculation record (a choice
        that took the first's cells read one prompt token); the usage of them all, the prompt counted once
        (it was read once)."""
        answers = [self.full(job) for job in jobs]
        whole = answers[0] | {"usage": usage_of_all(jobs, self.per_prompt)}
        whole["choices"] = [answer["choices"][0] | {"index": index, "timings": answer["timings"],
                                                    "speculation": answer["speculation"]}
                            for index, answer in enumerate(answers)]
        return whole

    def _logprobs(self, entries: Sequence[Logprobs]) -> dict:
        """Tokens' logprobs in chat's shape, or in completions' (whose text offsets go on from the last piece's)."""
        if self.chat:
            return {"content": token_logprobs(entries), "refusal": None}
        texts = [e.chosen.piece.decode("utf-8", errors="replace") for e in entries]
        offsets = []
        for text in texts:
            offsets.append(self.offset)
            self.offset += len(text)
        return {"tokens": texts, "token_logprobs": [e.chosen.logprob for e in entries],
                # (an echoed prompt's first token has none: nothing before it predicts it)
                "top_logprobs": [{candidate(c)["token"]: c.logprob for c in e.top} if e.chosen.logprob is not None
                                 else None for e in entries],
                "text_offset": offsets}

    def chunk(self, text: str | None = None, finish_reason: str | None = None, role: bool = False,
              call: ToolCall | None = None, index: int = 0, thought: str | None = None,
              logprobs: Sequence[Logprobs] = (), token_ids: Sequence[int] = ()) -> dict:
        """One piece of the stream: a role (the first chunk of a chat), text (with its tokens' logprobs, where
        asked for, and ids), a tool call (the index-th), a piece of thinking (as llama-server streams it:
        reasoning_content, no content), or the finish reason; the first with the prompt's ids, where asked for."""
        if self.chat:
            if call is not None:
                delta = {"tool_calls": [{"index": index, **_called(call)}]}
            elif thought is not None:
                delta = dict.fromkeys(THOUGHT_FIELDS, thought) if self.thinking_apart else {"content": thought}
            else:
                delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
            choice = {"index": self.index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": self.index, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        if logprobs:
            choice["logprobs"] = self._logprobs(logprobs)
        envelope = self._envelope(True, [choice])
        if self.token_ids:
            choice["token_ids"] = list(token_ids)
            if self.prompt_ids is not None:
                (envelope if self.chat else choice)["prompt_token_ids"], self.prompt_ids = self.prompt_ids, None
        return envelope

    def opening(self, job: Job) -> list[str]:
        """A chat's role; an echoed completion's prompt (its tokens' logprobs with it, where asked for)."""
        if self.token_ids:
            self.prompt_ids = job.prompt
        if self.chat:
            return [_event(self.chunk(role=True))]
        if not self.echo:
            return []
        asked = job.request.sampling.logprobs is not None
        return [_event(self.chunk(self._echoed(job), logprobs=job.recorder.prompt_logprobs if asked else ()))]

    def piece(self, text: str, tokens: Sequence[Token] = ()) -> str:
        return _event(self.chunk(text, logprobs=logprobs_of(tokens), token_ids=[token.id for token in tokens]))

    def thought(self, text: str) -> str:
        return _event(self.chunk(thought=text))

    def call(self, call: ToolCall, index: int) -> str:
        return _event(self.chunk(call=call, index=index))

    def error(self, failure: ApiError) -> str:
        return _event(failure.body())

    def closing(self, job: Job, called: bool) -> list[str]:
        """The finish reason, then the usage if asked for; the last one carries timings and speculation."""
        finish = "tool_calls" if called else FINISH_REASONS[job.recorder.finish_reason]
        chunks = [self.chunk(finish_reason=finish, token_ids=ended_by(job))]
        if self.include_usage:
            chunks.append(self._envelope(True, []))
        chunks[-1] |= statistics(job, usage=self.include_usage)
        return [*map(_event, chunks), "data: [DONE]\n\n"]

    def choice(self, index: int) -> "Reply":
        """The reply whose chunks are of the index-th choice (n > 1, streamed): the same id and model."""
        other = copy.copy(self)
        other.index, other.offset = index, 0
        return other

    def finish(self, job: Job, called: bool) -> list[str]:
        """One of several choices ends (n > 1, streamed): its finish reason, with its timings and speculation."""
        finish = "tool_calls" if called else FINISH_REASONS[job.recorder.finish_reason]
        return [_event(self.chunk(finish_reason=finish, token_ids=ended_by(job)) | statistics(job, usage=False))]

    def ended(self, jobs: list[Job]) -> list[str]:
        """Every choice has ended: the usage of them all if asked for (the prompt counted once), then [DONE]."""
        if not self.include_usage:
            return ["data: [DONE]\n\n"]
        return [_event(self._envelope(True, []) | {"usage": usage_of_all(jobs, self.per_prompt)}), "data: [DONE]\n\n"]


def _event(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def _called(call: ToolCall) -> dict:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def statistics(job: Job, usage: bool) -> dict:
    out = {"usage": usage_of(job)} if usage else {}
    return out | {"timings": timings(job), "speculation": speculation(job)}


def usage_of(job: Job) -> dict:
    r = job.recorder
    return {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.tokens,
            "total_tokens": r.prompt_tokens + r.tokens,
            "prompt_tokens_details": {"cached_tokens": r.reused_prompt_tokens},
            "completion_tokens_details": r.summary().prediction_tokens(job.predicted)
            | {"reasoning_tokens": r.parts["thinking"].tokens}}


def usage_of_all(jobs: list[Job], per_prompt: int) -> dict:
    """The usage of several choices, per_prompt of each prompt in turn: the first's, its prompt tokens those of
    each prompt's first choice (the others took its cells), its completion tokens those of them all."""
    usage = usage_of(jobs[0])
    prompt = sum(job.recorder.prompt_tokens for job in jobs[::per_prompt])
    completion = sum(job.recorder.tokens for job in jobs)
    return usage | {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def model_object(name: str, session: Session | None, created: int) -> dict:
    """/v1/models/{id}: a model that can be served, with its session where it is loaded (None: loaded when
    asked)."""
    meta = ({"loaded": True, "draft": session.info.draft, "drafting": str(session.default_mode)} if session
            else {"loaded": False})
    return {"id": name, "object": "model", "created": created, "owned_by": "localspec", "meta": meta}


def model_list(models: list[tuple[str, Session | None]], created: int) -> dict:
    """/v1/models: what can be served, by name."""
    return {"object": "list", "data": [model_object(name, session, created) for name, session in models]}



# What a transcription asks the model, as llama-server asks it (common_chat_get_asr_prompt): LFM2-Audio's template
# takes its own system prompt and no words of the user's
ASR_ASKED = "Transcribe audio to text"
ASR_LFM2 = "Perform ASR."
TRANSCRIPTION_FIELDS = {"model", "file", "prompt", "language", "response_format", "stream", "max_tokens", "temperature"}


def transcription_chat(fields: dict[str, str], audio: bytes | None, template: str | None) -> dict:
    """/v1/audio/transcriptions' form (its fields as text, the file's bytes) as the chat request llama-server makes
    of it: the prompt (else "Transcribe audio to text"), the language named after it, the audio where it ends."""
    if audio is None:
        raise ApiError(400, "file: a transcription needs the audio file (multipart form field \"file\")", param="file")
    unknown = set(fields) - TRANSCRIPTION_FIELDS
    if unknown:
        raise ApiError(400, f"{sorted(unknown)[0]} is not supported by localspec", param=sorted(unknown)[0],
                       code="unsupported_parameter")
    if fields.get("response_format", "json") != "json":
        raise ApiError(400, "response_format: only json is supported (the text and its usage)", param="response_format")
    # (llama.cpp's is_lfm2_template: the tool list's markers)
    lfm2 = template is not None and "<|tool_list_start|>" in template and "<|tool_list_end|>" in template
    asked = fields.get("prompt") or ("" if lfm2 else ASR_ASKED)
    if fields.get("language"):
        asked += f" (language: {fields['language']})"
    content = [{"type": "text", "text": asked}] if asked else []
    content.append({"type": "input_audio", "input_audio": {"data": base64.b64encode(audio).decode(), "format": "wav"}})
    body: dict = {"messages": ([{"role": "system", "content": ASR_LFM2}] if lfm2 else []) + [
        {"role": "user", "content": content}], "stream": fields.get("stream", "false") == "true"}
    for name, kind in (("max_tokens", int), ("temperature", float)):
        if name in fields:
            try:
                body[name] = kind(fields[name])
            except ValueError:
                raise ApiError(400, f"{name}: not a number: {fields[name]!r}", param=name) from None
    return body


class Transcript(Answering):
    """/v1/audio/transcriptions' answer, as llama-server's and OpenAI's: {"text", "usage"} whole, or server-sent
    transcript.text.delta events and a transcript.text.done."""

    media_type = "text/event-stream"
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

    def full(self, job: Job) -> dict:
        return ({"type": "transcript.text.done", "text": answer_of(job)[0], "usage": self._usage(job)}
                | statistics(job, usage=False))

    def piece(self, text: str, tokens: Sequence[Token] = ()) -> str:
        return _event({"type": "transcript.text.delta", "delta": text})

    def thought(self, text: str) -> str:
        return ""  # (a transcript is the answer alone)

    def call(self, call: ToolCall, index: int) -> str:
        return ""

    def error(self, failure: ApiError) -> str:
        return _event(failure.body())

    def closing(self, job: Job, called: bool) -> list[str]:
        return [_event(self.full(job)), "data: [DONE]\n\n"]

    @staticmethod
    def _usage(job: Job) -> dict:
        r = job.recorder
        return {"type": "tokens", "input_tokens": r.prompt_tokens, "output_tokens": r.tokens,
                "total_tokens": r.prompt_tokens + r.tokens,
                "input_tokens_details": {"cached_tokens": r.reused_prompt_tokens}}


class OpenAI(Protocol):
    name = "openai"

    def error_body(self, failure: ApiError) -> dict:
        return failure.body()

    def parse(self, body: dict, chat: bool, defaults: Defaults) -> Parsed:
        return (parse_chat if chat else parse_completion)(body, defaults)

    def answering(self, chat: bool, model: str, parsed: Parsed) -> Reply:
        return Reply(chat, model, parsed.include_usage, parsed.thinking_apart, parsed.echo, parsed.choices,
                     parsed.token_ids)


OPENAI = OpenAI()
