"""Ollama's API beside OpenAI's on the same port: the protocol Open WebUI, Continue and many agent
frameworks speak first. Requests become the service's Request as OpenAI's do; answers are Ollama's
objects (streamed as NDJSON, one object a line), the last with its durations in nanoseconds and
localspec's speculation record. One model is served: any model name is answered by it, as on /v1."""

import hashlib
import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from .. import __version__
from ..config import MOST_LOGPROBS, overridden
from ..errors import UsageError
from ..events import Logprobs, Token
from ..prompts import MEDIA_MARKER, ROLES, output_grammar
from ..request import Request
from ..service import Job
from .. import store
from ..store import GGUFInfo
from ..store import modelfile
from ..store.modelfile import NEUTRAL_OPTIONS, TAKEN_AND_IGNORED, Preset
from ..tool_calls import ToolCall, Tools
from .shared import (ApiError, Answering, Defaults, Parsed, Protocol, Speculative, Tool, answer_of, effort,
                     embedding_inputs, image_bytes, invalid, kept_dimensions, logprobs_of, output_told, speculation,
                     speculative_asked, thinking_asked, token_logprobs)

DONE_REASONS = {"stop": "stop", "length": "length", "context": "length"}


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class Options(_Body):
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    typical_p: float | None = None
    mirostat: int | None = None  # 1 or 2 (0: off), with its target surprise (tau) and learning rate (eta)
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    seed: int | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None  # 0: no penalties; -1: the whole context
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    num_predict: int | None = None  # -1: until the model stops; -2: until the context is full
    stop: list[str] | str | None = None
    draft_num_predict: int | None = Field(None, ge=0, strict=True)  # most tokens drafted a step, for this request


class CalledFunction(_Body):
    name: str
    arguments: dict = Field(default_factory=dict)


class Called(_Body):
    function: CalledFunction


class Message(_Body):
    role: str
    content: str = ""
    images: list | None = None
    tool_calls: list[Called] | None = None  # an assistant's earlier calls
    tool_name: str | None = None  # the tool whose result a tool message is
    thinking: str | None = None  # an assistant's earlier thinking


class _Generation(_Body):
    model: str = ""
    stream: bool = True
    format: str | dict | None = None  # "json", or a JSON schema
    options: Options | None = None
    keep_alive: str | int | float | None = None  # how long the model stays loaded once idle (serve reads it)
    think: bool | str | None = None  # whether a reasoning model thinks; gpt-oss's effort: low, medium, high
    speculative: Speculative | None = None  # this request's own speculation (as on /v1)
    logprobs: bool | None = None  # each token's log probability in the answer
    top_logprobs: int | None = Field(None, ge=0, le=MOST_LOGPROBS)  # and the likeliest tokens' beside it
    debug_render_only: bool = Field(False, alias="_debug_render_only")  # the prompt as read, nothing generated


class ChatBody(_Generation):
    messages: list[Message] = Field(default_factory=list)
    tools: list[Tool] | None = None
    truncate: bool = True  # the oldest turns that do not fit the context are dropped (false: refused)


class GenerateBody(_Generation):
    prompt: str = ""
    system: str | None = None
    raw: bool = False
    images: list | None = None
    suffix: str | None = None
    context: list[StrictInt] | None = None  # (lax, a [true] was read as token 1)
    template: str | None = None  # a Go template of the request's own, which localspec does not render


def body(error: ApiError) -> dict:
    """Ollama's error object."""
    return {"error": error.message}


def _validate(model: type[BaseModel], data: dict):
    try:
        return model.model_validate(data)
    except ValidationError as failure:
        raise invalid(failure) from None


