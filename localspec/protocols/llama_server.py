"""llama-server's own API (not OpenAI's): POST /completion and /infill, whose answers and server-sent events
are llama-server's (content, stop, stop_type, tokens_predicted, timings...), /tokenize, /detokenize and
GET /props, so that tools written against llama-server (llama.vim and llama.vscode's code completion, scripts
that read /props) run against serve as they are. Answers carry localspec's speculation record beside
llama-server's timings. Errors are llama-server's: {"error": {"code", "message", "type"}}.

/infill lays its prompt out as llama-server does (Prompts.infill): the model's fill-in-the-middle tokens
around the code before and after the cursor, the other files' chunks before them."""

import copy
import json
import math
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from pydantic import Field, TypeAdapter, ValidationError

from ..config import MOST_LOGPROBS, Limits, Sampling
from ..errors import InputError, LocalspecError, UsageError
from ..events import Candidate, Logprobs, Reading, Token
from ..prompts import MEDIA_MARKER, output_grammar
from ..request import Request
from ..service import Job
from ..session import Session
from .shared import (MOST_CHOICES, ApiError, Answering, Defaults, LoraScale, Parsed, Protocol, Sampled, _Typed,
                     api_error, checked_count, embedding_inputs, ended_by, image_bytes, invalid, logprobs_of, overridden_or_refused,
                     prompts_of, speculation, speculative_asked, timings, validated)

# llama-server's options that change the output, with the values that leave it as it is: a request that
# sets one otherwise is refused rather than answered as if it had not.
NEUTRAL = {
    "min_keep": (None, 0, 1),  # (at least this many candidates kept by top-p, min-p, typical and XTC)
    "multimodal_data": (None, []),
}
# /props' build_info, where llama-server names its llama.cpp build: this is not llama-server
BUILD_INFO = "localspec (llama-server's API)"
# the order localspec samples in (llama.cpp's names)
SAMPLERS = ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]


class CompletionBody(Sampled):
    model: str | None = None
    prompt: str | list[int] | list[str | list[int]]  # (a list of texts or of token-id lists: several prompts)
    n_predict: int | None = Field(None, ge=-1)
    max_tokens: int | None = Field(None, ge=-1)  # (OpenAI's name, read where n_predict is not given, as llama-server)
    stop: list[str] | None = None
    stream: bool = False
    n_probs: int = Field(0, ge=0, le=MOST_LOGPROBS)
    post_sampling_probs: bool = False  # n_probs of the distribution each token was chosen from, as probabilities
    return_tokens: bool = False  # the answer's token ids in its tokens (a stream's chunks carry theirs always)
    return_progress: bool = False  # a stream's chunks show a long prompt's reading (prompt_progress)
    n_cmpl: int = Field(1, ge=1, le=MOST_CHOICES)  # answers to each prompt
    response_fields: list[str] | None = None
    n_indent: int = Field(0, ge=0)  # a code completion ends at a line less indented than this
    t_max_predict_ms: int = Field(0, ge=0)  # ... or at a newline once it has run this long (0: never)
    # taken and left alone: localspec always reuses what the cache holds, picks a free sequence itself,
    # samples in its own order (SAMPLERS), and reads a prompt whole; said in docs/serve.md
    cache_prompt: bool | None = None
    id_slot: int | None = None
    samplers: str | list[str] | None = None  # (its letters, `dkypmxt`, or its names)
    n_keep: int | None = None
    t_max_prompt_ms: int | None = None
    timings_per_token: bool | None = None


class Chunk(_Typed):
    text: str
    filename: str = "tmp"


class InfillBody(CompletionBody):
    prompt: str = ""  # (after the middle token: what is typed on the cursor's line so far)
    input_prefix: str
    input_suffix: str
    input_extra: list[Chunk] = []


