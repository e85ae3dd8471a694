"""LM Studio's SDKs (`lmstudio` for Python, `@lmstudio/sdk` for TypeScript) talk to LM Studio over websockets, one a
namespace (/llm, /embedding, /system, /files, /repository), after a greeting at /lmstudio-greeting: each socket opens
with the client's identity, answered {"success": true}, then carries remote calls (rpcCall, answered rpcResult or
rpcError by callId) and channels (channelCreate, then channelSend messages both ways by channelId), their errors as
{"title": ...}. A prediction is a `predict` channel: the history and a stack of configuration layers (keys such as
llm.prediction.temperature, checkboxes {checked, value} for the optional ones) in; fragments, prompt reading
progress, tool calls and one `success` with the stats out. What is read here is handed on as the OpenAI request it
amounts to, so every field is held as /v1/chat/completions holds it."""

import base64
import json
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .. import store
from ..store import finder
from ..events import Reading, Token
from ..service import Job
from ..session import Session
from ..store import GGUFInfo, ModelEntry
from ..tool_calls import ToolCall
from .lmstudio import stop_reason, used_draft
from .shared import MOST_IMAGE_BYTES, ApiError, Answering, Parsed

NAMESPACES = ("llm", "embedding", "system", "files", "repository")
GREETING = {"lmstudio": True}  # (what the SDK looks for before it opens a socket)
AUTHENTICATED = {"success": True}
NOT_FOUND = {"code": "generic.noModelMatchingQuery"}  # the SDK raises its LMStudioModelNotFoundError for it
MOST_UPLOADS, MOST_UPLOAD_BYTES = 256, 256 << 20  # images uploaded for later predictions, kept (the newest)

# configuration keys read, and where /v1/chat/completions holds each (a checkbox's value where checked)
SAMPLING_KEYS = {"llm.prediction.temperature": "temperature", "llm.prediction.topPSampling": "top_p",
                 "llm.prediction.topKSampling": "top_k", "llm.prediction.minPSampling": "min_p",
                 "llm.prediction.repeatPenalty": "repeat_penalty", "llm.prediction.stopStrings": "stop"}
MAX_TOKENS = "llm.prediction.maxPredictedTokens"
STRUCTURED = "llm.prediction.structured"
TOOLS = "llm.prediction.tools"
TEMPLATE = "llm.prediction.promptTemplate"  # (the SDK's complete() sets one that joins the texts: a bare prompt)
OVERFLOW = "llm.prediction.contextOverflowPolicy"
DRAFT_MODEL = "llm.prediction.speculativeDecoding.draftModel"
DRAFT_TOKENS = "llm.prediction.speculativeDecoding.numDraftTokensExact"
# read and left to serve: llama.cpp's threads, the reasoning markers (the model's own are known), LM Studio's own
# drafting thresholds (the auto policy decides how far to draft)
LEFT_TO_SERVE = ("llm.prediction.llama.cpuThreads", "llm.prediction.reasoning.parsing",
                 "llm.prediction.speculativeDecoding.minDraftLengthToConsider",
                 "llm.prediction.speculativeDecoding.minContinueDraftingProbability",
                 "llm.prediction.toolCallStopStrings")


def error(title: str, not_found: bool = False) -> dict:
    """LM Studio's error object, as its SDK raises it (its title the message)."""
    return {"title": title} | ({"displayData": NOT_FOUND} if not_found else {})


def rpc_result(call_id, result) -> dict:
    return {"type": "rpcResult", "callId": call_id} | ({} if result is None else {"result": result})


def rpc_error(call_id, failure: dict) -> dict:
    return {"type": "rpcError", "callId": call_id, "error": failure}


def channel_send(channel_id, message: dict) -> dict:
    return {"type": "channelSend", "channelId": channel_id, "message": message}


def channel_error(channel_id, failure: dict) -> dict:
    return {"type": "channelError", "channelId": channel_id, "error": failure}


def named_by(message):
    """The call or channel a message is of (its callId, or channelId): None where it names neither as the SDKs do, with
    a number (or a string)."""
    named = message.get("callId" if message.get("type") == "rpcCall" else "channelId")
    return named if isinstance(named, (int, str)) and not isinstance(named, bool) else None


def cancels(message: dict) -> bool:
    """Whether a channel's message from the client stops it (a prediction's cancel)."""
    return isinstance(message.get("message"), dict) and message["message"].get("type") == "cancel"