def parse_chat(data: dict, defaults: Defaults) -> Parsed | None:
    """The request, or None where it only asks for the model to be loaded (no messages, as Ollama's API has it)."""
    chat = _validate(ChatBody, data)
    if not chat.messages:
        return None
    messages = []
    for index, message in enumerate(chat.messages):
        if message.role not in (*ROLES, "tool"):
            raise ApiError(400, f"messages.{index}.role: {message.role!r} messages are not supported; use system, user,"
                             " assistant or tool")
        messages.append({"role": message.role, "content": message.content})
        if message.images:
            messages[-1]["images"] = _images(message.images, f"messages.{index}.images")
        if message.thinking is not None and message.role == "assistant":
            messages[-1]["reasoning_content"] = message.thinking
        if message.tool_calls:
            messages[-1]["tool_calls"] = [{"type": "function", "function": call.function.model_dump()}
                                          for call in message.tool_calls]
        if message.tool_name:
            messages[-1]["name"] = message.tool_name
    tools = Tools(tuple(tool.model_dump(exclude_none=True) for tool in chat.tools)) if chat.tools else None
    return replace(_parsed(chat, defaults, messages=messages, tools=tools), fits=chat.truncate)


def parse_generate(data: dict, defaults: Defaults) -> Parsed | None:
    """The request, or None where it only asks for the model to be loaded (an empty prompt)."""
    generate = _validate(GenerateBody, data)
    images = _images(generate.images or [], "images")
    if images and (generate.raw or generate.suffix):
        raise ApiError(400, f"images go in the chat template's turn, which {'raw' if generate.raw else 'a suffix'}"
                       " leaves out", param="images")
    if generate.template:
        raise ApiError(400, "template: Ollama's Go templates are not rendered by localspec, which reads the model's own"
                       " chat template (raw: a prompt laid out by the client)")
    if not generate.prompt:
        return None
    # context: the tokens an earlier answer handed back (deprecated by Ollama, still read): this prompt goes on
    # from them, and the answer hands back the tokens read and written, for the next (not where raw, as Ollama)
    earlier = {"continues": generate.context} if generate.context else {}
    if generate.raw:  # (a suffix too is the client's to have written into the prompt, as Ollama has it)
        return _parsed(generate, defaults, prompt=generate.prompt, **earlier)
    if generate.suffix:  # the model's fill-in-the-middle layout, where Ollama's template spells the same
        return replace(_parsed(generate, defaults, prompt=generate.prompt, suffix=generate.suffix, **earlier),
                       token_ids=True)
    system = [{"role": "system", "content": generate.system}] if generate.system else []
    asked = {"role": "user", "content": generate.prompt} | ({"images": images} if images else {})
    return replace(_parsed(generate, defaults, messages=system + [asked], **earlier), token_ids=True)


def _images(images: list, where: str) -> list[bytes]:
    """Ollama's images: base64 text each (its clients read a file's bytes so)."""
    return [image_bytes(image, f"{where}.{index}") for index, image in enumerate(images)]


def _parsed(request: _Generation, defaults: Defaults, **what) -> Parsed:
    options = request.options or Options()
    for name, value in (options.model_extra or {}).items():
        if value is None:  # (an option left unset, as clients that write every option send it)
            continue
        if name in NEUTRAL_OPTIONS and value not in NEUTRAL_OPTIONS[name]:
            raise ApiError(400, f"options.{name} is not supported by localspec (only {NEUTRAL_OPTIONS[name][0]})")
        if name not in NEUTRAL_OPTIONS and name not in TAKEN_AND_IGNORED:
            raise ApiError(400, f"options.{name} is not an option localspec knows")
    predict = options.num_predict
    if predict is not None and (predict == 0 or predict < -2):
        raise ApiError(400, f"options.num_predict must be a positive count, -1 or -2, got {predict}")
    sampling, limits = overridden(
        defaults.sampling, defaults.limits, temperature=options.temperature, top_k=options.top_k,
        top_p=options.top_p, min_p=options.min_p, typical_p=options.typical_p, mirostat=options.mirostat,
        mirostat_tau=options.mirostat_tau, mirostat_eta=options.mirostat_eta, seed=options.seed,
        stop=options.stop,
        repeat_penalty=options.repeat_penalty, repeat_last_n=options.repeat_last_n,
        presence_penalty=options.presence_penalty, frequency_penalty=options.frequency_penalty,
        logprobs=(request.top_logprobs or 0) if request.logprobs else None,
        max_tokens=predict if predict is not None and predict > 0 else None, grammar=_grammar(request.format))
    if predict is not None and predict < 0:
        limits = replace(limits, max_tokens=None)
    speculative = speculative_asked(request.speculative, defaults)
    if options.draft_num_predict is not None:
        speculative["draft_max"] = options.draft_num_predict
    told = {"response_format": output_told(request.format if isinstance(request.format, dict) else None)} \
        if request.format not in (None, "") and "messages" in what else None
    return Parsed(Request(sampling, limits, thinking=_thinking(request.think, defaults), template_variables=told,
                          **what, **speculative),
                  request.stream, False, renders_only=request.debug_render_only)


