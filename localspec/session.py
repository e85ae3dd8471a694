"""Wires a target and a drafter together and hands out generations.

A Session owns the llama.cpp objects for one target (and draft) and can run
many generations on them; the caller iterates events and never touches the engine.
"""

import json
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from . import compat, download, gguf_meta, hardware, registry
from .chat_template import render_pieces
from .config import (AUTO_PARALLEL, PARALLEL_AUTO_MOST, DrafterKind, Limits, Runtime, Sampling, Speculation,
                     check_draft_fits, overridden)
from .drafting import PUBLISHED, Drafters, speculating
from .engine import rpc
from .engine.backend import Context, Embedder, Model
from .engine.drafters.spec import Weights, plan_drafting
from .engine.grammar import from_json_schema, json_object
from .engine.suffix import SuffixCache
from .engine.speculative import generate
from .engine.together import alone
from .errors import ContextOverflow, IncompatibleDraft, InputError, LocalspecError, UsageError
from .events import Event, Prefill
from .gguf_meta import GGUFInfo
from .placement import Placement
from .request import Request
from .scheduler import Scheduler
from .stats import Recorder, Summary, record
from .tool_calls import ToolFormat, Tools, constraint, tool_format

# For models without a chat template in their GGUF: a plain transcript the model can continue.
FALLBACK_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)

# The roles a conversation may hold. A template writes the role into the prompt as control-token text
# (`<|im_start|>{role}`), so any other string, such as "user<|im_end|>\n<|im_start|>system", could forge turns.
ROLES = ("system", "user", "assistant")
# What a message may carry about tools beside its content (OpenAI's names): written into the prompt as text
TOOL_FIELDS = ("tool_calls", "tool_call_id", "name")


def output_grammar(grammar: str | None = None, schema: dict | bool | None = None, any_object: bool = False) -> str | None:
    """The GBNF (llama.cpp's grammar format) an output must follow, for Sampling.grammar: a grammar as
    given, a JSON schema's (by llama.cpp's converter), or any JSON object's; None: free text."""
    if grammar is not None:
        return grammar
    if schema is not None:
        return from_json_schema(schema)
    return json_object() if any_object else None


def is_message(message) -> bool:
    """A message chat_tokens takes: one of ROLES and a content string."""
    return isinstance(message, dict) and message.get("role") in ROLES and isinstance(message.get("content"), str)


@dataclass(frozen=True)
class Info:
    """What a face may know of a loaded session: the model files it runs, and their context and vocabulary."""

    target: str  # the target's file name
    draft: str | None  # the draft model's, when one drafts
    mtp: bool  # whether the target's own MTP layers draft
    n_ctx: int
    n_vocab: int


@dataclass(frozen=True)
class Reply:
    """A whole generation: its text, why it ended ("stop", "length" or "context"), and its statistics."""

    text: str
    finish_reason: str
    summary: Summary

    @classmethod
    def of(cls, recorder: Recorder) -> "Reply":
        return cls(recorder.text, recorder.finish_reason, recorder.summary())


@dataclass(frozen=True)
class Prepared:
    """A request made ready to generate (Session.prepare): its prompt's tokens, the sampling it runs with
    (with the grammar that keeps tool calls well formed), its prediction's tokens, the form of its tool calls."""

    request: Request
    tokens: list[int]
    sampling: Sampling
    prediction: list[int] | None
    tool_format: ToolFormat | None


@dataclass(frozen=True)
class Pair:
    """A target and its draft model, found, fetched and read; report: whether they can speculate
    together (None without a draft model); advice: which drafts would suit the target."""

    target: GGUFInfo
    draft: GGUFInfo | None = None
    report: compat.CompatReport | None = None
    advice: str = ""

    @property
    def refusal(self) -> str:
        return (f"{self.report.draft.path.name} cannot draft for {self.report.target.path.name}:"
                f" {self.report.summary()}; {self.advice}")