def tool_definitions(parameter: dict) -> list | None:
    """The tools applyPromptTemplate renders the prompt with."""
    opts = parameter.get("opts")
    if opts is not None and not isinstance(opts, dict):
        raise ApiError(400, f"opts is an object ({{\"toolDefinitions\": [...]}}), not {opts!r}")
    return (opts or {}).get("toolDefinitions")


def specified(specifier) -> str | None:
    """The model a call's specifier names ({"type": "query", "query": {"identifier" or "path"}}, or an instance
    reference: serve names an instance as its model); None where it names none (any loaded model)."""
    if not isinstance(specifier, dict):
        raise ApiError(400, f"a model specifier is an object, not {specifier!r}")
    if specifier.get("type") == "instanceReference":
        return _text(specifier.get("instanceReference"), "instanceReference")
    query = specifier.get("query") or {}
    if not isinstance(query, dict):
        raise ApiError(400, f"a model query is an object, not {query!r}")
    name = query.get("identifier") or query.get("path")
    return None if name is None else _text(name, "identifier")


def _text(value, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise ApiError(400, f"{name} names a model, not {value!r}")
    return value


# how a download would fit this machine, as the SDK says it (store/finder.py's words)
FITS = {finder.ON_THE_GPU: "fullGPUOffload", finder.PARTLY_ON_THE_GPU: "partialGPUOffload",
        finder.IN_RAM: "fitWithoutGPU", finder.TOO_BIG: "willNotFit"}
MOST_FOUND = 25  # the SDK's own limit on a search's results


def search_asked(parameter: dict) -> tuple[str, int] | None:
    """A repository search's text and the most results it takes; None where it asks for no GGUF model."""
    opts = parameter.get("opts")
    if not isinstance(opts, dict):
        raise ApiError(400, "a search is {\"opts\": {\"searchTerm\": ..., \"limit\": ...}}")
    text, limit, kinds = opts.get("searchTerm") or "", opts.get("limit") or MOST_FOUND, opts.get("compatibilityTypes")
    if not isinstance(text, str) or isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= 100:
        raise ApiError(400, "searchTerm is text and limit a number of results from 1 to 100")
    if kinds is not None and (not isinstance(kinds, list) or "gguf" not in kinds):
        return None  # (serve fetches GGUF files alone: MLX's and safetensors' are none of its)
    return text, limit


def found(models: Iterable[finder.Found], text: str) -> dict:
    """A search's results: the registry's models by name (LM Studio's catalog), the Hub's repos."""
    return {"results": [{"name": model.name, "identifier": {"type": "catalog" if model.from_registry else "hf",
                                                            "identifier": model.name},
                         "exact": model.name.lower() == text.lower().strip(), "staffPick": model.from_registry}
                        for model in models]}


def download_options_asked(parameter: dict) -> str:
    identifier = parameter.get("modelSearchResultIdentifier")
    if not isinstance(identifier, dict) or not isinstance(identifier.get("identifier"), str) or identifier.get(
            "type") not in ("catalog", "hf"):
        raise ApiError(400, "modelSearchResultIdentifier is a search result's identifier ({\"type\": \"hf\","
                       " \"identifier\": \"owner/repo\"})")
    return identifier["identifier"]


def download_options(name: str, quantizations: Iterable[finder.Quantization]) -> dict:
    """A search result's files to download, each named for downloadModel by what `pull` takes for it, a file at a
    time (hf:owner/repo/file.gguf: never another file of the same quantization)."""
    return {"results": [{
        "name": quantization.file, "sizeBytes": quantization.size, "fitEstimation": FITS[quantization.fit],
        "downloadIdentifier": quantization.pull if quantization.pull == name else f"hf:{name}/{quantization.file}",
        "indexedModelIdentifier": name, "quantization": quantization.quant, "recommended": quantization.recommended}
        for quantization in quantizations]}


def download_progress(arrived: int, total: int, speed: float) -> dict:
    return {"type": "downloadProgress", "update": {"downloadedBytes": arrived, "totalBytes": total,
                                                   "speedBytesPerSecond": speed}}


def model_info(name: str, info: GGUFInfo, entry: ModelEntry | None, session: Session | None = None) -> dict:
    """A model as the SDK describes one (its LlmInfo, or EmbeddingModelInfo), and its loaded instance's fields
    where it is loaded (serve's one instance, named as the model)."""
    out = {"type": "llm" if info.generates else "embedding", "modelKey": name, "format": "gguf",
           "displayName": info.get("general.name") or name,
           "path": f"{entry.repo}/{entry.file}" if entry and entry.repo else str(info.path),
           "sizeBytes": info.file_size, "paramsString": info.parameter_size, "architecture": info.architecture,
           "maxContextLength": info.context_length or 0}
    if info.generates:
        template = session.prompts.template if session else info.chat_template
        out |= {"vision": session is not None and session.info.vision,
                "trainedForToolUse": "tools" in store.capabilities(info, template)}
    if session is not None:
        out |= {"identifier": name, "instanceReference": name, "contextLength": session.info.n_ctx}
    return out


def load_config(session: Session) -> dict:
    """The configuration a model was loaded with, as far as the SDK's keys say it."""
    prefix = "llm" if session.target_info.generates else "embedding"
    return {"fields": [{"key": f"{prefix}.load.contextLength", "value": session.info.n_ctx}]}


def collapsed(stack, where: str) -> dict:
    """A configuration stack's keys and values, later layers over earlier ones."""
    layers = (stack or {}).get("layers", []) if isinstance(stack, dict) or stack is None else None
    if not isinstance(layers, list):
        raise ApiError(400, f"{where} is a stack of configuration layers ({{\"layers\": [...]}})")
    out = {}
    for layer in layers:
        config = (layer or {}).get("config") if isinstance(layer, dict) else None
        fields = (config or {}).get("fields", []) if isinstance(config, dict) or config is None else None
        if not isinstance(fields, list):
            raise ApiError(400, f"a layer of {where} holds its configuration as {{\"config\": {{\"fields\": [...]}}}}")
        for entry in fields:
            if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
                raise ApiError(400, f"a field of {where} is {{\"key\": ..., \"value\": ...}}, not {entry!r}")
            out[entry["key"]] = entry.get("value")
    return out


def _checked(value):
    """A checkbox's value where it is checked (None where not); a plain value as it is."""
    if isinstance(value, dict) and "checked" in value:
        return value.get("value") if value["checked"] else None
    return value


@dataclass(frozen=True)
class Asked:
    """What a predict channel asks for: the OpenAI request it amounts to, whether a chat (else a bare prompt: the
    SDK's complete()), whether the oldest turns may go where the answer would not fit, and the keys it set that
    serve decides otherwise (said in the log)."""

    body: dict
    chat: bool
    fits: bool
    left_to_serve: list[str]


def prediction_asked(creation, files: Callable[[str], tuple[str, bytes] | None]) -> Asked:
    if not isinstance(creation, dict):
        raise ApiError(400, "a predict channel is created with its history and configuration")
    config = collapsed(creation.get("predictionConfigStack"), "predictionConfigStack")
    history = (creation.get("history") or {}).get("messages") if isinstance(creation.get("history"), dict) else None
    if not isinstance(history, list) or not history:
        raise ApiError(400, "the history holds the messages to answer ({\"messages\": [...]})")
    messages = [message for index, given in enumerate(history) for message in _messages(given, index, files)]
    chat = config.get(TEMPLATE) is None
    body: dict = {"stream": True}
    if chat:
        body["messages"] = messages
    else:  # (the template the SDK's complete() sends joins the messages' texts: the prompt is those)
        body["prompt"] = "".join(message["content"] for message in messages if isinstance(message["content"], str))
    for key, field in SAMPLING_KEYS.items():
        value = _checked(config.get(key))
        if value is not None:
            body[field] = int(value) if field == "top_k" and isinstance(value, float) and value.is_integer() else value
    most = _checked(config.get(MAX_TOKENS))
    if most is not None and most is not False:
        body["max_tokens"] = most
    body |= _structured(config.get(STRUCTURED))
    if chat:
        body |= _tools(config.get(TOOLS))
    if config.get(DRAFT_MODEL):
        body["draft_model"] = config[DRAFT_MODEL]
    if config.get(DRAFT_TOKENS) is not None:
        body["speculative"] = {"draft_max": config[DRAFT_TOKENS]}
    return Asked(body, chat, config.get(OVERFLOW) in ("rollingWindow", "truncateMiddle"),
                 [key for key in LEFT_TO_SERVE if config.get(key) is not None])


def _structured(value) -> dict:
    if not isinstance(value, dict) or value.get("type") in (None, "none"):
        return {}
    if value["type"] == "json":
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "structured",
                                                                            "schema": value.get("jsonSchema")}}}
    if value["type"] == "gbnf":
        return {"grammar": value.get("gbnfGrammar")}
    raise ApiError(400, f"structured output of type {value['type']!r} is not served (json, gbnf)")