def parse_completion(asked: CompletionBody, defaults: Defaults, prompt: str | list[int] | None = None) -> Parsed:
    """/completion's request (prompt: the tokens /infill laid out instead of the body's), n_cmpl answers to each
    of its prompts. n_predict 0 asks only that the prompt be read into the cache, as llama.vim and llama.vscode do
    with other files' chunks before a suggestion needs them: one token is generated and kept back (reads_ahead)."""
    prompts = ()
    if prompt is None:
        prompt, prompts = prompts_of(asked.prompt, asked.n_cmpl, "n_cmpl")
    if asked.grammar is not None and asked.json_schema is not None:
        raise ApiError(400, "grammar and json_schema each constrain the output; give one")
    most = asked.n_predict if asked.n_predict is not None else asked.max_tokens
    ahead = most == 0
    try:
        grammar = output_grammar(asked.grammar, asked.json_schema)
    except InputError as error:  # (a schema no grammar can hold was a 500)
        raise ApiError(400, str(error), param="grammar" if asked.json_schema is None else "json_schema") from None
    sampling, limits = overridden_or_refused(defaults, **asked.sampled(), logprobs=asked.n_probs or None,
                                             logprobs_sampled=asked.post_sampling_probs,
                                             max_tokens=1 if ahead else most, stop=asked.stop, grammar=grammar)
    limits = replace(limits, indent=asked.n_indent, seconds=asked.t_max_predict_ms / 1000 or None)
    return Parsed(Request(sampling, limits, prompt=prompt, **speculative_asked(asked.speculative, defaults),
                          **asked.adapted()),
                  asked.stream and not ahead, include_usage=False, fields=tuple(asked.response_fields or ()),
                  reads_ahead=ahead, token_ids=asked.return_tokens, prompts=prompts, choices=asked.n_cmpl,
                  shows_reading=asked.return_progress)


def validated_body(model: type[_Typed], body: dict):
    return validated(model, body, NEUTRAL, "{name} is not supported by localspec")


def _fields(answer: dict, wanted: Sequence[str] | None) -> dict:
    """Only the fields a request's response_fields names ("timings/predicted_n" reaches inside, and keeps
    that name), as llama-server answers them; all of them where it names none."""
    if not wanted:
        return answer
    out = {}
    for path in wanted:
        value, found = answer, True
        for key in path.split("/"):
            if isinstance(value, dict) and key in value:
                value = value[key]
            else:
                found = False
                break
        if found:
            out[path] = value
    return out


def probabilities(entries: Sequence[Logprobs], sampled: bool = False) -> list[dict]:
    """Each token's log probability and the likeliest beside it, in llama-server's completion_probabilities; sampled
    (its post_sampling_probs): in the distribution the token was chosen from, as probabilities ("prob",
    "top_probs"), as llama-server answers them."""
    def one(c: Candidate) -> dict:
        return {"id": c.id, "token": c.piece.decode("utf-8", errors="ignore"), "bytes": list(c.piece)} | (
            {"prob": math.exp(c.logprob)} if sampled else {"logprob": c.logprob})
    return [one(e.chosen) | {"top_probs" if sampled else "top_logprobs": [one(c) for c in e.top]} for e in entries]


def stop_type(job: Job) -> str:
    r = job.recorder
    if r.stop_sequence:
        return "word"
    return "eos" if r.finish_reason == "stop" else "limit"


