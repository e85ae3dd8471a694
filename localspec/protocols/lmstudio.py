"""LM Studio's own REST API beside OpenAI's on the same port, as clients set up for LM Studio call it: Zed lists
models at /api/v0/models (reading each one's state, context lengths and capabilities) and chats at
/api/v0/chat/completions; Cline reads /api/v0/models for the context window. Its requests and streams are OpenAI's;
a whole answer carries LM Studio's `stats` (its speculative decoding counts among them), `model_info` and `runtime`
beside OpenAI's fields."""

import math
from pathlib import Path

from .. import __version__, store
from ..config import DrafterKind
from ..errors import UsageError
from ..service import Job
from ..session import Session
from ..store import GGUFInfo, ModelEntry
from . import openai
from .shared import ApiError, Parsed

# LM Studio's stop reasons (its SDK's LLMPredictionStopReason) for the recorder's finish reasons
STOP_REASONS = {"stop": "eosFound", "length": "maxPredictedTokensReached", "context": "contextLengthReached"}


def model_object(name: str, info: GGUFInfo, entry: ModelEntry | None, session: Session | None, loading: bool) -> dict:
    """/api/v0/models/{id}: a model that can be served, as LM Studio describes one (Zed refuses a list whose entries
    lack id, object, type, publisher, compatibility_type or state)."""
    vision = session is not None and session.info.vision
    kind = "embeddings" if not info.generates else "vlm" if vision else "llm"
    capabilities = store.capabilities(info, session.prompts.template if session else None)
    out = {"id": name, "object": "model", "type": kind,
           "publisher": entry.repo.split("/")[0] if entry and entry.repo else info.get("general.organization") or "local",
           "arch": info.architecture, "compatibility_type": "gguf", "quantization": info.quantization,
           "state": "loaded" if session else "loading" if loading else "not-loaded",
           "max_context_length": info.context_length or 0,
           "capabilities": ["tool_use"] * ("tools" in capabilities) + ["vision"] * vision}
    if session is not None:
        out["loaded_context_length"] = session.info.n_ctx
    return out


def ttl(body: dict) -> float | None:
    """LM Studio's `ttl`: the seconds a model stays loaded once idle, as Ollama's keep_alive (None: as it is)."""
    value = body.get("ttl")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 and value != -1:
        raise ApiError(400, f"ttl is a number of seconds a model stays loaded once idle (-1: while serve runs),"
                       f" not {value!r}", param="ttl")
    return math.inf if value == -1 else float(value)


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


class Reply(openai.Reply):
    """OpenAI's answer, a whole one with LM Studio's stats, model_info and runtime beside it (its stream's chunks
    carry none, as LM Studio's carry none)."""

    def __init__(self, chat: bool, model: str, parsed: Parsed, session: Session):
        super().__init__(chat, model, parsed.include_usage, parsed.thinking_apart, parsed.echo, parsed.choices,
                         parsed.token_ids)
        self.session = session

    def full(self, job: Job) -> dict:
        whole = super().full(job)
        recorder, info = job.recorder, self.session.target_info
        called = whole["choices"][0]["finish_reason"] == "tool_calls"
        stop = "toolCalls" if called else "stopStringFound" if recorder.stop_sequence else STOP_REASONS[
            recorder.finish_reason]
        seconds = recorder.decode_seconds
        stats = {"tokens_per_second": recorder.tokens / seconds if seconds > 0 else 0.0,
                 "time_to_first_token": recorder.prefill_seconds, "generation_time": seconds, "stop_reason": stop}
        summary = recorder.summary()
        if summary.drafted:  # (the draft model named where it drafted: n-gram lookup and the rest need none)
            by_model = DrafterKind.DRAFT in summary.drafters
            stats |= ({"draft_model": self.session.info.draft} if by_model else {}) | {
                "total_draft_tokens_count": summary.drafted, "accepted_draft_tokens_count": summary.accepted,
                "rejected_draft_tokens_count": summary.drafted - summary.accepted, "ignored_draft_tokens_count": 0}
        return whole | {
            "stats": stats,
            "model_info": {"arch": info.architecture, "quant": info.quantization, "format": "gguf",
                           "context_length": self.session.info.n_ctx},
            "runtime": {"name": "localspec-llama.cpp-" + "-".join(self.session.plan.target.held_by).lower(),
                        "version": __version__,
                        "supported_formats": ["gguf"]}}