def _tools(value) -> dict:
    if not isinstance(value, dict) or value.get("type") in (None, "none"):
        return {}
    if value["type"] != "toolArray" or not isinstance(value.get("tools"), list):
        raise ApiError(400, "llm.prediction.tools is {\"type\": \"toolArray\", \"tools\": [...]}")
    return {"tools": value["tools"]} | ({"tool_choice": "required"} if value.get("force") else {})


def _messages(given, index: int, files: Callable[[str], tuple[str, bytes] | None]) -> list[dict]:
    """One message of the SDK's history as OpenAI's (a tool message's results each one of OpenAI's)."""
    where = f"history.messages.{index}"
    if not isinstance(given, dict) or not isinstance(given.get("content"), list):
        raise ApiError(400, f"{where} is a message with a role and a list of content parts")
    role, parts = given.get("role"), given["content"]
    if role == "tool":
        return [{"role": "tool", "tool_call_id": part.get("toolCallId"), "content": part.get("content", "")}
                for part in parts if isinstance(part, dict) and part.get("type") == "toolCallResult"]
    if role not in ("user", "system", "assistant"):
        raise ApiError(400, f"{where} has the role {role!r} (user, system, assistant, tool)")
    contents, calls = [], []  # (in the order given: the text and images of the message)
    for number, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            if not isinstance(part.get("text") or "", str):
                raise ApiError(400, f"{where}.content.{number}.text is text, not {part['text']!r}")
            contents.append({"type": "text", "text": part.get("text") or ""})
        elif kind == "file":
            contents.append(_image(part, files, f"{where}.content.{number}"))
        elif kind == "toolCallRequest" and role == "assistant":
            call = part.get("toolCallRequest") or {}
            if not isinstance(call, dict):
                raise ApiError(400, f"{where}.content.{number}.toolCallRequest is an object with the call's name and"
                               f" arguments, not {call!r}")
            calls.append({"id": call.get("id") or f"call_{index}_{number}", "type": "function",
                          "function": {"name": call.get("name"), "arguments": json.dumps(call.get("arguments") or {})}})
        else:
            raise ApiError(400, f"{where}.content.{number} is a part of type {kind!r}, which a {role} message"
                           " does not hold here")
    images = any(part["type"] == "image_url" for part in contents)
    content = contents if images else "".join(part["text"] for part in contents)
    return [{"role": role, "content": content} | ({"tool_calls": calls} if calls else {})]


