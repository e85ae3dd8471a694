"""What every protocol serve speaks shares: the error a request is answered with, the defaults and the
parsed request, the tools' definitions, reading an answer's tool calls, and the numbers every protocol's
answer carries (llama-server's timings, localspec's speculation record). Each protocol (openai.py,
ollama.py) is a Protocol object: how its requests are read, how its answers are made whole or streamed,
how its errors look."""

import base64
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..config import EFFORTS, DrafterKind, Limits, Sampling, Thinking, overridden
from ..errors import ContextOverflow, InputError, LocalspecError, UsageError
from ..engine.drafters.spec import FIXED_MODES
from ..events import Candidate, Logprobs, Reading, Token
from ..request import Request
from ..service import Busy, Closing, Job, WorkerStopped
from ..session import Session
from ..tool_calls import ToolCall, ToolStream, UnfinishedCall


class ApiError(Exception):
    """An answer other than 200, as OpenAI's error object."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# answers one request may ask for (OpenAI's n, llama-server's n_cmpl, times the prompts it lists); each takes a
# sequence while it runs
MOST_CHOICES = 16


def prompts_of(prompt, n: int, n_name: str) -> tuple:
    """A completion's first prompt, and all of them where it lists several (texts or token-id lists: Parsed.prompts),
    each to be answered n times; a 400 beyond MOST_CHOICES answers."""
    if not (isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list))):
        return prompt, ()
    if len(prompt) * n > MOST_CHOICES:
        raise ApiError(400, f"prompt holds {len(prompt)} prompts, and {n_name} is {n}: at most {MOST_CHOICES} answers"
                       " a request", param="prompt")
    return prompt[0], tuple(prompt) if len(prompt) > 1 else ()


# an image a request names by URL, as llama-server fetches one: at most this many bytes, within this many seconds
MOST_IMAGE_BYTES = 10 << 20
IMAGE_SECONDS = 10


def image_bytes(value, where: str) -> bytes:
    """An image a request carries: a data: URL (data:image/png;base64,...), plain base64 (Ollama's), or an http(s)
    URL, fetched (on the parsing thread) as llama-server fetches one; a 400 naming the field otherwise."""
    if not isinstance(value, str) or not value:
        raise ApiError(400, f"{where}: an image is a data: URL, an http(s) URL or base64 text", param=where)
    if value.startswith(("http://", "https://")):
        return _fetched_image(value, where)
    if value.startswith("data:"):
        header, comma, value = value.partition(",")
        if not comma or not header.endswith(";base64"):
            raise ApiError(400, f"{where}: a data: URL of an image is base64 (data:image/png;base64,...)", param=where)
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise ApiError(400, f"{where}: not base64 text", param=where) from None


def _fetched_image(url: str, where: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=IMAGE_SECONDS) as response:
            data = response.read(MOST_IMAGE_BYTES + 1)
    except (OSError, ValueError) as error:  # (urllib's HTTPError and URLError are OSErrors)
        raise ApiError(400, f"{where}: could not fetch {url} ({getattr(error, 'reason', None) or error})",
                       param=where) from None
    if len(data) > MOST_IMAGE_BYTES:
        raise ApiError(400, f"{where}: the image at {url} is over {MOST_IMAGE_BYTES >> 20} MB", param=where)
    return data


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
        return ApiError(400, str(error), param=getattr(error, "setting", None))
    return ApiError(500, str(error), "server_error")


def rendered(session: Session, asked: Request) -> str:
    """The prompt a request is read as, as text (its start token left for the tokenizer to add)."""
    try:
        tokens = session.prompts.prepare(asked).tokens
    except LocalspecError as error:
        raise api_error(error) from None
    prompts = session.prompts
    return prompts.shown(tokens[1:] if tokens[:1] == [prompts.model.bos] else tokens)


class _Typed(BaseModel):
    # strict: "0.5" is not a number and 1 is not a bool; unknown fields are kept to be looked at
    model_config = ConfigDict(strict=True, extra="allow")


class Function(_Typed):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")  # OpenAI's rule for function names
    description: str | None = None
    parameters: dict | None = None  # a JSON schema of the arguments
    strict: bool | None = None  # enforced either way: the grammar admits only the schema


class Tool(_Typed):
    type: Literal["function"]
    function: Function


# llama-server's --reasoning-format: a reasoning model's thinking apart from its content (auto, deepseek) or in it
REASONING_FORMATS = ("auto", "deepseek", "none")


@dataclass(frozen=True)
class Defaults:
    """What a request that leaves a field out gets: the server's command-line settings."""

    sampling: Sampling = field(default_factory=Sampling)
    limits: Limits = field(default_factory=Limits)
    thinking: Thinking = field(default_factory=Thinking)
    reasoning_format: str = "auto"
    fixed: DrafterKind = DrafterKind.NGRAM  # what a request's speculative mode "fixed" drafts with, unless it says
    template_variables: dict = field(default_factory=dict)  # --chat-template-kwargs: under every chat's own


class Speculative(_Typed):
    """A request's own speculation (llama-server's users ask for it most): off, auto, or fixed drafting with one
    drafter (`draft`: ngram, draft, mtp, ...: every mode of one drafter), up to draft_max tokens a step."""

    mode: Literal["off", "auto", "fixed"] | None = None
    draft: Literal[FIXED_MODES] | None = None
    draft_max: int | None = Field(None, ge=0)


class LoraScale(_Typed):
    """One adapter's scale for a request (llama-server's `lora` entries; GET /lora-adapters lists the ids)."""

    id: int
    scale: float


DRY = ("dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers")
XTC = ("xtc_probability", "xtc_threshold")
ROW_SHAPED = ("typical_p", "dynatemp_range", "dynatemp_exponent", "top_n_sigma")
MIROSTAT = ("mirostat", "mirostat_tau", "mirostat_eta")


class Sampled(_Typed):
    """The sampling fields OpenAI's requests and llama-server's share (its names for the penalties, grammar and
    json_schema among them), and a request's own speculation."""

    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, lt=1)
    seed: int | None = Field(None, ge=-1)  # -1: a random one, as in llama.cpp
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repeat_penalty: float | None = Field(None, gt=0)
    repetition_penalty: float | None = Field(None, gt=0)  # (vLLM's, TGI's and OpenRouter's name for it)
    repeat_last_n: int | None = Field(None, ge=-1)
    # OpenAI's {"token id": bias}, or llama-server's [[token id or text, bias or false], ...] or {"id or text":
    # ...}: a text biases each token of its spelling, false bans the token
    logit_bias: dict[str, float | bool] | list[list[int | str | float | bool]] | None = None
    ignore_eos: bool | None = None  # (llama-server's and vLLM's) write on until a limit, never ending
    # llama-server's DRY (a repeat's continuation penalised, the longer the repeat the more)
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = Field(None, ge=0)
    dry_penalty_last_n: int | None = Field(None, ge=-1)
    dry_sequence_breakers: list[str] | None = None
    # llama-server's XTC (the likeliest candidates left out, at a chance a token)
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    typical_p: float | None = None  # (llama-server's and vLLM's) locally typical sampling
    dynatemp_range: float | None = None  # (llama-server's) a temperature by each row's entropy
    dynatemp_exponent: float | None = None
    top_n_sigma: float | None = None  # (llama-server's) the logits within n standard deviations of the highest
    # (llama-server's) mirostat 1 or 2, its target surprise in bits and its learning rate
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    grammar: str | None = None  # GBNF the output must follow
    json_schema: dict | bool | None = None  # a JSON schema the output must follow
    speculative: Speculative | None = None  # this request's own speculation
    lora: list[LoraScale] | None = None  # the LoRA adapters' scales for this request (llama-server's)

    def adapted(self) -> dict:
        """The request's LoRA scales as Request's field (none where it names none)."""
        return {} if self.lora is None else {"lora": {entry.id: entry.scale for entry in self.lora}}

    def sampled(self) -> dict:
        """The fields as overridden() takes them."""
        if None not in (self.repeat_penalty, self.repetition_penalty) and self.repeat_penalty != self.repetition_penalty:
            raise ApiError(400, "repeat_penalty and repetition_penalty are one setting: give one",
                           param="repetition_penalty")
        return {name: getattr(self, name) for name in ("temperature", "top_p", "top_k", "min_p", "seed",
                                                       "presence_penalty", "frequency_penalty",
                                                       "repeat_last_n", "logit_bias", "ignore_eos", *DRY, *XTC, *ROW_SHAPED,
                                                       *MIROSTAT)} | {
            "repeat_penalty": self.repetition_penalty if self.repeat_penalty is None else self.repeat_penalty}