def _thinking(think: bool | str | None, defaults: Defaults):
    """Ollama's think: true or false, or an effort ("low", "medium", "high"; "max" is high), over the server's."""
    if isinstance(think, str):
        level = effort(think, "think")
        return thinking_asked(defaults.thinking, level is not None, level)
    return thinking_asked(defaults.thinking, think)


def _grammar(form: str | dict | None) -> str | None:
    if form in (None, ""):
        return None
    if form == "json":
        return output_grammar(any_object=True)
    if isinstance(form, dict):
        return output_grammar(schema=form)
    raise ApiError(400, f"format must be \"json\" or a JSON schema, got {json.dumps(form)}")


class EmbedBody(_Body):
    model: str = ""
    input: str | list[str]
    truncate: bool = True  # an input longer than the context is cut to it (else a 400)
    dimensions: StrictInt | None = None  # the vectors' first that many kept (then normalized; lax, true read as 1)
    options: dict | None = None
    keep_alive: str | int | float | None = None


def parse_embed(data: dict, n_embd: int) -> tuple[list[str], bool, int | None]:
    """/api/embed's inputs, whether to cut those longer than the context, and the dimensions to keep."""
    embed = _validate(EmbedBody, data)
    return embedding_inputs(embed.input), embed.truncate, kept_dimensions(embed.dimensions, n_embd)


class EmbeddingsBody(_Body):
    model: str = ""
    prompt: str
    options: dict | None = None
    keep_alive: str | int | float | None = None


def parse_embeddings(data: dict) -> list[str]:
    """/api/embeddings, Ollama's older route: one prompt (an empty one embeds to an empty vector there)."""
    return [_validate(EmbeddingsBody, data).prompt]


def embedded(model: str, vectors: list[list[float]], tokens: int, nanoseconds: int, load_nanoseconds: int) -> dict:
    """/api/embed's answer: load_nanoseconds, how long the request waited for its model (loaded on demand)."""
    return {"model": model, "embeddings": vectors, "total_duration": nanoseconds, "load_duration": load_nanoseconds,
            "prompt_eval_count": tokens}


class PullBody(_Body):
    model: str
    insecure: bool = False
    stream: bool = True


def parse_pull(data: dict) -> PullBody:
    """What /api/pull asks for: a model by registry name, hf:owner/repo/file.gguf or owner/repo:QUANT."""
    pull = _validate(PullBody, data)
    if not pull.model.strip():
        raise ApiError(400, "model: name the model to pull")
    return pull


class CreateMessage(_Body):
    role: str
    content: str


class CreateBody(_Body):
    model: str = ""
    name: str = ""  # older clients' model
    from_: str | None = Field(None, alias="from")
    modelfile: str | None = None  # older clients send a Modelfile's text
    system: str | None = None
    parameters: dict[str, float | int | bool | str | list[str]] | None = None
    messages: list[CreateMessage] = Field(default_factory=list)
    template: str | None = None
    license: str | list[str] | None = None
    quantize: str | None = None
    files: dict[str, str] | None = None
    adapters: dict[str, str] | None = None
    stream: bool = True


@dataclass(frozen=True)
class Creation:
    """What /api/create asks for: the model to keep, what of the request was left alone, whether to stream."""

    preset: Preset
    notes: list[str]
    stream: bool
    files: dict[str, str]  # uploaded files (name -> digest): the model is made from the GGUF among them
    adapters: dict[str, str]  # uploaded LoRA adapters' files (name -> digest), applied to it