def _image(part: dict, files: Callable[[str], tuple[str, bytes] | None], where: str) -> dict:
    found = files(part.get("identifier"))
    if found is None:
        raise ApiError(400, f"{where} names the file {part.get('identifier')!r}, which this connection did not upload"
                       " (the SDK's prepare_image uploads one; serve keeps the newest)")
    media, data = found
    if not media.startswith("image/"):
        raise ApiError(400, f"{where} is a file of type {media}: only images are read")
    return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{base64.b64encode(data).decode()}"}}


class Uploads:
    """The images LM Studio's SDK uploads (its prepare_image, on the /files socket) for a prediction to name later (on
    the /llm socket: the same client's, by the identity it opened both with); the newest kept, MOST_UPLOADS of them
    and MOST_UPLOAD_BYTES in all."""

    def __init__(self):
        self._files: dict[tuple[str, str], tuple[str, bytes]] = {}
        self._bytes = 0

    def add(self, client: str, parameter) -> dict:
        """uploadFileBase64's answer: the file's identifier, type and size."""
        if not isinstance(parameter, dict) or not isinstance(parameter.get("contentBase64"), str):
            raise ApiError(400, "an upload is {\"name\": ..., \"contentBase64\": ...}")
        if len(parameter["contentBase64"]) > MOST_IMAGE_BYTES * 4 // 3 + 4:
            raise ApiError(400, f"an upload is at most {MOST_IMAGE_BYTES >> 20} MiB")
        try:
            data = base64.b64decode(parameter["contentBase64"], validate=True)
        except ValueError:
            raise ApiError(400, "contentBase64 is no base64") from None
        media = _media_type(data)
        identifier = f"file-{uuid.uuid4().hex[:12]}"
        self._files[client, identifier] = media, data
        self._bytes += len(data)
        while len(self._files) > MOST_UPLOADS or self._bytes > MOST_UPLOAD_BYTES:
            self._bytes -= len(self._files.pop(next(iter(self._files)))[1])
        return {"identifier": identifier, "fileType": "image" if media.startswith("image/") else "unknown",
                "sizeBytes": len(data)}

    def get(self, client: str, identifier) -> tuple[str, bytes] | None:
        return self._files.get((client, identifier)) if isinstance(identifier, str) else None