def speculative_asked(asked: Speculative | None, defaults: Defaults) -> dict:
    """A request's speculation as Request's fields (none where it asks for none)."""
    if asked is None:
        return {}
    if asked.draft is not None and asked.mode not in (None, "fixed"):
        raise ApiError(400, f"speculative.draft names a drafter to draft with always: it goes with mode \"fixed\","
                       f" not {asked.mode!r}", param="speculative.draft")
    drafting = {"off": DrafterKind.PLAIN, "auto": DrafterKind.AUTO, None: None}.get(asked.mode, defaults.fixed)
    if asked.draft is not None:
        drafting = DrafterKind(asked.draft)
    return {"drafting": drafting, "draft_max": asked.draft_max}


@dataclass(frozen=True)
class Parsed:
    """thinking_apart: a reasoning model's thinking is answered apart from its content (reasoning_content,
    Ollama's thinking), not in it; thinking_shown: answered at all (Anthropic's display "omitted" leaves it out);
    carried: the conversation a later request may go on from, without this request's own instructions
    (OpenAI's Responses)."""

    request: Request
    stream: bool
    include_usage: bool
    thinking_apart: bool = True
    thinking_shown: bool = True
    carried: list[dict] | None = None
    # OpenAI's Responses: the tools the model is offered otherwise than the client named them (a namespace's function,
    # a custom tool), by the model's name: how to name its calls back (responses.Offered)
    offered: dict | None = None
    # OpenAI's Responses: the thinking answered as the reasoning's summary (a summary asked for: Codex asks so, and
    # shows only a summary), as Ollama answers it; else as its text
    summarized: bool = False
    choices: int = 1  # answers to make of each prompt (OpenAI's n)
    # OpenAI's completions: the prompts of a request that lists several, answered in one response, the
    # choices of each in turn (empty: the request's own prompt alone)
    prompts: tuple = ()
    made: str | None = None  # the model made with `create` that the request named: OpenAI's answers name it
    fields: tuple[str, ...] = ()  # the answer's fields a request names (llama-server's response_fields): all if none
    reads_ahead: bool = False  # only the prompt's reading was asked for (llama-server's n_predict 0)
    shows_reading: bool = False  # a stream shows a long prompt's reading as it goes (llama-server's return_progress)
    # a conversation's oldest turns that leave no room for the answer are dropped (Ollama's truncate, the Responses
    # API's truncation auto)
    fits: bool = False
    renders_only: bool = False  # the prompt as read is the answer, nothing generated (Ollama's _debug_render_only)
    echo: bool = False  # the prompt ahead of the completion (OpenAI's echo)
    # the answer lists the ids of its tokens (llama-server's return_tokens, vLLM's return_token_ids; Ollama's
    # context, the prompt's first)
    token_ids: bool = False


