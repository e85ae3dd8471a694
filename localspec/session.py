"""Wires a target and a drafter together and hands out generations.

A Session owns the llama.cpp objects for one target (and draft) and can run
many generations on them; the caller iterates events and never touches the engine.
"""

import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, nullcontext
from dataclasses import dataclass, fields, replace
from pathlib import Path

from .config import (DrafterKind, Limits, Runtime, Sampling, Speculation, Thinking, check_draft_fits, held_types, meant,
                     of_its_type, overridden)
from .drafting import Drafters, Steering, speculating
from .engine import rpc
from .engine.speculative import generate
from .engine.library import ctrl_c_held
from .engine.together import alone
from . import reasoning, store, tool_calls
from .errors import ContextOverflow, LocalspecError, UsageError
from .events import Done, Event, Logprobs, Prefill
from .store.gguf_meta import GGUFInfo
from .loading import load_models, place, sized
from .store.placement import Placement
from .chat_template import checked as checked_template
from .prompts import Prepared, Prompts, is_message
from .request import Request
from .scheduler import Scheduler
from .scoring import Scoring
from .slots import Releasing, Slots
from .stats import Recorder, Summary, record

# what a chat template writes beside the messages' text, at most (markers, a default system prompt, instructions for
# the tools): a conversation whose text and this cannot reach a budget of tokens is known to fit without tokenizing it
TEMPLATE_BYTES_A_MESSAGE = 128
TEMPLATE_BYTES = 2048


@dataclass(frozen=True)
class Info:
    """What a face may know of a loaded session: the model files it runs, and their context and vocabulary."""

    target: str  # the target's file name
    draft: str | None  # the draft model's, when one drafts
    mtp: bool  # whether the target's own MTP layers draft
    n_ctx: int
    n_vocab: int
    vision: bool = False  # whether it reads images (a projector that sees was loaded)
    audio: bool = False  # whether it reads audio (a projector that hears)


@dataclass(frozen=True)
class Reply:
    """A whole generation: its text (a reasoning model's answer), why it ended ("stop", "length" or "context"),
    its statistics, a reasoning model's thinking, and each answer token's logprobs where asked for."""

    text: str
    finish_reason: str
    summary: Summary
    reasoning: str = ""
    logprobs: tuple[Logprobs, ...] = ()

    @classmethod
    def of(cls, recorder: Recorder) -> "Reply":
        return cls(recorder.text, recorder.finish_reason, recorder.summary(), recorder.reasoning,
                   tuple(recorder.logprobs))


def load(target: str, draft: str | None = None, *, spec: str = "auto", offline: bool = False, progress=None,
         chat_template: str | None = None, **settings) -> "Session":
    """A target (and draft) opened as `localspec run` opens them: by registry name, local .gguf file,
    hf:owner/repo/file.gguf or owner/repo:QUANT, downloaded first when missing (progress(done, total)
    hears of it). draft and spec as speculating() takes them. settings: Runtime's and Speculation's
    fields by name (ctx_size, threads, gpu_layers, devices, draft_max, p_min, cache_type_k, ...), config's defaults
    for the rest; chat_template: a Jinja template to render conversations with in place of the target's own.
    Close the session (or use it in a with block) to free the models."""
    for what, value in (("target", target), ("draft", draft)):
        if not isinstance(value, (str, os.PathLike)) and (value is not None or what == "target"):
            raise UsageError(f"load()'s {what} is a model's name or file, got {value!r}")
    drafting, draft_model = speculating(draft if draft is None else str(draft), spec)
    runtime_fields = {f.name for f in fields(Runtime)}
    speculation_fields = {f.name for f in fields(Speculation)} - {"drafting", "required"}
    unknown = sorted(set(settings) - runtime_fields - speculation_fields)
    if unknown:
        hint = meant(unknown[0], runtime_fields | speculation_fields)
        raise UsageError(f"load() takes no setting {', '.join(unknown)}" + (f": {hint}" if hint else "; it takes"
                         f" {', '.join(sorted(runtime_fields | speculation_fields))}"))
    kinds = held_types(Runtime) | held_types(Speculation)
    settings = {name: of_its_type(name, value, kinds[name]) for name, value in settings.items()}
    runtime = Runtime(**{name: value for name, value in settings.items() if name in runtime_fields})
    speculation = Speculation(drafting, draft is not None or spec == "fixed",
                              **{name: value for name, value in settings.items() if name in speculation_fields})
    return open_session(str(target), draft_model, runtime, speculation, offline, progress,
                        chat_template=chat_template and checked_template(chat_template, "chat_template"))