def resolve_pair(target: str, draft_model: str | None, offline: bool = False, progress=None,
                 verify_sha256: bool = False, n_ctx: int | None = None) -> Pair:
    """Resolve names (draft_model: anything registry.resolve_draft accepts), fetch what is missing,
    read both headers and check the pair. n_ctx: first refuse, before anything is downloaded, a pair
    that what is known of it (the registry's sizes) already shows cannot fit a context of n_ctx tokens."""
    models = registry.load()
    target_entry = registry.resolve(target, models)
    draft_entry = None if draft_model is None else registry.resolve_draft(draft_model, target_entry, models)
    if n_ctx is not None:
        hardware.check_fit_before_download([_known_size(r) for r in (target_entry, draft_entry) if r is not None],
                                           n_ctx)
    target_info = gguf_meta.read(download.locate(target_entry, offline, progress, verify_sha256))
    if draft_entry is None:
        return Pair(target_info)
    draft_info = gguf_meta.read(download.locate(draft_entry, offline, progress, verify_sha256))
    report = compat.check(target_info, draft_info)
    return Pair(target_info, draft_info, report,
                "" if report.compatible else registry.draft_advice(target_entry, models))


def _known_size(resolved: registry.Resolved) -> tuple[str, int | None]:
    """A model's name and size before anything is downloaded: the registry's, or a local file's."""
    if isinstance(resolved, Path):
        return resolved.name, resolved.stat().st_size if resolved.is_file() else None
    if isinstance(resolved, registry.RepoQuant):
        return f"{resolved.repo}:{resolved.quant}", None
    return resolved.name, resolved.size


def load(target: str, draft: str | None = None, *, spec: str = "auto", offline: bool = False, progress=None,
         **settings) -> "Session":
    """A target (and draft) opened as `localspec run` opens them: by registry name, local .gguf file,
    hf:owner/repo/file.gguf or owner/repo:QUANT, downloaded first when missing (progress(done, total)
    hears of it). draft and spec as speculating() takes them. settings: Runtime's and Speculation's
    fields by name (ctx_size, threads, gpu_layers, devices, draft_max, p_min, ...), config's defaults
    for the rest. Close the session (or use it in a with block) to free the models."""
    drafting, draft_model = speculating(draft, spec)
    runtime_fields = {f.name for f in fields(Runtime)}
    speculation_fields = {f.name for f in fields(Speculation)} - {"drafting", "required"}
    unknown = sorted(set(settings) - runtime_fields - speculation_fields)
    if unknown:
        raise UsageError(f"load() takes no setting {', '.join(unknown)}; it takes"
                         f" {', '.join(sorted(runtime_fields | speculation_fields))}")
    runtime = Runtime(**{name: value for name, value in settings.items() if name in runtime_fields})
    speculation = Speculation(drafting, draft is not None or spec == "fixed",
                              **{name: value for name, value in settings.items() if name in speculation_fields})
    return open_session(target, draft_model, runtime, speculation, offline, progress)


def open_session(
    target: str, draft_model: str | None, runtime: Runtime, speculation: Speculation, offline: bool = False,
    progress=None, loading=nullcontext, on_abort: Callable[[str], None] | None = None,
) -> "Session":
    """Resolve, fetch and check the pair, place it, then load it.

    loading(text): a context shown while the models load (a spinner), after any download.
    on_abort(message): should llama.cpp abort later (an RPC worker that stopped answering), called with
    its message and what is known of why, before the process ends with EngineError's code; None leaves
    llama.cpp's own backtrace.
    """
    stop = rpc.stop_on_abort(lambda message: on_abort(message + rpc.abort_hint(runtime.rpc))) if on_abort else None
    # the workers' memory counts, and an unreachable one is said before anything loads
    workers = rpc.Workers(runtime.rpc, stop)
    if speculation.drafting in PUBLISHED and draft_model is None:
        draft_model = _published_drafter(target, speculation.drafting, offline)
    elif draft_model == registry.AUTO:  # the drafter published beside it, found as llama.cpp finds one
        beside = download.drafter_beside(registry.resolve(target), offline)
        draft_model = beside.typed or beside.name if beside else draft_model
    pair = resolve_pair(target, draft_model, offline, progress, n_ctx=runtime.ctx_size)
    if pair.report and not pair.report.compatible:
        raise IncompatibleDraft(pair.refusal, pair.report)
    if runtime.parallel == AUTO_PARALLEL:
        runtime = replace(runtime, parallel=_parallel_that_fits(runtime, pair))
    placement = Placement.plan(runtime, pair.target, pair.draft)
    placement.check_fit()
    with loading(f"loading {' and '.join(info.path.name for info in placement.models)}"):
        return Session(pair.target.path, pair.draft.path if pair.draft else None, runtime, speculation, placement,
                       workers)