def _media_type(data: bytes) -> str:
    for magic, media in ((b"\x89PNG", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF8", "image/gif"),
                         (b"BM", "image/bmp")):
        if data.startswith(magic):
            return media
    return "image/webp" if data[:4] == b"RIFF" and data[8:12] == b"WEBP" else "application/octet-stream"


class Prediction(Answering):
    """A predict channel's messages, each a line of its frame (a frame that says several is sent as several):
    the prompt's reading as progress, the text as fragments (their tokens counted, those a draft gave marked),
    thinking as reasoning fragments, each tool call as its start and end, and `success` with the stats; a
    cancelled prediction ends in `success` too, stopped by the user, as the SDK waits for one."""

    media_type = "application/x-ndjson"
    token_ids = True  # (each piece carries its tokens: counted, and marked where a draft made them)
    shows_reading = True

    def __init__(self, channel_id, chat: bool, model: str, parsed: Parsed, session: Session, info: dict):
        super().__init__(chat, model)
        self.channel_id, self.session, self.info = channel_id, session, info
        self.config = {"fields": [{"key": "llm.prediction.temperature",
                                   "value": parsed.request.sampling.temperature}]}

    def _frame(self, *messages: dict) -> str:
        return "".join(json.dumps(channel_send(self.channel_id, message), ensure_ascii=False) + "\n"
                       for message in messages)

    def reading(self, job: Job, reading: Reading) -> list[str]:
        return [self._frame({"type": "promptProcessingProgress",
                             "progress": reading.read / reading.total if reading.total else 1.0})]

    def _fragment(self, text: str, tokens: Iterable[Token], kind: str) -> str:
        """A piece of the answer; one without text counts the tokens whose text is no answer's (a tool call's):
        structural, as LM Studio marks such."""
        tokens = list(tokens)
        return self._frame({"type": "fragment", "fragment": {
            "content": text, "tokensCount": len(tokens), "containsDrafted": any(t.from_draft for t in tokens),
            "reasoningType": kind, "isStructural": not text}})

    def piece(self, text: str, tokens=()) -> str:
        return self._fragment(text, tokens, "none")

    def thought(self, text: str) -> str:
        return self._fragment(text, (), "reasoning")

    def call(self, call: ToolCall, index: int) -> str:
        request = {"type": "function", "id": call.id, "name": call.name, "arguments": call.argument_values}
        return self._frame({"type": "toolCallGenerationStart", "toolCallId": call.id},
                           {"type": "toolCallGenerationEnd", "toolCallRequest": request})

    def error(self, failure: ApiError) -> str:
        if failure.code == "cancelled":
            return self._success({"stopReason": "userStopped"})
        return self._frame({"type": "error", "error": error(failure.message)})

    def closing(self, job: Job, called: bool) -> list[str]:
        summary = job.recorder.summary()
        stats = {"stopReason": stop_reason(job.recorder, called), "tokensPerSecond": summary.tokens_per_second,
                 "timeToFirstTokenSec": summary.prefill_seconds,
                 "totalTimeSec": summary.prefill_seconds + summary.decode_seconds,
                 "promptTokensCount": summary.prompt_tokens, "predictedTokensCount": summary.tokens,
                 "totalTokensCount": summary.prompt_tokens + summary.tokens}
        if summary.drafted:
            draft = used_draft(summary, self.session)
            stats |= ({"usedDraftModelKey": draft} if draft else {}) | {
                "totalDraftTokensCount": summary.drafted, "acceptedDraftTokensCount": summary.accepted,
                "rejectedDraftTokensCount": summary.drafted - summary.accepted, "ignoredDraftTokensCount": 0}
        return [self._success(stats)]

    def _success(self, stats: dict) -> str:
        return self._frame({"type": "success", "stats": stats, "modelInfo": self.info,
                            "loadModelConfig": load_config(self.session), "predictionConfig": self.config})