_BASIC_TAGS = {"str", "int", "float", "bool", "none", "bytes"}


def _is_union_tag(part) -> bool:
    """Whether a part of pydantic's error location names a union's member type (`str`, `list[ContentPart]`,
    `ImageURL`) rather than a field or an index: API fields are lower-case names."""
    return isinstance(part, str) and (part in _BASIC_TAGS or "[" in part or part[:1].isupper())


def invalid(error: ValidationError) -> ApiError:
    """A 400 naming what is wrong with a body, by its path (`messages.0.content.1.image_url.url`). Where a value
    fits none of a union's members, the member that got furthest says what is wrong (a content part's missing
    field, not that the content is no string), and the members' type names are left out of the path."""
    errors = error.errors(include_url=False)
    first, at = errors[0], len(errors[0]["loc"])
    if at and _is_union_tag(first["loc"][-1]):
        members = [e for e in errors if e["loc"][: at - 1] == first["loc"][: at - 1] and len(e["loc"]) >= at
                   and _is_union_tag(e["loc"][at - 1])]
        first = max(members, key=lambda e: len(e["loc"]))
    where = ".".join(str(part) for part in first["loc"] if not _is_union_tag(part))
    return ApiError(400, f"{where}: {first['msg']}" if where else first["msg"], param=where or None,
                    code=first["type"])