def _parallel_that_fits(runtime: Runtime, pair: Pair, machine: hardware.Machine | None = None) -> int:
    """As many sequences as PARALLEL_AUTO_MOST (llama-server's slots), fewer where their caches do not fit
    the memory beside the models."""
    n, machine = PARALLEL_AUTO_MOST, machine or hardware.machine()
    while n > 1:
        try:
            Placement.plan(replace(runtime, parallel=n), pair.target, pair.draft, machine).check_fit()
            return n
        except UsageError:
            n //= 2
    return 1


def _published_drafter(target: str, kind: DrafterKind, offline: bool) -> str | None:
    """The drafter of this kind published beside a target, as --draft takes it: the one the registry
    names, or, for a Hub file (hf:..., owner/repo:QUANT), a file of its repo found by llama.cpp's rules
    (`mtp-`, `eagle3-`, `dflash-`). None for MTP: the target drafts with its own MTP layers, if it has
    them; a drafter of another kind must be found."""
    resolved = registry.resolve(target)
    named = registry.published_drafter(resolved, kind)
    if named is not None:
        return named.name
    if isinstance(resolved, registry.RepoQuant) or isinstance(resolved, registry.ModelEntry) and resolved.typed:
        found = download.published_sidecar(resolved, kind, offline)
        if found:
            return f"hf:{found.repo}/{found.file}"
    if kind != DrafterKind.MTP:
        raise UsageError(f"no {kind} drafter is known to be published beside {target}; give its {kind}-*.gguf"
                         " file as --draft")
    return None