class Answer(Answering):
    """/completion's answer: whole, or as server-sent events, a `data:` line each piece of text with the ids of
    the tokens it came of, then the whole answer's fields with an empty content and stop true. tokens: whether
    the whole answer lists its tokens' ids (return_tokens), the end-of-generation token's too, as llama-server.
    Several answers (several prompts, n_cmpl) are a JSON array of them, or their events side by side, each
    answer's `index` its prompt's times n_cmpl plus its own among that prompt's, as llama-server numbers them."""

    media_type = "text/event-stream"
    keepalive = ": reading the prompt\n\n"
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    token_ids = True

    def __init__(self, model: str, response_fields: Sequence[str] = (), reads_ahead: bool = False,
                 sampled: bool = False, tokens: bool = False, progress: bool = False):
        super().__init__(False, model)
        self.response_fields, self.reads_ahead = response_fields, reads_ahead
        self.sampled, self.tokens, self.shows_reading = sampled, tokens, progress
        self.index = 0

    def full(self, job: Job) -> dict:
        if self.reads_ahead:  # (its one token kept back: nothing was asked for)
            return _fields(self._final(job, "") | {"tokens_predicted": 0, "has_new_line": False, "stop_type": "limit",
                                                   "stopping_word": ""}, self.response_fields)
        r = job.recorder
        tokens = r.ids + ended_by(job) if self.tokens else []
        return _fields(self._final(job, r.text, tokens) | self._probabilities(r.logprobs), self.response_fields)

    def _final(self, job: Job, content: str, tokens: Sequence[int] = ()) -> dict:
        r = job.recorder
        return {"index": self.index, "content": content, "tokens": list(tokens), "id_slot": job.sequence, "stop": True,
                "model": self.model, "tokens_predicted": r.tokens, "tokens_evaluated": r.prompt_tokens,
                "generation_settings": generation_settings(job.request.sampling, job.request.limits, job.request.lora),
                "has_new_line": "\n" in r.text, "truncated": r.finish_reason == "context", "stop_type": stop_type(job),
                "stopping_word": r.stop_sequence or "", "tokens_cached": r.reused_prompt_tokens,
                "timings": timings(job), "speculation": speculation(job)}

    def _probabilities(self, entries: Sequence[Logprobs]) -> dict:
        return {"completion_probabilities": probabilities(entries, self.sampled)} if entries else {}

    def piece(self, text: str, tokens: Sequence[Token] = ()) -> str:
        return _event({"index": self.index, "content": text, "tokens": [token.id for token in tokens], "stop": False}
                      | self._probabilities(logprobs_of(tokens)))

    def thought(self, text: str) -> str:
        return ""  # (a bare prompt is read as written: there is no thinking apart from the text)

    def reading(self, job: Job, reading: Reading) -> list[str]:
        return [_event({"index": self.index, "content": "", "tokens": [], "stop": False, "id_slot": job.sequence,
                        "tokens_predicted": 0, "tokens_evaluated": reading.total, "prompt_progress": {
                            "total": reading.total, "cache": reading.cached, "processed": reading.read,
                            "time_ms": round(reading.seconds * 1000)}})]

    def error(self, failure: ApiError) -> str:
        return _event(LLAMA_SERVER.error_body(failure))

    def closing(self, job: Job, called: bool) -> list[str]:
        end = ended_by(job)  # (streamed as a token of its own with no text, as llama-server streams it)
        return ([_event({"index": self.index, "content": "", "tokens": end, "stop": False})] if end else []) + [
            _event(_fields(self._final(job, ""), self.response_fields))]

    def choices(self, jobs: list[Job]) -> list[dict]:
        return [self.choice(index).full(job) for index, job in enumerate(jobs)]

    def choice(self, index: int) -> "Answer":
        other = copy.copy(self)
        other.index = index
        return other

    def finish(self, job: Job, called: bool) -> list[str]:
        return self.closing(job, called)

    def ended(self, jobs: list[Job]) -> list[str]:
        return []


def generation_settings(sampling: Sampling, limits: Limits, lora: dict[int, float] | None = None) -> dict:
    """The sampling settings under llama-server's names (its default_generation_settings.params); lora: the LoRA
    adapters' scales by id, as the request named them."""
    return {"n_predict": -1 if limits.max_tokens is None else limits.max_tokens,
            "seed": -1 if sampling.seed is None else sampling.seed, "temperature": sampling.temperature,
            "top_k": sampling.top_k, "top_p": sampling.top_p, "min_p": sampling.min_p,
            "typical_p": sampling.typical_p, "dynatemp_range": sampling.dynatemp_range,
            "dynatemp_exponent": sampling.dynatemp_exponent, "top_n_sigma": sampling.top_n_sigma,
            "mirostat": sampling.mirostat, "mirostat_tau": sampling.mirostat_tau, "mirostat_eta": sampling.mirostat_eta,
            "repeat_last_n": sampling.repeat_last_n,
            "repeat_penalty": sampling.repeat_penalty,
            "presence_penalty": sampling.presence_penalty, "frequency_penalty": sampling.frequency_penalty,
            "dry_multiplier": sampling.dry_multiplier, "dry_base": sampling.dry_base,
            "dry_allowed_length": sampling.dry_allowed_length, "dry_penalty_last_n": sampling.dry_penalty_last_n,
            "dry_sequence_breakers": list(sampling.dry_sequence_breakers), "xtc_probability": sampling.xtc_probability,
            "xtc_threshold": sampling.xtc_threshold, "ignore_eos": sampling.ignore_eos,
            # (a ban as llama-server's requests spell it: JSON has no -inf)
            "logit_bias": [{"token": token, "bias": bias if math.isfinite(bias) else False}
                           for token, bias in sampling.logit_bias],
            "stop": list(limits.stop), "n_indent": limits.indent,
            "t_max_predict_ms": round(limits.seconds * 1000) if limits.seconds else 0, "n_probs": sampling.logprobs or 0,
            "post_sampling_probs": sampling.logprobs_sampled,
            "grammar": sampling.grammar or "", "samplers": SAMPLERS,
            "lora": [{"id": index, "scale": scale} for index, scale in (lora or {}).items()]}