def validated(model: type[BaseModel], body: dict, neutral: dict,
              refusal: str = "{name} is not supported by localspec"):
    """The body read as the model (a 400 naming the first field that is wrong), with each field of `neutral`
    left out or at one of its values (else a 400 saying `refusal`)."""
    try:
        asked = model.model_validate(body)
    except ValidationError as error:
        raise invalid(error) from None
    neutral_or_refused(asked, neutral, refusal)
    return asked


def neutral_or_refused(asked: BaseModel, neutral: dict, refusal: str = "{name} is not supported by localspec",
                       where: str = "") -> None:
    """A 400 saying `refusal` where a field of `neutral` that the model does not read is set other than to one of
    its values (where: the path to the model's fields, `structured_outputs.`)."""
    for name, values in neutral.items():
        if (asked.model_extra or {}).get(name) not in values:
            raise ApiError(400, refusal.format(name=where + name), param=where + name, code="unsupported_parameter")


def overridden_or_refused(defaults: Defaults, **asked) -> tuple[Sampling, Limits]:
    """The server's sampling and limits with what a request sets over them; a 400 naming the setting where
    one cannot be."""
    try:
        return overridden(defaults.sampling, defaults.limits, **asked)
    except UsageError as error:
        raise ApiError(400, f"{error.setting}: {error}" if error.setting else str(error), param=error.setting) from None


def name_the_calls_answered(messages: list[dict]) -> None:
    """A tool message's `name`, from the call it answers: some templates write it (OpenAI's and
    Anthropic's clients send only the call's id)."""
    names = {call["id"]: call["function"]["name"] for m in messages for call in m.get("tool_calls", ())}
    for message in messages:
        if message["role"] == "tool" and message.get("tool_call_id") in names:
            message.setdefault("name", names[message["tool_call_id"]])


def effort(value: str, where: str) -> str | None:
    """A reasoning effort as OpenAI and Ollama spell them, as Thinking takes it (None: no thinking at all)."""
    if value == "none":
        return None
    taken = {"minimal": "low", "max": "high", "xhigh": "high"}.get(value, value)
    if taken not in EFFORTS:
        raise ApiError(400, f"{where}: {value!r} is not a reasoning effort (none, minimal, low, medium, high, xhigh)",
                       param=where)
    return taken


def thinking_asked(defaults: Thinking, think: bool | None = None, level: str | None = None,
                   budget: int | None = None, if_able: bool = False) -> Thinking:
    """The server's thinking with what a request asks over it (None keeps the server's); level: the effort; if_able:
    think asked of whatever model answers (Thinking.if_able)."""
    return Thinking(defaults.think if think is None else think, level or defaults.effort,
                    defaults.budget if budget is None else budget, if_able)


# Inputs one embedding request may hold: OpenAI's own limit. 10,000 ran 344 s on a 2-core CPU (issue 46).
MOST_EMBEDDING_INPUTS = 2048