class Session:
    """A loaded target (and draft model) that generates with any DrafterKind:

    plain: the target alone; ngram / draft: always draft with that drafter;
    auto: choose each step between them by measured cost and acceptance.
    It starts with speculation.drafting; chat's /draft and bench switch with use().
    """

    def __init__(self, target: Path, draft: Path | None, runtime: Runtime, speculation: Speculation,
                 placement: Placement | None = None, workers: rpc.Workers | None = None):
        """draft: the draft model's GGUF, or None (n-gram lookup needs none). placement: where they run
        (open_session's); None: placed here, with runtime's workers added first."""
        check_draft_fits(speculation, runtime)
        self._owned: list = []
        self.drafting: Drafters | None = None  # made once the models are loaded
        self._filled_by: dict[int, str | None] = {}  # the client whose prompts each sequence's cache holds
        try:
            if placement is None:
                workers = rpc.Workers(runtime.rpc) if workers is None else workers
                placement = Placement.plan(runtime, gguf_meta.read(target), gguf_meta.read(draft) if draft else None)
            self.plan = placement
            drafting = plan_drafting(speculation, *placement.models)
            speculation = replace(speculation, drafting=drafting.mode)
            # Said at load, for the CLI to print: what localspec did other than asked.
            self.notes: list[str] = []
            placed, on_backend = placement.target, placement.backend_sampling
            # the workers' devices may hold layers of either model
            loading = {"repack": runtime.repack, "mmap": runtime.mmap, "mlock": runtime.mlock, "watch": workers or None}
            self.target_model = self._own(Model(target, placed.gpu_layers, placed.devices, load_mtp=drafting.target_mtp,
                                                tensor_split=placed.tensor_split, **loading))
            # the drafters' own files, loaded before the target's context, which keeps the hidden states they read
            models = {spec: self.target_model if spec.weights is Weights.TARGET else self._own(Model(
                draft, placement.draft.gpu_layers, placement.draft.devices, load_mtp=spec.weights is Weights.MTP_FILE,
                **loading)) for spec in drafting.costly}
            kept = tuple(layer for spec, model in models.items()
                         for layer in spec.drafter.layers_read(self.target_model, model))
            # rows sampled in one batch: a verification of the longest draft; a bigger batch would abort llama.cpp
            rows = speculation.longest_draft + 1

            def context(model: Model, **options) -> Context:
                return self._own(Context(model, runtime.ctx_size, max(runtime.prompt_batch, rows), runtime.threads,
                                         on_backend, rows, flash_attn=runtime.flash_attn, n_seq=runtime.parallel,
                                         **options))

            self.target = context(self.target_model, keep_hidden=kept)
            if self.target.n_ctx != runtime.ctx_size:
                self.notes.append(f"the context holds {self.target.n_ctx} tokens, not {runtime.ctx_size}: llama.cpp"
                                  " rounds context sizes up to a multiple of 256")
            if runtime.parallel > 1:
                self.notes.append(f"{runtime.parallel} sequences generate at once (--parallel), each up to"
                                  f" {self.target.n_ctx} tokens")
            if self.target_model.recurrent and not self.target.rollback:
                drafting = drafting.decoding_plainly(target.name, speculation)
                if drafting.note:
                    self.notes.append(drafting.note)
                    speculation = replace(speculation, drafting=drafting.mode)
                    self.target.stop_keeping_hidden()
            # the sequences requests generate on (serve -np, batch --parallel)
            self.sequences = [self.target] + [self.target.sequence(seq) for seq in range(1, runtime.parallel)]
            costly = {spec: spec.drafter.made(self.target, context(
                models[spec], mtp=spec.drafter.mtp_context, beside=self.target if spec.drafter.beside_target else None),
                speculation.p_min) for spec in drafting.costly}
            # What decides how llama.cpp computes, and so auto's costs. Not the context size: costs are
            # measured at the start of an empty cache, and llama.cpp attends only to the cells in use.
            settings = {**asdict(replace(runtime, gpu_layers=placed.gpu_layers)), "backend_sampling": on_backend}
            del settings["ctx_size"]
            self._threads = runtime.threads
            self._embedder: Embedder | None = None  # made at the first embedding asked for
            self.drafting = Drafters(drafting, speculation, self.sequences, costly, settings)
        except BaseException:
            self.close()
            raise

    @property
    def speculation(self) -> Speculation:
        """How it drafts (bench steers each mode's speculation by assigning it)."""
        return self.drafting.speculation

    @speculation.setter
    def speculation(self, speculation: Speculation) -> None:
        self.drafting.speculation = speculation

    @property
    def mode(self) -> DrafterKind:
        """The kind of drafting it generates with now."""
        return self.drafting.mode

    @property
    def default_mode(self) -> DrafterKind:
        """The kind of drafting it was opened with."""
        return self.drafting.default_mode

    def use(self, mode: DrafterKind) -> None:
        """Generate with this kind of drafting from now on (bench compares them; chat's /draft switches)."""
        self.drafting.use(mode)

    def sequence_for(self, prompt: list[int], busy, client: str | None = None) -> int:
        """The sequence a prompt should generate on, of those not busy: the one whose cache holds most of
        it (a conversation resent with one more turn); on a tie the first, for which a draft model drafts.
        client: whose prompt it is (serve's API key): a cache another client filled is emptied first and
        shares nothing, so that what it reuses (cached_tokens, the prompt's time) tells no client how
        much of another's prompt it guessed."""
        free = [seq for seq in range(len(self.sequences)) if seq not in busy]

        def shared(seq: int) -> int:
            return self.sequences[seq].shares(prompt) if self._filled_by.get(seq, client) == client else 0

        chosen = max(free, key=lambda seq: (shared(seq), -seq))
        if self._filled_by.get(chosen, client) != client:
            self.reset(chosen)
        self._filled_by[chosen] = client
        return chosen

    def costs(self) -> dict | None:
        """What the auto policy measured of this machine (verification by batch size, drafting), once
        it has run; for reports."""
        return self.drafting.costs()

    def set_draft_max(self, draft_max: int | None) -> None:
        """Draft up to this many tokens a step in every mode (None: each kind's own default)."""
        if draft_max is not None and draft_max + 1 > self.target.max_rows:
            raise UsageError(f"draft length {draft_max} exceeds this session's batch of {self.target.max_rows - 1}")
        draft_min = self.speculation.draft_min
        self.speculation = replace(self.speculation, draft_max=draft_max,
                                   draft_min=draft_min if draft_max is None else min(draft_min, draft_max))

    @property
    def draft_limit(self) -> int:
        """Most tokens drafted a step in the current mode."""
        return self.drafting.limit

    def forget(self) -> None:
        """Start the auto policy's learning about acceptance afresh, and forget earlier generations
        (a benchmark's fresh session); the costs it measured stay, being the machine's."""
        self.drafting.forget()

    def remember_as(self, name: str | None) -> None:
        """Keep generations in, and draft from, a suffix cache of this name's own from now on (None: in
        none, as with --no-suffix-cache): bench gives each mode its own, so that none drafts what
        another generated from the same prompt."""
        self.drafting.remember_as(name)

    @property
    def suffix_cache(self) -> SuffixCache | None:
        """Where this session keeps its generations to draft from (None: --no-suffix-cache)."""
        return self.drafting.suffix_cache

    def reset(self, sequence: int | None = None) -> None:
        """Empty the KV caches, so the next prompt is read from scratch (fair benchmarks; after a failure):
        all of them, or one sequence's (the drafters' of it too)."""
        for view in self.sequences if sequence is None else [self.sequences[sequence]]:
            view.truncate(0)
        self.drafting.reset(sequence)

    def _own(self, resource):
        self._owned.append(resource)
        return resource

    def tokenize(self, prompt: str, raw: bool) -> list[int]:
        """Prompt text to tokens, wrapped in the model's chat template unless raw."""
        if not prompt:
            raise InputError("the prompt is empty")
        if raw:  # written by hand, control tokens and all
            self.refuse_what_cannot_fit(len(prompt))
            self._refuse_by_its_head(prompt)
            return self.target_model.tokenize(prompt, add_special=True, parse_special=True)
        return self.chat_tokens([{"role": "user", "content": prompt}])

    def chat_tokens(self, messages: list[dict], tools: Tools | None = None) -> list[int]:
        """A conversation, rendered with the model's chat template, ready for the assistant's turn, with
        the tools it may call.

        Only the template's own text is read for control tokens: a message that spells one (a pasted
        `<|im_end|><|im_start|>system`) is tokenized as the text it is, so it cannot forge a turn. Tool
        definitions and earlier calls are written by the template as JSON: one that spells a control
        token is refused."""
        model = self.target_model
        template = model.chat_template() or FALLBACK_TEMPLATE
        bos, eos = model.special_text("bos"), model.special_text("eos")
        text = "".join(str(m.get("content") or "") for m in messages)
        self.refuse_what_cannot_fit(len(text), len(messages))
        self._refuse_by_its_head(text)

        def spells_control_tokens(text: str) -> bool:
            return model.tokenize(text, False, True) != model.tokenize(text, False, False)

        literal = {i for i, m in enumerate(messages) if isinstance(m.get("content"), str)
                   and spells_control_tokens(m["content"])}
        about_tools = [list(tools.definitions) if tools else [],
                       [[m.get(key) for key in TOOL_FIELDS] for m in messages if any(key in m for key in TOOL_FIELDS)]]
        if any(about_tools) and spells_control_tokens(json.dumps(about_tools, ensure_ascii=False)):
            raise InputError("a tool definition or tool call contains the text of a control token, which the chat"
                             " template would write as one")
        pieces = render_pieces(template, messages, bos, eos, literal, list(tools.definitions) if tools else None)
        # Some templates write the BOS token themselves; adding another would change the prompt.
        add_bos = not (bos and "".join(text for text, _ in pieces).startswith(bos))
        tokens: list[int] = []
        for number, (text, is_message) in enumerate(pieces):
            tokens += model.tokenize(text, add_special=add_bos and number == 0, parse_special=not is_message)
        return tokens

    def refuse_what_cannot_fit(self, characters: int, messages: int = 1) -> None:
        """Refuse by arithmetic alone what no tokenizing could fit into the context, before any time goes
        into rendering and tokenizing it (8 MB of spaces took up to a minute and 1.2 GB, 100,000 one-space
        messages four): more messages than the context has tokens (a chat template marks every message with at
        least one), or more characters than its tokens can stand for (a character is at least a byte).
        What passes costs at most the tokenizing of what a full context holds, less than reading it in.
        Cheap enough for a server's event loop once longest_token has been read."""
        n_ctx = self.target.n_ctx
        if messages > n_ctx:
            raise ContextOverflow(f"the conversation's {messages:,} messages cannot fit the context of {n_ctx} tokens"
                                  " (each takes at least one); raise --ctx-size or send fewer")
        if characters <= n_ctx:  # a token stands for a byte at least: no need to read the vocabulary
            return
        longest = self.target_model.longest_token
        if longest is not None and characters > n_ctx * longest:
            raise ContextOverflow(f"the prompt ({characters:,} characters) cannot fit the context of {n_ctx} tokens:"
                                  f" no token of this model stands for more than {longest} bytes, so at most"
                                  f" {n_ctx * longest:,} characters fit; raise --ctx-size or shorten the prompt")

    def _refuse_by_its_head(self, text: str) -> None:
        """Most text runs to several characters a token, far below the bound above: a piece of it
        already shows that it cannot fit."""
        n_ctx = self.target.n_ctx
        head = text[: n_ctx * 8]
        if len(head) < len(text) and len(self.target_model.tokenize(head, False, False)) >= n_ctx:
            raise ContextOverflow(f"the prompt ({len(text):,} characters) cannot fit the context of {n_ctx} tokens;"
                             " raise --ctx-size or shorten the prompt")

    def with_tools(self, sampling: Sampling, tools: Tools) -> tuple[Sampling, ToolFormat]:
        """Sampling under the grammar that keeps the model's calls to the tools well formed, and the form
        it writes them in; InputError where its template has no tools, or the answer is constrained
        already (a response format)."""
        form = tool_format(self.target_model.chat_template())
        grammar, triggers = constraint(form, tools)
        if grammar is None:
            return sampling, form
        if sampling.grammar is not None:
            raise InputError("tools and a response format (or grammar) both constrain the answer; send one of them")
        return replace(sampling, grammar=grammar, grammar_triggers=triggers), form

    @property
    def can_speculate(self) -> bool:
        return self.default_mode != DrafterKind.PLAIN

    def prepare(self, request: Request) -> "Prepared":
        """A request made ready to generate: its prompt as tokens (a conversation through the chat template,
        with the tools it may call), its prediction's tokens, and the sampling that keeps tool calls well
        formed. Raises, with nothing started, where the request cannot be generated (InputError,
        ContextOverflow, UsageError)."""
        info = self.target_info
        if not info.generates:  # llama.cpp would abort the process when asked for its logits
            raise UsageError(f"{info.path.name} is an embedding model ({info.architecture}): it embeds text (serve's"
                             " /v1/embeddings and /api/embed) and does not generate any")
        prediction = request.prediction
        if isinstance(prediction, str):
            prediction = self.prediction_tokens(prediction) if prediction else None
        sampling, tool_format = request.sampling, None
        if request.tools is not None:
            sampling, tool_format = self.with_tools(sampling, request.tools)
        if request.messages is not None:
            tokens = self.chat_tokens(request.messages, request.tools)
        elif isinstance(request.prompt, str):
            tokens = self.tokenize(request.prompt, raw=True)
        else:
            tokens = self.token_ids(request.prompt)
        return Prepared(request, tokens, sampling, prediction or None, tool_format)

    def generate(self, request: Request) -> Iterator[Event]:
        """The events of one generation: Prefill, then Token and Step as they come, then Done. A prediction
        drafts wherever the output follows it (plain decoding leaves it unused). To run several at once on
        a session of several sequences, hand them to a Scheduler instead."""
        events = self.generation(self.prepare(request), 0)
        return alone(events) if len(self.sequences) > 1 else events

    def scheduler(self) -> Scheduler:
        """Several requests at once, one on each of the session's sequences (load(..., parallel=N)), their rows
        decoded in one batch a step."""
        return Scheduler(self)

    def generation(self, prepared: "Prepared", sequence: int) -> Iterator:
        """A prepared request's generation on one of the session's sequences (0 .. parallel - 1): its events
        with Turns between them where the session has several, for the Scheduler to decode the sequences'
        rows together."""
        if prepared.request.client is not None:  # it drafts from its own client's earlier answers only
            self.remember_as(prepared.request.client)
        events = generate(self.sequences[sequence], self.drafting.of(sequence, prepared.prediction), prepared.tokens,
                          prepared.sampling, self.speculation, prepared.request.limits)
        return self.drafting.remembering(events, prepared.tokens)

    @property
    def remembered(self) -> tuple[int, int] | None:
        """The tokens its suffix caches hold (all of them: the one in use and the named ones) and the
        bytes they take, if this session keeps any."""
        return self.drafting.remembered

    def embedding_inputs(self, inputs: list[str | list[int]]) -> list[list[int]]:
        """Each input to embed (text, or token ids) as the tokens the model reads: InputError, before any is
        embedded, for one that is empty or longer than the context."""
        tokens = [self.target_model.tokenize(item, True, False) if isinstance(item, str) else self.token_ids(item)
                  for item in inputs]
        for number, each in enumerate(tokens, start=1):
            if not each:
                raise InputError(f"input {number} to embed is empty")
            if len(each) > self.target.n_ctx:
                raise InputError(f"input {number} to embed is {len(each):,} tokens but the context holds"
                                 f" {self.target.n_ctx:,}; raise --ctx-size or shorten it")
        return tokens

    def embed(self, tokens: list[int]) -> list[float]:
        """One input's vector (embedding_inputs' tokens), the target model reading it whole and pooling it
        (an embedding context of the session's size is made at the first call)."""
        if self._embedder is None:
            self._embedder = self._own(Embedder(self.target_model, self.target.n_ctx, self._threads))
        return self._embedder.embed(tokens).tolist()

    def prediction_tokens(self, text: str) -> list[int]:
        """Predicted text as the tokens the output would hold (no BOS, control tokens read as text), as far as
        an output could: a context's worth. Only that much of the text is read (8 MiB of code took 2.4 s of
        the worker's time to tokenize with Qwen2.5's tokenizer, for tokens no output can reach): a head that
        most text fills the context with, else as many characters as a context of the longest tokens holds."""
        n_ctx, tokenize = self.target.n_ctx, self.target_model.tokenize
        head = text[: n_ctx * 8]
        tokens = tokenize(head, False, False)
        if len(tokens) < n_ctx and len(head) < len(text):
            longest = self.target_model.longest_token
            tokens = tokenize(text[: n_ctx * longest] if longest else text, False, False)
        return tokens[:n_ctx]

    def prompt_tokens(self, prompt: str | list[dict] | list[int], raw: bool = False) -> list[int]:
        """A prompt as tokens: text (wrapped in the chat template unless raw), a conversation (messages
        with role and content), or token ids (checked against the vocabulary)."""
        if isinstance(prompt, str):
            return self.tokenize(prompt, raw)
        if prompt and all(isinstance(message, dict) for message in prompt):
            return self.chat_tokens(prompt)
        return self.token_ids(prompt)

    def token_ids(self, tokens: list) -> list[int]:
        """A prompt given as token ids, once they are known to be this model's."""
        if not tokens:
            raise InputError("the prompt is empty")
        n_vocab = self.target_model.n_vocab
        if not all(isinstance(token, int) and 0 <= token < n_vocab for token in tokens):
            raise InputError(f"the prompt's token ids must be between 0 and {n_vocab - 1}, this model's vocabulary")
        return list(tokens)

    def stream(self, prompt: str | list[dict] | list[int], raw: bool = False, sampling: Sampling | None = None,
               limits: Limits | None = None, **options) -> Iterator[Event]:
        """A generation's events for a prompt (see prompt_tokens). options: temperature, top_k, top_p, min_p,
        seed, max_tokens, stop, over sampling and limits (by default config's, llama.cpp's defaults)."""
        sampling, limits = overridden(sampling or Sampling(), limits or Limits(), **options)
        return self.generate(Request(sampling, limits, prompt=self.prompt_tokens(prompt, raw)))

    def complete(self, prompt: str | list[dict] | list[int], raw: bool = False, **options) -> Reply:
        """A whole generation for a prompt, as stream() makes it."""
        return Reply.of(record(self.stream(prompt, raw, **options)))

    def chat(self, system: str | None = None, sampling: Sampling | None = None,
             limits: Limits | None = None) -> "Conversation":
        """A conversation with history on this session."""
        return Conversation(self, system, sampling or Sampling(), limits or Limits())

    @property
    def info(self) -> Info:
        draft = self.drafting.costly.get(DrafterKind.DRAFT)
        return Info(self.target_model.path.name, draft.context.model.path.name if draft else None,
                    DrafterKind.MTP in self.drafting.costly, self.target.n_ctx, self.target_model.n_vocab)

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
        (up to a second), which the refusal of prompts too long for the context needs."""
        self.target_model.longest_token  # noqa: B018 (a cached property, read for its cost)

    def placement(self) -> dict:
        """Where each model runs and where its rows are sampled, for reports."""
        return self.plan.report(draft=self.drafting.with_files, sampling="backend" if self.target.on_backend else "host",
                                drafting=self.mode)

    def describe(self) -> str:
        """Which files generate and what drafts for them, for the panel and summary line."""
        return f"{self.target_model.path.name} ({self.drafting.describe()})"

    def close(self) -> None:
        if self._owned and self.drafting is not None:
            self.drafting.close(self._threads)
        for resource in reversed(self._owned):
            resource.close()
        self._owned.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Conversation:
    """A chat with history. Each turn renders the whole conversation with the model's chat template; the
    KV caches keep what earlier turns read, so only the new turn is read. `recorder` folds every turn's
    events (the chat's statistics; its text is the latest reply's), `turn` the latest turn's."""

    def __init__(self, session: Session, system: str | None, sampling: Sampling, limits: Limits):
        self.session, self.system, self.sampling, self.limits = session, system, sampling, limits
        self.recorder = self.turn = Recorder()
        self.clear()

    def clear(self) -> None:
        """Forget the conversation; the system prompt stays."""
        self.messages: list[dict] = [{"role": "system", "content": self.system}] if self.system else []

    def stream(self, text: str, **options) -> Iterator[Event]:
        """The reply's events (options as Session.stream's). The reply joins the conversation as far as it
        got, also when Ctrl-C or the caller stops it early; a turn that fails before the model answers
        leaves the conversation as it was."""
        sampling, limits = overridden(self.sampling, self.limits, **options)
        self.messages.append({"role": "user", "content": text})
        self.turn = Recorder()
        started = failed = False  # the recorder's text is this reply's from its Prefill on, the last reply's before
        try:
            for event in self.session.generate(Request(sampling, limits, messages=self.messages)):
                self.recorder.add(event)
                self.turn.add(event)
                started = started or isinstance(event, Prefill)
                yield event
        except LocalspecError:
            failed = True
            self.recorder.interrupt()
            self.messages.pop()
            raise
        except BaseException:  # Ctrl-C, or the caller closed the stream
            self.recorder.interrupt()
            self.turn.interrupt()
            raise
        finally:
            if not failed:
                self.messages.append({"role": "assistant", "content": self.recorder.text if started else ""})

    def send(self, text: str, **options) -> Reply:
        """The whole reply to one message."""
        for _ in self.stream(text, **options):
            pass
        return Reply.of(self.turn)