def open_session(
    target: str, draft_model: str | None, runtime: Runtime, speculation: Speculation, offline: bool = False,
    progress=None, loading=nullcontext, on_abort: Callable[[str], None] | None = None, chat_template: str | None = None,
) -> "Session":
    """Resolve, fetch and check the pair, place it (loading.place), then load it.

    loading(text): a context shown while the models load (a spinner), after any download.
    on_abort(message): should llama.cpp abort later (an RPC worker that stopped answering), called with
    its message and what is known of why, before the process ends with EngineError's code; None leaves
    llama.cpp's own backtrace. chat_template: as Session's.
    """
    placed = place(target, draft_model, runtime, speculation, offline, progress, on_abort)
    pair = placed.pair
    with loading(f"loading {' and '.join(info.path.name for info in placed.placement.models)}"):
        return Session(pair.target.path, pair.draft.path if pair.draft else None, placed.runtime, speculation,
                       placed.placement, placed.workers, chat_template)


class Session(Steering, Slots, Scoring):
    """A loaded target (and its drafters) that generates, in any mode of drafting: plain, the target alone; ngram,
    draft, mtp, ...: always with that drafter; auto: each step plain or whichever drafter is expected to pay most.
    It starts with speculation.drafting; chat's /draft and bench switch with use().

    The facade of its parts: Steering (drafting.py: the mode, the longest draft, what it learns and remembers),
    Slots (slots.py: the sequence a generation runs on, held while it runs; llama-server's slots), Scoring
    (scoring.py: log probabilities, embeddings, a reranker's scores). Loading is loading.py's, prompts
    prompts.py's."""

    def __init__(self, target: Path, draft: Path | None, runtime: Runtime, speculation: Speculation,
                 placement: Placement | None = None, workers: rpc.Workers | None = None, chat_template: str | None = None):
        """draft: the draft model's GGUF, or None (n-gram lookup needs none). placement: where they run
        (open_session's); None: placed here, with runtime's workers added first. chat_template: the one to render
        conversations with in place of the target's own (llama.cpp's --chat-template)."""
        runtime = sized(runtime, placement.models[0] if placement else store.header(target))
        check_draft_fits(speculation, runtime)
        started = time.perf_counter()
        self._owned: list = []
        self.closed = False
        # the sequences a generation runs on, each to its thread and the Scheduler that runs it (None: alone)
        self._generating: dict[int, tuple[threading.Thread, object]] = {}
        self._holding = threading.Lock()
        self.drafting: Drafters | None = None  # made once the models are loaded
        self._filled_by: dict[int, str | None] = {}  # the client whose prompts each sequence's cache holds
        try:
            with ctrl_c_held() as pressed:
                loaded = load_models(target, draft, runtime, speculation, placement, workers, self._owned)
            if pressed:
                raise KeyboardInterrupt
            self.plan, self.notes = loaded.placement, loaded.notes
            self.target_model, self.target, self.sequences = loaded.target_model, loaded.target, loaded.sequences
            self.vision = loaded.vision
            self.prompts = Prompts(self.target_model, self.target.n_ctx, chat_template, loaded.vision)
            if hint := reasoning.unread_thinking(self.prompts.template):
                self.notes.append(f"its chat template seems to have it think ({hint!r}) in a form localspec does not"
                                  " read: any thinking stays in the answer")
            self._runtime = runtime  # (for the contexts made later: embedding, scoring)
            self.drafting = Drafters(loaded.plan, loaded.speculation, self.sequences, loaded.costly, loaded.settings)
            self.adapters, self._steering = loaded.adapters, loaded.steering
            self.lora_applied = (0.0,) * len(self.adapters)  # the scales the target's context computes with
            self._adapt(self.adapters.scales)
            self.load_seconds = time.perf_counter() - started  # the models' load (Ollama's load_duration)
        except BaseException:
            self.close()
            raise

    def lora_scales(self, request: Request) -> tuple[float, ...]:
        """The LoRA adapters' scales a request is answered with (UsageError for an adapter not loaded)."""
        return self.adapters.scales_of(request.lora)

    def _adapt(self, scales: tuple[float, ...]) -> None:
        """Have the target compute with the adapters at these scales from now on. Its caches were read under
        others: every one is emptied (nothing else may generate meanwhile: the Scheduler sees to it), and prompts
        are read back from disk, and kept there, among those read under the same scales."""
        if scales == self.lora_applied:
            return
        self.adapters.apply(self.target, scales)
        self.lora_applied = scales
        self.reset()
        variant = self.adapters.variant(scales)
        for view in self.sequences:
            if view.prompt_cache is not None:
                view.prompt_cache = view.prompt_cache.beside(variant)

    def _own(self, resource):
        self._owned.append(resource)
        return resource

    def prepare(self, request: Request) -> Prepared:
        """A request made ready to generate (Prompts.prepare); UsageError for a model that only embeds."""
        info = self.target_info
        if not info.generates:  # llama.cpp would abort the process when asked for its logits
            raise UsageError(f"{info.path.name} is a reranker ({info.architecture}): it scores documents against a"
                             " query (serve's /v1/rerank) and does not generate text" if info.ranks else
                             f"{info.path.name} is an embedding model ({info.architecture}): it embeds text (serve's"
                             " /v1/embeddings and /api/embed) and does not generate any")
        return self.prompts.prepare(request)

    @property
    def thinks(self) -> bool:
        """Whether the target is a reasoning model (its template thinks)."""
        return self.prompts.thinks

    def count_tokens(self, request: Request) -> int:
        """How many tokens the request's prompt is, as the model reads it."""
        return len(self.prepare(request).tokens)

    def generate(self, request: Request) -> Iterator[Event]:
        """The events of one generation: Prefill, then Token and Step as they come, then Done. A prediction
        drafts wherever the output follows it (plain decoding leaves it unused). To run several at once on
        a session of several sequences, hand them to a Scheduler instead."""
        prepared = self.prepare(request)
        # (where another generation holds the first sequence, a scheduler's or a stream not yet finished, a free one)
        sequence = self.sequence_for(prepared.tokens, self._generating) if 0 in self._generating \
            and len(self.sequences) > 1 else 0
        events = self.generation(prepared, sequence)
        return alone(events) if len(self.sequences) > 1 else events

    def scheduler(self) -> Scheduler:
        """Several requests at once, one on each of the session's sequences (load(..., parallel=N)), their rows
        decoded in one batch a step."""
        return Scheduler(self)

    def generation(self, prepared: Prepared, sequence: int, scheduler: Scheduler | None = None) -> Iterator:
        """A prepared request's generation on one of the session's sequences (0 .. parallel - 1): its events
        with Turns between them where the session has several, for the Scheduler that runs it (scheduler) to
        decode the sequences' rows together."""
        release = self._hold(sequence, scheduler)
        try:
            events = self._generation(prepared, sequence)
        except BaseException:
            release()
            raise
        return Releasing(events, release)

    def _generation(self, prepared: Prepared, sequence: int) -> Iterator:
        request = prepared.request
        self._adapt(self.lora_scales(request))
        if request.client is not None:  # it drafts from its own client's earlier answers only
            self.remember_as(request.client)
        speculation = self.speculation if request.draft_max is None else self._with_draft_max(request.draft_max)
        drafter = self.drafting.of(sequence, prepared.prediction, request.drafting, speculation)
        limits = request.limits

        def generating(prompt: list[int], limits: Limits, sampling: Sampling = prepared.sampling) -> Iterator:
            events = generate(self.sequences[sequence], drafter, prompt, sampling, speculation, limits)
            return self.drafting.remembering(events, prompt)

        def going_on(made: list[int]) -> Iterator:
            """After a reasoning budget's closing: the prompt and the reply so far are all but read already."""
            left = None if limits.max_tokens is None else limits.max_tokens - len(made)
            if left is not None and left < 1:
                return iter([Done("length", "", 0.0)])
            return generating(prepared.tokens + made, replace(limits, max_tokens=left), prepared.answer_sampling)

        events = tool_calls.shown(generating(prepared.tokens, limits), prepared.tool_format,
                                  self.target_model.control_text)
        if prepared.reasoning_plan is None:
            return events
        return reasoning.split(events, prepared.reasoning_plan, self.target_model.control_text, going_on)

    def stream(self, prompt: str | list[dict] | list[int], raw: bool = False, sampling: Sampling | None = None,
               limits: Limits | None = None, **options) -> Iterator[Event]:
        """A generation's events for a prompt (see prompt_tokens). options: temperature, top_k, top_p, min_p,
        seed, the penalties (repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty), logit_bias ({token id
        or text: bias}, -inf bans), ignore_eos, DRY (dry_multiplier, dry_base, dry_allowed_length,
        dry_penalty_last_n, dry_sequence_breakers), XTC (xtc_probability, xtc_threshold), typical_p, dynamic
        temperature (dynatemp_range, dynatemp_exponent), top_n_sigma, mirostat (mirostat, mirostat_tau,
        mirostat_eta), logprobs (each token's, and that many likeliest beside it; logprobs_sampled: in the
        distribution it was chosen from), max_tokens, stop, over sampling and limits (by default config's,
        llama.cpp's defaults)."""
        sampling, limits = overridden(sampling or Sampling(), limits or Limits(), **options)
        return self.generate(Request(sampling, limits, prompt=self.prompts.prompt_tokens(prompt, raw)))

    def complete(self, prompt: str | list[dict] | list[int], raw: bool = False, **options) -> Reply:
        """A whole generation for a prompt, as stream() makes it."""
        return Reply.of(record(self.stream(prompt, raw, **options)))

    def chat(self, system: str | None = None, sampling: Sampling | None = None,
             limits: Limits | None = None, thinking: Thinking | None = None,
             opening: Sequence[dict] = (), template_variables: dict | None = None) -> "Conversation":
        """A conversation with history on this session (opening: turns before the first, after the system
        prompt: a made model's MESSAGEs; template_variables: as a Request's)."""
        return Conversation(self, system, sampling or Sampling(), limits or Limits(), thinking or Thinking(), opening,
                            template_variables)

    @property
    def info(self) -> Info:
        draft = self.drafting.costly.get(DrafterKind.DRAFT)
        return Info(self.target_model.path.name, draft.context.model.path.name if draft else None,
                    DrafterKind.MTP in self.drafting.costly, self.target.n_ctx, self.target_model.n_vocab,
                    self.vision is not None and self.vision.sees, self.vision is not None and self.vision.hears)

    def model_files(self) -> tuple[Path, ...]:
        """The target's file, then the draft model's where one drafts."""
        draft = self.drafting.costly.get(DrafterKind.DRAFT)
        return (self.target_model.path.resolve(), *((draft.context.model.path.resolve(),) if draft else ()))

    @property
    def target_info(self) -> GGUFInfo:
        """The target's GGUF header, as read when the session was placed."""
        return self.plan.models[0]

    @property
    def busy_seconds(self) -> float:
        """Seconds this session's contexts (the target's, the draft model's, the MTP block's) have spent
        inside llama_decode: what the host's share of a step is measured against."""
        contexts = [self.target] + self.drafting.contexts
        return sum(context.busy_seconds for context in contexts)

    def warm(self) -> None:
        """Read now what a first request would otherwise wait for: the longest token of the vocabulary
        (up to a second), which the refusal of prompts too long for the context needs, and the special tokens a long
        prompt's tokens are resumed at (0.1-0.4 s)."""
        self.target_model.longest_token  # noqa: B018 (cached properties, read for their cost)
        self.target_model.prefixes  # noqa: B018

    def placement(self) -> dict:
        """Where each model runs and where its rows are sampled, for reports."""
        report = self.plan.report(draft=self.drafting.with_files, sampling="backend" if self.target.on_backend
                                  else "host", drafting=self.mode)
        if len(self.adapters):  # (the scales its latest generation computed with)
            report["target"]["lora"] = [{"path": str(path), "scale": scale}
                                        for path, scale in zip(self.adapters.paths, self.lora_applied)]
        if self.vision is not None:
            report["target"]["mmproj"] = str(self.vision.path)
        return report

    def describe(self) -> str:
        """Which files generate and what drafts for them, for the panel and summary line."""
        adapted = "".join(f" + {path.name}" + (f" x{scale:g}" if scale != 1 else "")
                          for path, scale in zip(self.adapters.paths, self.lora_applied) if scale)
        seeing = f" + {self.vision.path.name}" if self.vision is not None else ""
        return f"{self.target_model.path.name}{adapted}{seeing} ({self.drafting.describe()})"

    def close(self) -> None:
        if self._owned and self.drafting is not None:
            self.drafting.close(self._runtime.threads)
        for resource in reversed(self._owned):
            resource.close()
        self._owned.clear()
        self.closed = True
        # what used its models says it is closed (a closed llama.cpp model, used, ended the process)
        self.target_model = self.target = self.sequences = self.prompts = self.drafting = _Closed()

    def __enter__(self):
        if self.closed:
            raise UsageError(CLOSED)
        return self

    def __exit__(self, *exc):
        self.close()