def checked_count(inputs: list, field: str = "input") -> list:
    """The inputs, or a 400 where there are more than one request may embed (or rank: documents)."""
    if len(inputs) > MOST_EMBEDDING_INPUTS:
        raise ApiError(400, f"{field}: {len(inputs):,} {field if field == 'documents' else 'inputs to embed'};"
                       f" at most {MOST_EMBEDDING_INPUTS:,} a request (send the rest in further requests)", param=field)
    return inputs


def embedding_inputs(given: str | list, field: str = "input") -> list:
    """What a request asks to embed (a text, texts, token ids or lists of them) as one input each; a 400 where one
    is empty, or where there are more than a request may embed."""
    inputs = [given] if isinstance(given, str) or given and isinstance(given[0], int) else list(given)
    if not inputs or any(item in ("", []) for item in inputs):
        raise ApiError(400, f"{field}: an input to embed is empty", param=field)
    return checked_count(inputs, field)


def kept_dimensions(dimensions: int | None, n_embd: int) -> int | None:
    """The dimensions of each vector a request keeps (OpenAI's and Ollama's `dimensions`); a 400 beyond the model's."""
    if dimensions is not None and not 1 <= dimensions <= n_embd:
        raise ApiError(400, f"dimensions: this model's embeddings have {n_embd}: from 1 to {n_embd} of them are kept",
                       param="dimensions")
    return dimensions


def output_told(schema: dict | bool | None, name: str | None = None) -> dict:
    """The form a request asks of the answer, as OpenAI's response_format spells it (schema None: any JSON object),
    for the chat templates that tell the model of it (Kimi K3's, DeepSeek V4's, Solar Open's, Cohere's), as a
    variable under the request's own."""
    if schema is None:
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": name or "output", "schema": schema}}


def tool_reader(job: Job) -> ToolStream | None:
    """What reads the answer's tool calls as it streams, where the model was offered tools to call."""
    tools = job.request.tools
    if not tools or tools.choice == "none" or not job.tool_format:
        return None
    return ToolStream(job.tool_format, required=tools.choice != "auto", tools=tools)


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
        # a reasoning model's thinking and answer apart
        "parts": {name: {"tokens": p.tokens, "steps": p.steps, "draft_tokens": p.drafted, "accepted_tokens": p.accepted,
                         "tokens_per_second": p.tokens_per_second, "tokens_per_step": p.tokens_per_step}
                  for name, p in s.parts.items()},
        # the steps that verified draft trees, and which branch their kept paths took (1: the drafter's bet)
        "trees": {"steps": s.trees.steps, "nodes": s.trees.nodes, "depth": s.trees.depth,
                  "branches": s.trees.branches, "accepted_tokens": s.trees.accepted,
                  "kept_branch": {str(rank): count for rank, count in sorted(s.trees.wins.items())}},
    }


def choices_of(parsed: Parsed) -> list[Request]:
    """The requests of each prompt's n choices, prompt by prompt: a seed given goes on by one a choice, so
    that seeded choices differ from each other and come again with the seed."""
    request, n = parsed.request, parsed.choices
    seed = request.sampling.seed
    return [replace(request, prompt=prompt, sampling=replace(request.sampling, seed=None if seed is None else seed + i))
            for prompt in parsed.prompts or (request.prompt,) for i in range(n)]


def candidate(c: Candidate) -> dict:
    """A token in OpenAI's and Ollama's logprobs: its text (a piece of a character shows as U+FFFD), its exact
    bytes and its log probability."""
    return {"token": c.piece.decode("utf-8", errors="replace"), "logprob": c.logprob, "bytes": list(c.piece)}


def ended_by(job: Job) -> list[int]:
    """The end-of-generation token that ended the answer, if one did: last of its token ids, as llama-server and
    vLLM list them (no Token event carries it)."""
    end = job.recorder.end_token
    return [] if end is None else [end]


