"""Loading a pair: its names resolved and the files fetched, their headers read and checked, placed on the
machine's devices, the drafting planned, and then the llama.cpp models and contexts made that a Session
generates with."""

import hashlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from . import paths, store
from .config import AUTO_PARALLEL, KV_CACHE_TYPES, Adapter, DrafterKind, Rope, Runtime, Speculation
from .engine import rpc
from .engine.adapters import Adapters, steer
from .engine.backend import Context
from .engine.model import Model
from .engine.prompt_cache import PromptCache
from .engine.drafters import CostlyDrafter
from .engine.drafters.across import AcrossDrafter, Vocabularies
from .engine.drafters.spec import PUBLISHED_KINDS, DraftPlan, DrafterSpec, Weights, longest_draft, plan_drafting
from .engine.vision import Vision
from .errors import IncompatibleDraft, UsageError
from .store import compat, download, registry
from .store.placement import Placement, parallel_that_fits


@dataclass(frozen=True)
class Placed:
    """A pair resolved, fetched, checked and placed: what loading it takes (runtime with --parallel auto
    decided, and the RPC workers whose devices may hold its layers)."""

    pair: store.Pair
    runtime: Runtime
    placement: Placement
    workers: rpc.Workers


def place(target: str, draft_model: str | None, runtime: Runtime, speculation: Speculation, offline: bool = False,
          progress=None, on_abort: Callable[[str], None] | None = None) -> Placed:
    """Resolve, fetch and check the pair, and place it (open_session's first part); on_abort as it takes it."""
    stop = rpc.stop_on_abort(lambda message: on_abort(message + rpc.abort_hint(runtime.rpc))) if on_abort else None
    # the workers' memory counts, and an unreachable one is said before anything loads
    workers = rpc.Workers(runtime.rpc, stop)
    if speculation.drafting in PUBLISHED_KINDS and draft_model is None:
        draft_model = published_drafter(target, speculation.drafting, offline)
    elif draft_model == registry.AUTO:  # the drafter published beside it, found as llama.cpp finds one
        beside = download.drafter_beside(store.find(target), offline)
        draft_model = beside.typed or beside.name if beside else draft_model
    pair = store.pair(target, draft_model, offline, progress, n_ctx=runtime.ctx_size or None)
    if pair.report and not pair.report.compatible:
        raise IncompatibleDraft(pair.refusal, pair.report)
    if runtime.mmproj is None and runtime.mmproj_auto:
        runtime = replace(runtime, mmproj=download.projector_beside(store.find(target), offline))
    runtime = replace(runtime, lora=store.fetched_adapters(runtime.lora, offline, progress),
                      control_vectors=store.fetched_adapters(runtime.control_vectors, offline, progress),
                      mmproj=store.fetched(runtime.mmproj, offline, progress) if runtime.mmproj else None)
    runtime = sized(runtime, pair.target)
    if runtime.parallel == AUTO_PARALLEL:
        runtime = replace(runtime, parallel=parallel_that_fits(runtime, pair.target, pair.draft))
    placement = Placement.plan(runtime, pair.target, pair.draft)
    placement.check_fit()
    return Placed(pair, runtime, placement, workers)


def sized(runtime: Runtime, target: store.GGUFInfo) -> Runtime:
    """runtime, its context of 0 (llama.cpp's -c 0) the length the target was trained for."""
    return runtime if runtime.ctx_size else replace(runtime, ctx_size=target.context_length or Runtime.ctx_size)


def published_drafter(target: str, kind: DrafterKind, offline: bool) -> str | None:
    """The drafter of this kind published beside a target, as --draft takes it: the one the registry
    names, or, for a Hub file (hf:..., owner/repo:QUANT), a file of its repo found by llama.cpp's rules
    (`mtp-`, `eagle3-`, `dflash-`). None for MTP: the target drafts with its own MTP layers, if it has
    them; a drafter of another kind must be found."""
    resolved = store.find(target)
    named = registry.published_drafter(resolved, kind)
    if named is not None:
        return named.name
    if isinstance(resolved, store.RepoQuant) or isinstance(resolved, store.ModelEntry) and resolved.typed:
        found = download.published_sidecar(resolved, kind, offline)
        if found:
            return f"hf:{found.repo}/{found.file}"
    if kind != DrafterKind.MTP:
        raise UsageError(f"no {kind} drafter is known to be published beside {target}; give its {kind}-*.gguf"
                         " file as --draft")
    return None


def shared_vocabulary(target: Path, draft: Path) -> float:
    """The share of a draft's vocabulary that spells single tokens of the target's (what it drafts with when
    sampling, through text), read from the two vocabularies alone."""
    models = [Model(target, vocab_only=True), Model(draft, vocab_only=True)]
    try:
        return Vocabularies(*models).shared
    finally:
        for model in models:
            model.close()


def tokens_of(path: Path, text: str, special: bool = True) -> list[tuple[int, bytes]]:
    """Each token of a text as the model at path reads a raw prompt (its start token where it wants one;
    special: control tokens' spellings read as the tokens), with the text it stands for; the vocabulary
    alone is read."""
    model = Model(path, vocab_only=True)
    try:
        return [(token, model.special_piece(token))
                for token in model.tokenize(text, add_special=special, parse_special=special)]
    finally:
        model.close()