def multimodal_prompt(session: Session, prompt: dict) -> list[int]:
    """/completion's prompt as an object: prompt_string, read as written, with an image of multimodal_data (base64)
    where it writes MEDIA_MARKER (/props' media_marker), each in order: the prompt's tokens."""
    text, data = prompt.get("prompt_string"), prompt.get("multimodal_data", [])
    if not isinstance(text, str):
        raise ApiError(400, "prompt.prompt_string: the prompt's text", param="prompt")
    if not isinstance(data, list):
        raise ApiError(400, "prompt.multimodal_data: a list of images, base64 each", param="prompt")
    images = [image_bytes(item, f"prompt.multimodal_data.{index}") for index, item in enumerate(data)]
    try:
        return session.prompts.tokenize_with_images(text, images)
    except LocalspecError as error:
        raise api_error(error, "prompt") from None


def props(session: Session, defaults: Defaults, slots: int) -> dict:
    """GET /props: what llama-server says of itself, for the model a request names."""
    params = generation_settings(defaults.sampling, defaults.limits, dict(enumerate(session.adapters.scales)))
    return {"default_generation_settings": {"id": 0, "id_task": -1, "n_ctx": session.info.n_ctx,
                                            "speculative": session.can_speculate, "is_processing": False,
                                            "params": params},
            "total_slots": slots, "model_path": str(session.model_files()[0]), "chat_template": session.prompts.template,
            "modalities": {"vision": session.info.vision, "audio": session.info.audio}, "media_marker": MEDIA_MARKER,
            "build_info": BUILD_INFO, "is_sleeping": False} | (
        {"chat_template_tool_use": session.prompts.tool_use.template} if session.prompts.tool_use else {})


def slots(session: Session, defaults: Defaults, running: dict) -> list[dict]:
    """GET /slots: each sequence (llama-server's slot) as llama-server shows it; running: the request each busy one
    generates for, and the tokens it has generated, by sequence."""
    shown = []
    for sequence in range(len(session.sequences)):
        request, decoded = running.get(sequence, (None, 0))
        sampling, limits = (defaults.sampling, defaults.limits) if request is None else (request.sampling,
                                                                                        request.limits)
        most = -1 if limits.max_tokens is None else limits.max_tokens
        shown.append({"id": sequence, "id_task": -1, "n_ctx": session.sequences[sequence].n_ctx,
                      "speculative": session.can_speculate, "is_processing": request is not None,
                      "params": generation_settings(sampling, limits, dict(enumerate(
                          session.adapters.scales if request is None else session.lora_scales(request)))),
                      "next_token": {"has_next_token": request is not None, "has_new_line": False,
                                     "n_remain": -1 if most < 0 else max(0, most - decoded), "n_decoded": decoded}})
    return shown


def lora_adapters(session: Session) -> list[dict]:
    """GET /lora-adapters: the adapters loaded, by id, each with the scale a request naming none gets and what its
    file says of its task (llama-server's fields)."""
    adapters = session.adapters
    return [{"id": index, "path": str(path), "scale": scale,
             "task_name": adapters.meta(index, "adapter.lora.task_name"),
             "prompt_prefix": adapters.meta(index, "adapter.lora.prompt_prefix")}
            for index, (path, scale) in enumerate(zip(adapters.paths, adapters.scales))]