def logprobs_of(tokens: Sequence[Token]) -> list[Logprobs]:
    """The logprobs of those of tokens that carry them."""
    return [token.logprobs for token in tokens if token.logprobs]


def token_logprobs(entries: Sequence[Logprobs]) -> list[dict]:
    """Each token's entry, the likeliest tokens of its row beside it (OpenAI's chat and Ollama's shape)."""
    return [candidate(e.chosen) | {"top_logprobs": [candidate(c) for c in e.top]} for e in entries]


class Answering:
    """One answer in a protocol's shape: whole (full), or streamed as frames: what opens the stream, a piece
    of text, a tool call, an error after the first byte, and what closes it with the statistics.
    prompt_field: where the request held its prompt, named in a refusal of one too long."""

    media_type: str
    headers: dict | None = None
    every_event = False  # streamed as the events themselves (event()), Steps too, rather than as text
    token_ids = False  # each piece of text carries the tokens it came of, whose ids it frames
    shows_reading = False  # a stream shows a long prompt's reading as it goes (reading())
    # What keeps a stream open while a long prompt is read, after each batch, saying nothing its clients read (an SSE
    # comment; None: NDJSON has nothing such): a prompt that takes minutes to read (an agent's 19,000 tokens on a
    # CPU) sent nothing meanwhile, and a client that gives up on a silent connection gave up (Claude Code's byte
    # watchdog waits 300 s).
    keepalive: str | None = None

    def event(self, item) -> list[str]:
        """An event as an every_event protocol streams it."""
        raise NotImplementedError

    def __init__(self, chat: bool, model: str):
        self.chat, self.model = chat, model
        self.prompt_field = "messages" if chat else "prompt"

    def full(self, job: Job) -> dict:
        raise NotImplementedError

    def rendered(self, prompt: str) -> dict:
        """The answer to a request that asks for its prompt as read alone (Parsed.renders_only)."""
        raise NotImplementedError

    def opening(self, job: Job) -> list[str]:
        """What opens the stream, once the job has begun (its prompt read)."""
        return []

    def piece(self, text: str, tokens: Sequence[Token] = ()) -> str:
        """A piece of the answer's text, with the tokens it came of where the request asked for their logprobs
        or the protocol frames their ids (only a protocol that has logprobs or token_ids is given any)."""
        raise NotImplementedError

    def thought(self, text: str) -> str:
        """A piece of a reasoning model's thinking."""
        raise NotImplementedError

    def reading(self, job: Job, reading: Reading) -> list[str]:
        """How far the prompt's reading has got (only a protocol that shows_reading is given any)."""
        raise NotImplementedError

    def call(self, call: ToolCall, index: int) -> str:
        raise NotImplementedError

    def error(self, failure: ApiError) -> str:
        raise NotImplementedError

    def closing(self, job: Job, called: bool) -> list[str]:
        raise NotImplementedError

    # Several answers to one request (several prompts, or several to each), one a job (only a protocol that has
    # them is asked): whole, or streamed side by side, a choice() each, each choice's finish() as it ends, ended()
    # once all have.
    def choices(self, jobs: list[Job]) -> dict | list:
        raise NotImplementedError

    def choice(self, index: int) -> "Answering":
        raise NotImplementedError

    def finish(self, job: Job, called: bool) -> list[str]:
        raise NotImplementedError

    def ended(self, jobs: list[Job]) -> list[str]:
        raise NotImplementedError


class Protocol:
    """One API serve speaks: how its errors look, how its generation requests (chat, or a bare prompt) are
    read, and the Answering that answers one."""

    name: str

    def error_body(self, failure: ApiError) -> dict:
        raise NotImplementedError

    def parse(self, body: dict, chat: bool, defaults: Defaults) -> Parsed | None:
        """The request a body asks for (None: nothing to generate); ApiError where it cannot be served."""
        raise NotImplementedError

    def answering(self, chat: bool, model: str, parsed: Parsed) -> Answering:
        raise NotImplementedError