@dataclass
class Loaded:
    """The llama.cpp objects of a loaded pair: the target's model and context (and its sequences' views of
    it), the LoRA adapters loaded for the target (applied by the session) and its control vectors (steering,
    applied to its context), the costly drafters its drafting plan made, each on a context of its own; the plan
    and the speculation as the loaded models left them; settings: what decides how llama.cpp computes, and so
    auto's costs; notes: what was done other than asked, for the CLI to print."""

    placement: Placement
    plan: DraftPlan
    speculation: Speculation
    target_model: Model
    target: Context
    sequences: list[Context]
    adapters: Adapters
    steering: tuple[np.ndarray, tuple[int, int]] | None  # the control vectors' directions and layers (engine.steer's)
    vision: Vision | None  # the target's multimodal projector (--mmproj)
    costly: dict[DrafterSpec, CostlyDrafter]
    settings: dict
    notes: list[str]


def _ggml_types(cache: tuple[str, str]) -> tuple[int, int]:
    """ggml's types of K and V caches so named, as Context takes them."""
    return KV_CACHE_TYPES[cache[0]][0], KV_CACHE_TYPES[cache[1]][0]


def scoring_context(model: Model, n: int, runtime: Runtime) -> Context:
    """A context that reads n tokens with a row for each, in batches of --batch-size (llama-perplexity's)."""
    return Context(model, n, min(n, runtime.prompt_batch), runtime.threads, flash_attn=runtime.flash_attn,
                   cache_types=_ggml_types((runtime.cache_type_k, runtime.cache_type_v)), rope=runtime.rope,
                   kv_offload=runtime.kv_offload)


def _cache_variant(cache: tuple[str, str], rope: Rope, steering: tuple = ()) -> str:
    """The folder, inside a model's, of the prompts kept of a cache of other types (another layout of state) or under
    another RoPE scaling or control vectors (steering: the same layout, other values: read back, it would be wrong
    without a word); "" for f16's under the model's own."""
    parts = ([] if cache == ("f16", "f16") else [f"kv-{cache[0]}-{cache[1]}"]) + [
        f"{name}-{hashlib.sha256(repr(setting).encode()).hexdigest()[:8]}"
        for name, setting, plain in (("rope", rope, Rope()), ("cvec", steering, ())) if setting != plain]
    return "-".join(parts)


def steering(vectors: tuple[Adapter, ...], width: int) -> np.ndarray:
    """Control vectors' directions summed, each times its scale: one row a layer, from layer 1 (as engine.steer
    takes them); UsageError for a vector of another model's width."""
    summed: dict[int, np.ndarray] = {}
    for vector in vectors:
        for layer, direction in store.control_vector(Path(vector.path)).items():
            if len(direction) != width:
                raise UsageError(f"--control-vector {vector.path}: its directions are {len(direction)} wide, the"
                                 f" model's layers {width}: a control vector made for another model")
            summed[layer] = summed.get(layer, 0) + direction * np.float32(vector.scale)
    rows = np.zeros((max(summed), width), dtype=np.float32)
    for layer, direction in summed.items():
        rows[layer - 1] = direction
    return rows