def lora_scales(body: list, session: Session) -> tuple[float, ...]:
    """POST /lora-adapters' body, [{id, scale}, ...], as every adapter's scale (those not listed 0); a 400 naming an
    entry that is not one, or an adapter not loaded (llama-server passes over it)."""
    try:
        entries = TypeAdapter(list[LoraScale]).validate_python(body)
    except ValidationError as error:
        raise invalid(error) from None
    try:
        return session.adapters.scales_of({entry.id: entry.scale for entry in entries})
    except UsageError as error:
        raise ApiError(400, str(error), param="id") from None


FILENAME = re.compile(r"[^/\\:\x00-\x1f]{1,255}")


def slot_file(folder: Path, body: dict) -> Path:
    """The file a slot save or restore names (its `filename`, in the --slot-save-path folder); a 400 for a name that
    is no plain file name there (a path, .., a hidden or empty name), as llama-server's."""
    name = body.get("filename")
    if not isinstance(name, str) or not FILENAME.fullmatch(name) or name.startswith(".") or name != name.strip():
        raise ApiError(400, "Invalid filename", param="filename")
    return folder / name


def slot_acted(action: str, sequence: int, filename: str | None, tokens: int, size: int, seconds: float) -> dict:
    """POST /slots/ID?action=...'s answer, as llama-server's."""
    if action == "erase":
        return {"id_slot": sequence, "n_erased": tokens}
    done = "saved" if action == "save" else "restored"
    return {"id_slot": sequence, "filename": filename, f"n_{done}": tokens,
            "n_written" if action == "save" else "n_read": size,
            "timings": {f"{action}_ms": round(seconds * 1000, 3)}}


class EmbeddingBody(_Typed):
    model: str | None = None
    content: str | list[str] | list[int] | list[list[int]] | None = None
    input: str | list[str] | list[int] | list[list[int]] | None = None  # (its other spelling)
    embd_normalize: int = Field(2, ge=-1)  # -1 none, 0 max-abs (int16), 2 unit length, p p-norm


def parse_embedding(body: dict) -> tuple[list, int]:
    """/embedding's inputs (texts or token id lists, one each) and how to normalize their vectors."""
    asked = validated_body(EmbeddingBody, body)
    given = asked.content if asked.content is not None else asked.input
    if given is None:
        raise ApiError(400, '"input" or "content" must be provided', param="content")
    return embedding_inputs(given, "content"), asked.embd_normalize


def embedded(vectors: list[list[float]]) -> list[dict]:
    """/embedding's answer, llama-server's own (not OpenAI's): each input's vector in a list of its own (a
    pooled model's one; llama-server's --pooling none, not served here, gives one a token)."""
    return [{"index": index, "embedding": [vector]} for index, vector in enumerate(vectors)]


class RerankBody(_Typed):
    model: str | None = None
    query: str
    documents: list[str | dict] | None = None  # Jina's and Cohere's (texts, or {"text": ...})
    texts: list[str] | None = None  # Hugging Face TEI's: its answer is TEI's too
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = False  # Jina's and Cohere's v1: each result with its document
    return_text: bool = False  # TEI's
    max_tokens_per_doc: int | None = Field(None, ge=1)  # Cohere's v2


# rerank fields that would change the answer, with the values that leave it as llama.cpp's: scores are the model's
# own (raw, as llama-server's: TEI's raw_scores=false would ask for a sigmoid), one score a whole document
RERANK_NEUTRAL = {"raw_scores": (None, True), "truncate": (None, False), "rank_fields": (None,),
                  "max_chunks_per_doc": (None,), "relevant_spans": (None,)}


def parse_rerank(body: dict) -> tuple[RerankBody, list[str]]:
    """The request and its documents' texts; a 400 naming the field that is wrong."""
    asked = validated(RerankBody, body, RERANK_NEUTRAL, "{name} is not supported by localspec's reranking")
    given = asked.texts if asked.documents is None else asked.documents
    if not given:
        raise ApiError(400, '"documents" must be a non-empty array of strings', param="documents")
    documents = []
    for number, document in enumerate(given):
        text = document.get("text") if isinstance(document, dict) else document
        if not isinstance(text, str):
            raise ApiError(400, f"documents.{number}: a document is a string, or an object with a \"text\" string",
                           param=f"documents.{number}")
        documents.append(text)
    return asked, checked_count(documents, "documents")