REFUSED_FIELDS = {
    "quantize": "localspec runs a GGUF file as it is quantized: quantize with llama.cpp's llama-quantize first",
}


def parse_create(data: dict) -> Creation:
    """/api/create: the model made field by field (from, or the GGUF file among uploaded files; uploaded LoRA
    adapters; system, parameters, messages, license) as a Modelfile says it, or from an older client's Modelfile
    text."""
    create = _validate(CreateBody, data)
    name = own_name(create.model or create.name, "model")
    for field, why in REFUSED_FIELDS.items():
        if getattr(create, field):
            raise ApiError(400, f"{field}: {why}", param=field)
    notes: list[str] = []
    if create.modelfile is not None:
        preset = modelfile.parse(create.modelfile, name, None, notes)
    elif create.from_ and create.from_.strip() or create.files:
        preset = modelfile.requested(name, (create.from_ or "").strip(), create.system, create.parameters,
                                     [message.model_dump() for message in create.messages], create.license, notes)
    else:
        raise UsageError("from: name the model it is made from (a registry name, a model made so, or a GGUF"
                         " file's path here), or upload its GGUF file (/api/blobs) and name it in files")
    if create.template is not None:
        notes.append(f"template left alone: {modelfile.IGNORED['template']}")
    return Creation(preset, notes, create.stream, create.files or {}, create.adapters or {})


def created(name: str, notes: list[str]) -> list[dict]:
    """/api/create's statuses, as Ollama streams them (the notes between)."""
    return [{"status": "reading model metadata"}, *({"status": f"note: {note}"} for note in notes),
            {"status": f"writing manifest for {name}"}, {"status": "success"}]


class CopyBody(_Body):
    source: str
    destination: str


def parse_copy(data: dict) -> tuple[str, str]:
    """/api/copy: the model to copy, and the name the copy goes by."""
    copy = _validate(CopyBody, data)
    return own_name(copy.source, "source"), own_name(copy.destination, "destination")


class DeleteBody(_Body):
    model: str = ""
    name: str = ""  # older clients' model


def parse_delete(data: dict) -> str:
    delete = _validate(DeleteBody, data)
    return own_name(delete.model or delete.name, "model")


def own_name(name: str, field: str) -> str:
    """A model's name as a request gives it, Ollama's :latest taken off."""
    if not name.strip():
        raise ApiError(400, f"{field}: name the model", param=field)
    return name.strip().removesuffix(":latest")