CLOSED = "this session is closed (its models let go): load() another"


class _Closed:
    """A closed session's models: any use of them a UsageError."""

    def _refused(self, *_):
        raise UsageError(CLOSED)

    __getattr__ = __getitem__ = __iter__ = __len__ = _refused


def without_oldest_turns(session, messages: list[dict], budget: int, like: Request = Request()) -> list[dict]:
    """The conversation without as few of its oldest turns (a user message and what answered it) as bring its
    prompt within budget tokens, as Ollama's truncate drops them; never its system prompt or its latest turn
    (one that is over alone is left to the generation to refuse). One whose text could not come to budget
    tokens (a token spells a byte or more) is not tokenized. session: what counts a request's tokens (a Session,
    or the serve a chat goes through); like: the request whose prompt it is (its thinking, tools and template
    variables shape it)."""
    def tokens(kept: list[dict]) -> int:
        try:
            return session.count_tokens(replace(like, messages=kept))
        except ContextOverflow:  # too long to be worth tokenizing
            return budget + 1

    spelled = sum(len(str(m.get("content") or "").encode()) + TEMPLATE_BYTES_A_MESSAGE for m in messages)
    if like.tools:
        spelled += len(json.dumps(like.tools.definitions).encode())
    if like.template_variables:
        spelled += len(json.dumps(like.template_variables, default=str).encode())
    if len(messages) < 2 or spelled + TEMPLATE_BYTES <= budget or tokens(messages) <= budget:
        return messages
    head = messages[:1] if messages[0]["role"] == "system" else []
    starts = [i for i in range(len(head) + 1, len(messages)) if messages[i]["role"] == "user"]
    low, high = 0, len(starts) - 1  # (fewer turns, fewer tokens: the first start that fits, or the last)
    while low < high:
        middle = (low + high) // 2
        if tokens(head + messages[starts[middle]:]) <= budget:
            high = middle
        else:
            low = middle + 1
    return head + messages[starts[low]:] if starts else messages