def load_models(target: Path, draft: Path | None, runtime: Runtime, speculation: Speculation,
                placement: Placement | None, workers: rpc.Workers | None, owned: list) -> Loaded:
    """Load the pair as placed (None: placed here, with runtime's workers added first) and as its drafting
    plan says; every model and context is appended to owned as it is made, for the caller to close, also
    when a later one fails."""

    def own(resource):
        owned.append(resource)
        return resource

    if placement is None:
        workers = rpc.Workers(runtime.rpc) if workers is None else workers
        placement = Placement.plan(runtime, store.header(target), store.header(draft) if draft else None)
    target_header, draft_header = (*placement.models, None)[:2]
    plan = plan_drafting(speculation, target_header, draft_header,
                         draft_header is None or compat.check(target_header, draft_header).same_vocabulary)
    speculation = replace(speculation, drafting=plan.mode)
    notes = placement.notes
    if any(spec.drafter is AcrossDrafter for spec in plan.costly):
        notes.append(f"{draft.name} drafts through text: its vocabulary is not {target.name}'s (expected acceptance"
                     " lower than a same-family draft's)")
    placed, on_backend = placement.target, placement.backend_sampling
    # the workers' devices may hold layers of either model
    loading = {"repack": runtime.repack, "mmap": runtime.mmap, "mlock": runtime.mlock, "watch": workers or None,
               "split_mode": runtime.split_mode, "main_gpu": runtime.main_gpu}
    target_model = own(Model(target, placed.gpu_layers, placed.devices, load_mtp=plan.target_mtp,
                             tensor_split=placed.tensor_split, tensor_overrides=runtime.tensor_overrides, **loading))
    adapters = own(Adapters(target_model, [adapter.path for adapter in runtime.lora],
                            [adapter.scale for adapter in runtime.lora]))
    # the drafters' own files, loaded before the target's context, which keeps the hidden states they read
    # (a draft on the devices named for it splits by layers over them, as llama.cpp's)
    draft_loading = loading | ({"split_mode": "layer", "main_gpu": 0} if placement.draft and placement.draft.devices
                               else {})
    models = {spec: target_model if spec.weights is Weights.TARGET else own(Model(
        draft, placement.draft.gpu_layers, placement.draft.devices, load_mtp=spec.weights is Weights.MTP_FILE,
        tensor_overrides=runtime.draft_tensor_overrides, **draft_loading)) for spec in plan.costly}
    kept = tuple(layer for spec, model in models.items() for layer in spec.drafter.layers_read(target_model, model))
    # rows sampled in one batch: a verification of the longest draft; a bigger batch would abort llama.cpp
    rows = longest_draft(speculation) + 1

    def context(model: Model, cache: tuple[str, str], threads: int, **options) -> Context:
        made = own(Context(model, runtime.ctx_size, max(runtime.prompt_batch, rows), threads, on_backend,
                           rows, flash_attn=runtime.flash_attn, n_seq=runtime.parallel,
                           cache_types=_ggml_types(cache), rope=runtime.rope, kv_offload=runtime.kv_offload,
                           cache_reuse=runtime.cache_reuse, **options))
        if runtime.prompt_cache and made.can_remember:
            steered = ((runtime.control_vectors, runtime.control_layers)
                       if model is target_model and runtime.control_vectors else ())
            folder = paths.prompts_of(model.path) / _cache_variant(cache, runtime.rope, steered)
            made.prompt_cache = PromptCache(paths.prompts_dir(), model.path, runtime.prompt_cache, folder=folder)
        return made

    # room for draft trees where they can be verified: no recurrent state, no hidden states kept for a drafter
    tree_room = speculation.tree_room if not target_model.recurrent and not kept else 0
    target_context = context(target_model, (runtime.cache_type_k, runtime.cache_type_v), runtime.threads,
                             keep_hidden=kept, branches=tree_room)
    steered = ((steering(runtime.control_vectors, target_model.layer_width),
                runtime.control_layers or (1, target_model.n_layer)) if runtime.control_vectors else None)
    if steered:
        steer(target_context, *steered)
    if target_context.n_ctx != runtime.ctx_size:
        # (draft trees' cells, a batch of them, are made with the context's: what rounding adds goes to the context,
        # so -c 256 -b 300 holds 468, which no rounding of 256 makes)
        notes.append(f"the context holds {target_context.n_ctx} tokens, not {runtime.ctx_size}: llama.cpp makes a KV"
                     " cache's cells in multiples of 256, and those left over go to the context"
                     + (" (beside a --batch-size of cells kept for draft trees' branches)" if target_context.branch_room
                        else ""))
    if runtime.parallel > 1:
        notes.append(f"{runtime.parallel} sequences generate at once (--parallel), each up to"
                     f" {target_context.n_ctx} tokens")
    if target_model.recurrent and not target_context.rollback:
        plan = plan.decoding_plainly(target.name, speculation)
        if plan.note:
            notes.append(plan.note)
            speculation = replace(speculation, drafting=plan.mode)
            target_context.stop_keeping_hidden()
    vision = own(Vision(target_model, Path(runtime.mmproj), runtime.threads,
                        gpu=runtime.mmproj_offload and placed.gpu_layers != 0)) if runtime.mmproj else None
    if vision is not None:
        # (llama-server's too: a run shifted into place would carry an image's rows, read at their positions, along)
        target_context.media, target_context.cache_reuse = vision, 0
    # the sequences requests generate on (serve -np, batch --parallel)
    sequences = [target_context] + [target_context.sequence(seq) for seq in range(1, runtime.parallel)]
    costly = {spec: spec.drafter.made(target_context, context(
        models[spec], (runtime.draft_cache_type_k, runtime.draft_cache_type_v), runtime.draft_threads or runtime.threads,
        mtp=spec.drafter.mtp_context, beside=target_context if spec.drafter.beside_target else None),
        speculation.p_min) for spec in plan.costly}
    # Not the context size: costs are measured at the start of an empty cache, and llama.cpp attends only to
    # the cells in use; nor the prompt cache or the reuse of a cache's runs, which decide what is read, not how.
    # Nor the layers' fitting, only the counts it came to; nor the adapters' scales, only which are loaded; nor the
    # projector, which reads images, not text; nor the pooling, which embeddings and reranking read.
    settings = {**asdict(replace(runtime, gpu_layers=placed.gpu_layers,
                                 draft_gpu_layers=placement.draft.gpu_layers if placement.draft else -1)),
                "backend_sampling": on_backend}
    for left_out in ("ctx_size", "prompt_cache", "cache_reuse", "fit_margin", "lora", "mmproj", "mmproj_offload",
                     "mmproj_auto", "pooling"):
        del settings[left_out]
    if runtime.lora:
        settings["lora"] = [adapter.path for adapter in runtime.lora]
    return Loaded(placement, plan, speculation, target_model, target_context, sequences, adapters, steered, vision,
                  costly, settings, notes)