class Progress:
    """A tqdm-shaped bar (what localspec's downloader reports to) that posts Ollama's pull statuses."""

    def __init__(self, post, *, total=None, initial=0, desc="", **_):
        self.post, self.total, self.completed, self.name = post, total or 0, initial, desc
        self.step = max(self.total // 100, 1)  # a status a percent, not one per block read
        self.posted = -self.step
        self.update(0)

    def update(self, n=1):
        self.completed += n
        if self.completed - self.posted >= self.step or self.completed == self.total:
            self.posted = self.completed
            self.post({"status": f"pulling {self.name}", "digest": self.name, "total": self.total,
                       "completed": self.completed})

    def close(self):
        pass


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


class Answer(Answering):
    """The objects of one answer, whole or streamed (NDJSON: an object a line per piece of text, then the
    final one with the statistics), in /api/chat's shape or /api/generate's."""

    media_type = "application/x-ndjson"

    def __init__(self, chat: bool, model: str, context: bool = False):
        super().__init__(chat, model)
        self.started = time.perf_counter_ns()
        self.load_nanoseconds = 0
        self.context = context  # whether the last object hands back the tokens read and written (/api/generate's)

    def waited_for_model(self, asked: int, loaded: int) -> None:
        """The request, asked at `asked` (perf_counter_ns), had its model at `loaded`: Ollama's load_duration,
        which its total_duration holds too (a model loaded on demand; about nothing for one loaded already)."""
        self.started, self.load_nanoseconds = asked, loaded - asked

    def object(self, text: str, done: bool = False, calls: list[ToolCall] = (), thinking: str = "",
               logprobs: Sequence[Logprobs] | None = None) -> dict:
        """An object of the answer: text (with its tokens' logprobs, where asked for), a reasoning model's
        thinking, and the tool calls it makes (their arguments as objects, as Ollama's are)."""
        if self.chat:
            content = {"message": {"role": "assistant", "content": text} | ({"thinking": thinking} if thinking else {})}
            if calls:
                content["message"]["tool_calls"] = [{"function": {"name": call.name, "arguments": call.argument_values}}
                                                    for call in calls]
        else:
            content = {"response": text} | ({"thinking": thinking} if thinking else {})
        if logprobs is not None:
            content["logprobs"] = token_logprobs(logprobs)
        return {"model": self.model, "created_at": _now(), **content, "done": done}

    def last(self, job: Job, text: str = "", calls: list[ToolCall] = (), thinking: str = "",
             logprobs: Sequence[Logprobs] | None = None) -> dict:
        """The final object: done, why, and the durations and counts Ollama gives, with localspec's record."""
        r = job.recorder
        prefill, decode = int(r.prefill_seconds * 1e9), int(r.decode_seconds * 1e9)
        return self.object(text, done=True, calls=calls, thinking=thinking, logprobs=logprobs) | {
            "done_reason": DONE_REASONS[r.finish_reason], "total_duration": time.perf_counter_ns() - self.started,
            "load_duration": self.load_nanoseconds, "prompt_eval_count": r.prompt_tokens,
            "prompt_eval_duration": prefill, "eval_count": r.tokens, "eval_duration": decode,
            "speculation": speculation(job)} | (
                {"context": job.prompt + r.ids[:len(r.ids) - r.unshown_tokens]} if self.context else {})

    def full(self, job: Job) -> dict:
        asked = job.request.sampling.logprobs is not None
        return self.last(job, *answer_of(job), thinking=job.recorder.reasoning,
                         logprobs=job.recorder.logprobs if asked else None)

    def piece(self, text: str, tokens: Sequence[Token] = ()) -> str:
        return _line(self.object(text, logprobs=logprobs_of(tokens) or None))

    def thought(self, text: str) -> str:
        return _line(self.object("", thinking=text))

    def call(self, call: ToolCall, index: int) -> str:
        return _line(self.object("", calls=[call]))

    def error(self, failure: ApiError) -> str:
        return json.dumps(body(failure)) + "\n"

    def closing(self, job: Job, called: bool) -> list[str]:
        return [_line(self.last(job))]

    def unloaded(self) -> dict:
        """The answer to an empty request with keep_alive 0: the model is unloaded (or was not loaded)."""
        return self.object("", done=True) | {"done_reason": "unload"}

    def rendered(self, prompt: str) -> dict:
        """The answer to _debug_render_only: the prompt as the model reads it, nothing generated (as Ollama's)."""
        return self.object("") | {"debug_info": {"rendered_template": prompt,
                                                 "image_count": prompt.count(MEDIA_MARKER)}}

    def loaded(self) -> dict:
        """The answer to an empty prompt or a chat of no messages (clients send one to load the model): it is loaded."""
        return self.object("", done=True) | {"done_reason": "load"}


def _line(data: dict) -> str:
    return json.dumps(data, ensure_ascii=False) + "\n"


def details(info: GGUFInfo) -> dict:
    return {"parent_model": "", "format": "gguf", "family": info.architecture, "families": [info.architecture],
            "parameter_size": info.parameter_size,
            "quantization_level": info.quantization}


def _entry(name: str, info: GGUFInfo) -> dict:
    stat = info.path.stat()
    modified = datetime.fromtimestamp(stat.st_mtime, timezone.utc).isoformat().replace("+00:00", "Z")
    return {"name": name, "model": name, "modified_at": modified, "size": info.file_size,
            "digest": digest(info.path, stat), "details": details(info)}


BLOB_NAME = re.compile(r"sha256[-:]([0-9a-f]{64})")


def digest(path, stat) -> str:
    """A model file's digest, by which clients tell models apart: an Ollama blob's own (its name is the sha256 of
    its bytes), else one of where the file is, its size and when it last changed (hashing every file's gigabytes
    at each list would take minutes): another for each file, the same while the file is."""
    blob = BLOB_NAME.fullmatch(path.name)
    if blob:
        return blob.group(1)
    return hashlib.sha256(f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()


def tags(models: list[tuple[str, GGUFInfo]]) -> dict:
    """/api/tags: the models that can be served, loaded or not."""
    return {"models": [_entry(name, info) for name, info in models]}


def running(models: list[tuple[str, GGUFInfo, float | None, float]]) -> dict:
    """/api/ps: the models loaded, each with when it will be unloaded unless asked for (time.time(); None:
    not while serve runs) and the share of its layers on GPUs (`ollama ps` shows it as `100% GPU`, `48%/52%
    CPU/GPU` from size_vram)."""
    def expiry(at: float | None) -> str:
        if at is None:
            return "9999-12-31T23:59:59Z"
        return datetime.fromtimestamp(at, timezone.utc).isoformat().replace("+00:00", "Z")

    return {"models": [_entry(name, info) | {"expires_at": expiry(at), "size_vram": round(info.file_size * on_gpu)}
                       for name, info, at, on_gpu in models]}


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}


def duration_seconds(value: str | float) -> float:
    """Ollama's keep_alive: seconds as a number, or a Go duration ("5m", "1h30m", "90s"); negative:
    forever (math.inf). UsageError for anything else."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and re.fullmatch(r"-?\d+(\.\d+)?", value.strip()):
        seconds = float(value)
    elif isinstance(value, str) and value.strip().startswith("-"):
        seconds = -1.0
    elif isinstance(value, str) and value.strip() and re.fullmatch(f"(?:{_DURATION_PART.pattern})+", value.strip()):
        seconds = sum(float(n) * _DURATION_UNITS[unit] for n, unit in _DURATION_PART.findall(value.strip()))
    else:
        seconds = math.nan
    if math.isnan(seconds):  # (JSON's NaN too: compared with anything it is never past, so never unloaded)
        raise UsageError(f"a duration is seconds or a length such as 5m, 1h or 90s (negative: forever), got {value!r}")
    return math.inf if seconds < 0 else seconds


def keep_alive(value) -> float | None:
    """A request's keep_alive in seconds (math.inf: while serve runs); None where it gives none."""
    if value is None:
        return None
    try:
        return duration_seconds(value)
    except UsageError as error:
        raise ApiError(400, f"keep_alive: {error}", param="keep_alive") from None


def show(info: GGUFInfo, template: str | None, made: Preset | None = None, vision: bool = False) -> dict:
    """/api/show: a model's details, capabilities (vision: it reads images, through the projector it was loaded
    with) and chat template; for one made with `create`, its Modelfile, parameters (one a line, as Ollama writes
    them) and system prompt too."""
    model_info = {key: value for key, value in info.metadata.items()
                  if isinstance(value, (str, int, float, bool)) and not key.startswith("tokenizer.chat_template")}
    made_parts = {"modelfile": made.modelfile(), "system": made.system or "", "license": made.license or "",
                  "parameters": "\n".join(f"{name} {value}" for name, value in made.parameters)} if made else {}
    return {"modelfile": "", "parameters": "", "template": template or "", "details": details(info),
            "model_info": model_info,
            "capabilities": store.capabilities(info, template) + (["vision"] if vision else [])} | made_parts


def version() -> dict:
    return {"version": __version__}


class Ollama(Protocol):
    name = "ollama"

    def error_body(self, failure: ApiError) -> dict:
        return body(failure)

    def parse(self, data: dict, chat: bool, defaults: Defaults) -> Parsed | None:
        return (parse_chat if chat else parse_generate)(data, defaults)

    def answering(self, chat: bool, model: str, parsed: Parsed) -> Answer:
        return Answer(chat, model, context=parsed.token_ids)


OLLAMA = Ollama()