class Conversation:
    """A chat with history. Each turn renders the whole conversation with the model's chat template; the
    KV caches keep what earlier turns read, so only the new turn is read. `recorder` folds every turn's
    events (the chat's statistics; its text is the latest reply's), `turn` the latest turn's. A reasoning
    model's replies join the history with their thinking apart (reasoning_content), for its template to
    write back or drop as it does; thinking: how it thinks (chat's /think and /no-think change it);
    template_variables: more its chat template reads (a Request's)."""

    def __init__(self, session: Session, system: str | None, sampling: Sampling, limits: Limits,
                 thinking: Thinking = Thinking(), opening: Sequence[dict] = (), template_variables: dict | None = None):
        if system is not None and not isinstance(system, str):
            raise UsageError(f"a system prompt is a text, got {type(system).__name__}")
        if isinstance(opening, str | dict) or not all(is_message(message) for message in opening):
            raise UsageError('opening turns are messages, each {"role": "user" or "assistant", "content": text},'
                             f" got {str(opening)[:60]}")
        self.session, self.system, self.sampling, self.limits = session, system, sampling, limits
        self.thinking, self.opening, self.template_variables = thinking, list(opening), template_variables
        self.recorder = self.turn = Recorder()
        self.dropped = 0  # the oldest turns the latest message dropped to fit the context
        self.clear()

    def clear(self) -> None:
        """Forget the conversation; the system prompt and the opening turns stay."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        self.messages: list[dict] = system + [dict(message) for message in self.opening]

    def stream(self, text: str, images: Sequence[bytes] = (), **options) -> Iterator[Event]:
        """The reply's events (options as Session.stream's); images: image files' bytes the message carries
        (before its text). The reply joins the conversation as far as it got, also when Ctrl-C or the caller
        stops it early; a turn that fails before the model answers leaves the conversation as it was."""
        if not isinstance(text, str):
            raise UsageError(f"a message is a text, got {type(text).__name__}")
        sampling, limits = overridden(self.sampling, self.limits, **options)
        before = list(self.messages)  # (a refused turn leaves them so: the oldest turns dropped to fit it too)
        self.messages.append({"role": "user", "content": text} | ({"images": list(images)} if images else {}))
        self.turn = Recorder()
        self.dropped = 0
        started = failed = False  # the recorder's text is this reply's from its Prefill on, the last reply's before
        try:
            self.dropped = self._fit(limits)
            # closed with this stream, not whenever the generation is collected: its sequence is free for the next turn
            with closing(self.session.generate(self._request(sampling, limits))) as events:
                for event in events:
                    self.recorder.add(event)
                    self.turn.add(event)
                    started = started or isinstance(event, Prefill)
                    yield event
        except LocalspecError:
            failed = True
            self.recorder.interrupt()
            self.messages[:], self.dropped = before, 0
            raise
        except BaseException:  # Ctrl-C, or the caller closed the stream
            self.recorder.interrupt()
            self.turn.interrupt()
            raise
        finally:
            if not failed:
                thought = self.recorder.reasoning if started else ""
                self.messages.append({"role": "assistant", "content": self.recorder.text if started else ""}
                                     | ({"reasoning_content": thought} if thought else {}))

    def _fit(self, limits: Limits) -> int:
        """Where the conversation and room for a reply (its max_tokens, at most a quarter of the context)
        would not fit the context, drop its oldest turns (a user message and what answered it; never the
        system prompt or the latest message), as Ollama does, until the prompt takes at most half the
        context, as llama.cpp's context shift keeps half: the turns after are read from the cache again
        until it fills. How many turns were dropped; a message that cannot fit alone is left to the
        generation to refuse (ContextOverflow)."""
        n_ctx = self.session.info.n_ctx
        room = min(limits.max_tokens or n_ctx, n_ctx // 4)
        asked = self._request(self.sampling, limits)
        if without_oldest_turns(self.session, self.messages, n_ctx - room, asked) is self.messages:
            return 0
        kept = without_oldest_turns(self.session, self.messages, n_ctx // 2, asked)
        dropped = sum(m["role"] == "user" for m in self.messages) - sum(m["role"] == "user" for m in kept)
        self.messages[:] = kept
        return dropped

    def _request(self, sampling: Sampling, limits: Limits) -> Request:
        return Request(sampling, limits, messages=self.messages, thinking=self.thinking,
                       template_variables=self.template_variables)

    def send(self, text: str, images: Sequence[bytes] = (), **options) -> Reply:
        """The whole reply to one message."""
        for _ in self.stream(text, images, **options):
            pass
        return Reply.of(self.turn)