def reranked(asked: RerankBody, documents: list[str], scores: list[float], tokens: int, model: str) -> dict | list:
    """/rerank's answer, as llama-server's: the documents by score, highest first, top_n of them; Jina's and Cohere's
    shape ({"results": [{"index", "relevance_score"}]}, with "usage"), or TEI's (a list of {"index", "score"}) where
    the request was TEI's (texts)."""
    tei = asked.documents is None
    label = "score" if tei else "relevance_score"
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[:asked.top_n]
    results = [{"index": i, label: scores[i]} for i in order]
    if tei and asked.return_text:
        for result in results:
            result["text"] = documents[result["index"]]
    if tei:
        return results
    if asked.return_documents:
        for result in results:
            result["document"] = {"text": documents[result["index"]]}
    return {"model": asked.model or model, "object": "list", "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "results": results}


class TokenizeBody(_Typed):
    model: str | None = None
    content: str | None = None
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False
    # vLLM's spellings (lm-eval's remote tokenizer sends them): the text, and whether to add the start token
    # (vLLM's default: yes)
    prompt: str | None = None
    add_special_tokens: bool | None = None


class DetokenizeBody(_Typed):
    model: str | None = None
    tokens: list[int]


def tokenized(session: Session, body: dict) -> dict:
    """POST /tokenize: the text's token ids (with their pieces: text, or bytes where a piece is no whole
    character)."""
    asked = validated_body(TokenizeBody, body)
    if (asked.content is None) == (asked.prompt is None):
        raise ApiError(400, "content: the text to tokenize (or vLLM's prompt), one of them", param="content")
    text = asked.content if asked.content is not None else asked.prompt
    add_special = asked.add_special_tokens if asked.add_special_tokens is not None else \
        asked.add_special if asked.content is not None else True
    model = session.prompts.model
    tokens = model.tokenize(text, add_special, asked.parse_special) if text else []
    if not asked.with_pieces:
        return {"tokens": tokens}
    out = []
    for token in tokens:
        piece = model.special_piece(token)
        try:
            shown = piece.decode("utf-8")
        except UnicodeDecodeError:
            shown = list(piece)
        out.append({"id": token, "piece": shown})
    return {"tokens": out}


def detokenized(session: Session, body: dict) -> dict:
    """POST /detokenize: the text token ids spell (special tokens' own text included, as llama-server's)."""
    asked = validated_body(DetokenizeBody, body)
    model = session.prompts.model
    if not all(0 <= token < model.n_vocab for token in asked.tokens):
        raise ApiError(400, f"tokens: ids must be between 0 and {model.n_vocab - 1}, this model's vocabulary")
    text = model.spell_of(asked.tokens, special=True).decode("utf-8", errors="replace")
    return {"content": text, "prompt": text}  # (prompt: vLLM's name, which lm-eval's remote tokenizer reads)


def tokenizer_info(session: Session) -> dict:
    """GET /tokenizer_info, vLLM's: the special tokens and chat template, which lm-eval's remote tokenizer asks
    for (and, with /tokenize, takes as the sign that a server tokenizes for it)."""
    model = session.prompts.model
    special = {name: model.special_text(name) or None for name in ("bos", "eos")}
    return {"tokenizer_class": "llama.cpp", "bos_token": special["bos"], "eos_token": special["eos"],
            "pad_token": None, "chat_template": session.prompts.template, "model_max_length": session.info.n_ctx}


def _event(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


class LlamaServer(Protocol):
    name = "llama-server"

    def error_body(self, failure: ApiError) -> dict:
        kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                501: "not_supported_error", 503: "unavailable_error"}.get(
                    failure.status, "invalid_request_error" if failure.status < 500 else "server_error")  # (408, 413, 429)
        return {"error": {"code": failure.status, "message": failure.message, "type": kind}}

    def parse(self, body: dict, chat: bool, defaults: Defaults) -> Parsed:
        return parse_completion(validated_body(CompletionBody, body), defaults)

    def answering(self, chat: bool, model: str, parsed: Parsed) -> Answer:
        return Answer(model, parsed.fields, parsed.reads_ahead, parsed.request.sampling.logprobs_sampled,
                      parsed.token_ids, parsed.shows_reading)


LLAMA_SERVER = LlamaServer()
