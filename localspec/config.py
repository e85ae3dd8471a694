"""All tunable settings and their defaults, in one place.

Defaults follow llama.cpp's where one exists, so results are comparable.
"""

import difflib
import functools
import math
import numbers
import operator
import os
import re
import types
import typing
from pathlib import Path
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import psutil

from .errors import UsageError


# A draft tree's branches, each a sequence id of the target's context: by default a chain and the three
# likeliest alternatives a free drafter holds
DEFAULT_BRANCHES = 4
MOST_BRANCHES = 16  # each a sequence id of llama.cpp's context and a seq_id slot of every batch row
MOST_LOGPROBS = 20  # alternatives a token's logprobs may list (OpenAI's top_logprobs bound)


@dataclass(frozen=True)
class Sampling:
    """How a token is chosen from the target's logits. temperature 0 means greedy."""

    temperature: float = 0.8
    top_k: int = 40  # 0 disables
    top_p: float = 0.95  # 1.0 disables
    min_p: float = 0.05  # 0.0 disables
    seed: int | None = None
    # GBNF (llama.cpp's grammar format) the output must follow: the target chooses only among the
    # tokens it admits (engine/gbnf.py writes it from a JSON schema too)
    grammar: str | None = None
    # Regular expressions (llama.cpp's lazy grammar): the grammar waits until the output matches one,
    # then holds from the match's first group (or the match) on; empty: it holds from the first token.
    # A tool call is constrained this way once the model starts one, its free text before left alone.
    grammar_triggers: tuple[str, ...] = ()
    # llama.cpp's penalties, on the raw logits of every position before the rest of the chain, counted
    # over the last repeat_last_n tokens before it, the prompt's among them as llama-cli and llama-server
    # count them (0: none; -1: the whole context): a seen token's logit is divided by repeat_penalty (or
    # multiplied, where it is not positive), then lowered by frequency_penalty a time it was seen and by
    # presence_penalty once. Verification applies them to each row for the drafted tokens before it too,
    # so speculation stays lossless under them.
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    # llama.cpp's logit bias, first of all: (token id, bias) pairs (or a dict) added to the raw logits (-inf, or
    # llama-server's false: the token is never chosen); a text instead of an id biases each token of its
    # spelling, as llama-server's does (a session resolves it: the engine reads ids alone). ignore_eos bans the
    # model's end-of-generation tokens so that it writes until a limit (llama-server's and vLLM's, which
    # benchmarks of fixed lengths ask for). Every verified row is changed so too: speculation stays lossless.
    logit_bias: tuple[tuple[int | str, float], ...] = ()
    ignore_eos: bool = False
    # DRY ("don't repeat yourself", llama.cpp's, after the penalties): a token that would extend a repeat of
    # dry_allowed_length tokens or more of the last dry_penalty_last_n (-1: the whole context; 0: off) has its
    # logit lowered by dry_multiplier * dry_base ** (the repeat's length - dry_allowed_length); a repeat never
    # reaches back past the last sequence breaker (a newline...). Off while dry_multiplier is 0. Like the
    # penalties it depends only on the tokens before a row, so verification stays lossless under it.
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: tuple[str, ...] = ("\n", ":", "\"", "*")
    # XTC ("exclude top choices", llama.cpp's, after min-p): at a token, with probability xtc_probability, every
    # candidate at least xtc_threshold likely (at temperature 1) but the least likely of them is left out, where
    # two or more are; off at 0, or above a threshold of 0.5. Each verified row draws its own chance, so the
    # target's choices keep XTC's distribution under speculation.
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    # llama.cpp's locally typical sampling (after top-k: the tokens whose surprise is nearest the row's entropy, as
    # many as make typical_p of its mass; 1: off) and dynamic temperature (temperature +- dynatemp_range, by the
    # row's entropy to the power dynatemp_exponent; 0: off): each a function of its row, drafts drawn alike
    typical_p: float = 1.0
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    # llama.cpp's top-n-sigma, first of the chain: only the logits within top_n_sigma standard deviations of the
    # row's highest are kept (0 or less: off)
    top_n_sigma: float = -1.0
    # Mirostat (llama.cpp's, 1 or 2; 0: off): among all the tokens at the temperature (top-k, typical, top-p,
    # min-p, top-n-sigma, XTC and a dynamic temperature left unused, as llama.cpp does; the bias, penalties and
    # DRY still applied), only the likeliest are kept, as many as a running threshold mu says; mu starts at twice
    # mirostat_tau (the surprise aimed at, in bits) and after each token moves by mirostat_eta times how much that
    # token's surprise missed it. Each verified row is cut at the mu the tokens before it leave, so speculation
    # stays lossless under it.
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    # Not how a token is chosen but what is reported of each choice: None nothing, else every token's
    # log probability and those of the `logprobs` likeliest tokens of its row (0: none beside it)
    logprobs: int | None = None
    # the logprobs reported are of the distribution each token was chosen from (after the chain, a grammar, XTC
    # or Mirostat's cut: llama-server's post_sampling_probs), not of the model's raw row; greedy's is its argmax
    logprobs_sampled: bool = False
    # the same of each prompt token, given those before it (the first's None; OpenAI's echo, vLLM's
    # prompt_logprobs: what lm-eval's loglikelihood tasks read); the prompt is then read anew, none of it
    # taken from the cache, each of its rows kept
    prompt_logprobs: int | None = None

    def __post_init__(self):
        of_their_types(self)
        if self.seed == -1:  # llama.cpp's spelling of "a random seed"
            object.__setattr__(self, "seed", None)
        if self.seed is not None and self.seed < 0:
            raise UsageError(f"seed must be >= 0, or -1 for a random one, got {self.seed}")
        if not self.temperature >= 0:
            raise UsageError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise UsageError(f"top-k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise UsageError(f"top-p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p < 1.0:
            raise UsageError(f"min-p must be in [0, 1), got {self.min_p}")
        if not self.repeat_penalty > 0:
            raise UsageError(f"repeat penalty must be > 0 (1.0: none), got {self.repeat_penalty}")
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None and not 0 <= getattr(self, name) <= MOST_LOGPROBS:
                raise UsageError(f"top {name.replace('_', ' ')} must be from 0 to {MOST_LOGPROBS}, got {getattr(self, name)}")
        if self.repeat_last_n < -1:
            raise UsageError(f"repeat-last-n must be >= 0, or -1 for the whole context, got {self.repeat_last_n}")
        for name in ("frequency_penalty", "presence_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise UsageError(f"{name.replace('_', ' ')} must be a number, got {getattr(self, name)}")
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        self._check_dry()
        for name in ("xtc_probability", "xtc_threshold"):
            if not 0 <= getattr(self, name) <= 1:
                raise UsageError(f"{name.replace('_', ' ')} must be from 0 to 1, got {getattr(self, name)}",
                                 setting=name)
        if not 0.0 < self.typical_p <= 1.0:
            raise UsageError(f"typical p must be in (0, 1] (1: off), got {self.typical_p}", setting="typical_p")
        for name in ("dynatemp_range", "dynatemp_exponent"):
            if not 0 <= getattr(self, name) < math.inf:
                raise UsageError(f"dynamic temperature's range and exponent must be >= 0, got {name}"
                                 f" {getattr(self, name)}", setting=name)
        if not math.isfinite(self.top_n_sigma):
            raise UsageError(f"top-n-sigma must be a number (0 or less: off), got {self.top_n_sigma}",
                             setting="top_n_sigma")
        self._check_mirostat()
        if self.xtc and self.dynatemp_range > 0:
            # (XTC reads candidates' probabilities at temperature 1, found from a row at one known temperature)
            raise UsageError("XTC and a dynamic temperature together are not supported: give one",
                             setting="xtc_probability")
        if self.xtc and self.greedy:
            raise UsageError("XTC draws among the likeliest tokens at random, and greedy decoding (temperature 0) takes"
                             " the likeliest: give a temperature above 0, or leave XTC off", setting="xtc_probability")

    def _check_mirostat(self) -> None:
        if self.mirostat not in (0, 1, 2) or isinstance(self.mirostat, bool):
            raise UsageError(f"mirostat must be 0 (off), 1 or 2 (Mirostat 2.0), got {self.mirostat!r}",
                             setting="mirostat")
        for name, what in (("mirostat_tau", "its target surprise, in bits"), ("mirostat_eta", "its learning rate")):
            if not 0 <= getattr(self, name) < math.inf:
                raise UsageError(f"{name.replace('_', ' ')} ({what}) must be >= 0, got {getattr(self, name)}",
                                 setting=name)

    def _check_dry(self) -> None:
        breakers = self.dry_sequence_breakers
        if isinstance(breakers, str) or not all(isinstance(breaker, str) for breaker in breakers):
            raise UsageError(f"dry sequence breakers: a list of texts, got {breakers!r}",
                             setting="dry_sequence_breakers")
        object.__setattr__(self, "dry_sequence_breakers", tuple(breaker for breaker in breakers if breaker))
        if not math.isfinite(self.dry_multiplier):
            raise UsageError(f"dry multiplier must be a number (0: no DRY), got {self.dry_multiplier}",
                             setting="dry_multiplier")
        if self.dry_multiplier != 0 and not 1 <= self.dry_base < math.inf:
            # (llama.cpp turns DRY off without a word below 1)
            raise UsageError(f"dry base must be >= 1 (1.75 by default), got {self.dry_base}", setting="dry_base")
        if self.dry_allowed_length < 0:
            raise UsageError(f"dry allowed length must be >= 0 tokens, got {self.dry_allowed_length}",
                             setting="dry_allowed_length")
        if self.dry_penalty_last_n < -1:
            raise UsageError(f"dry penalty last n must be >= 0, or -1 for the whole context, got"
                             f" {self.dry_penalty_last_n}", setting="dry_penalty_last_n")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether any penalty changes a logit."""
        return self.repeat_last_n != 0 and (self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0
                                            or self.presence_penalty != 0.0)

    @property
    def dry(self) -> bool:
        """Whether DRY changes a logit."""
        return self.dry_multiplier != 0 and self.dry_penalty_last_n != 0

    @property
    def xtc(self) -> bool:
        """Whether XTC may leave a candidate out."""
        return self.xtc_probability > 0 and self.xtc_threshold <= 0.5 and not self.mirostat

    @property
    def adjusted(self) -> bool:
        """Whether rows are changed before the chain reads them: a bias, a banned end, a penalty or DRY."""
        return bool(self.logit_bias) or self.ignore_eos or self.penalized or self.dry


def _bias_pairs(given) -> tuple[tuple[int | str, float], ...]:
    """A logit bias as (token id or text, bias) pairs, from pairs or a dict, in llama-server's spellings as
    well (JSON's): a text of digits is a token id, a bias of false bans the token (-inf)."""
    pairs = []
    try:
        for token, bias in (given.items() if isinstance(given, dict) else given):
            if isinstance(token, str) and re.fullmatch(r"-?[0-9]+", token):
                token = int(token)
            elif not isinstance(token, str):
                token = operator.index(token)
            if bias is False:
                bias = -math.inf
            elif isinstance(bias, bool) or not isinstance(bias, numbers.Real):
                raise TypeError(bias)
            pairs.append((token, float(bias)))
    except (TypeError, ValueError):
        raise UsageError("logit bias: (token id, bias) pairs, or an object of token ids to biases (a bias a number,"
                         " or false to ban the token)", setting="logit_bias") from None
    for token, bias in pairs:
        if token == "" or isinstance(token, int) and token < 0:
            raise UsageError(f"logit bias: token ids are >= 0 and texts not empty, got {token!r}", setting="logit_bias")
        if not (math.isfinite(bias) or bias == -math.inf):
            raise UsageError(f"logit bias of {token!r} must be a number, or -inf to ban it, got {bias}",
                             setting="logit_bias")
    return tuple(pairs)


class DrafterKind(str):
    """A way of drafting, in one word: a session's mode, bench's modes, the drafter each step used and the key of
    its statistics. Which words there are is engine/drafters/spec.py's: one entry a way of drafting, its class
    naming its own word, each word checked there when the drafting plan is made, before anything loads. These are
    the words the code around the engine names, each one object (a word named as text is the kind itself)."""

    __slots__ = ()

    def __new__(cls, word: str) -> "DrafterKind":
        return _NAMED_KINDS.get(word) or super().__new__(cls, word)

    PLAIN = "plain"  # no drafting: the target alone, one token a step
    NGRAM = "ngram"  # prompt lookup: copy what followed the last few tokens before
    DRAFT = "draft"  # a small draft model
    MTP = "mtp"  # the target's own multi-token-prediction block (or one in a file of its own)
    AUTO = "auto"  # each step, plain decoding or whichever drafter is expected to pay most
    # the text the user expects (OpenAI's Predicted Outputs): drafts beside any mode, wherever the output
    # follows it, so it is a generation's option rather than a mode of its own
    PREDICTION = "prediction"
    # earlier generations in this process (SuffixDecoding's cache): one of auto's free drafters
    SUFFIX = "suffix"
    # the text a grammar admits alone (jump-forward), drafted for the target to verify: beside any mode
    # that drafts, wherever a grammar or JSON schema shapes the answer
    FORCED = "forced"


_NAMED_KINDS: dict[str, DrafterKind] = {}
for _name in [name for name in vars(DrafterKind) if name.isupper()]:
    _word = getattr(DrafterKind, _name)
    setattr(DrafterKind, _name, _NAMED_KINDS.setdefault(_word, DrafterKind(_word)))
del _name, _word


SPEC_CHOICES = ("auto", "fixed", "off")  # --spec's words (drafting.speculating reads them)


@dataclass(frozen=True)
class Speculation:
    """How speculation is steered.

    drafting: the kind a generation drafts with (a session can switch: chat's /draft, bench's modes).
    required: the user asked for drafting by name, so a target that cannot draft is refused rather
    than decoded plainly.
    draft_max: most tokens drafted a step; None: the drafting kind's own default (its spec in
    engine/drafters/spec.py). p_min stops a model draft once the draft model is unsure of its next token;
    ngram_min..ngram_max is the range of suffix lengths looked up by the n-gram drafter, longest first.
    suffix_cache: auto drafts from earlier generations in this process too (chat turns, batch items,
    requests), kept in memory only, per loaded target. branches: the most branches a draft tree may have
    (engine/tree.py): None, auto's choice of up to DEFAULT_BRANCHES where the cost curve says they pay; 1,
    chains only; more, fixed drafting (n-gram lookup's other continuations, a draft model's runner-ups) and
    a prediction's forks are trees too.
    """

    drafting: DrafterKind = DrafterKind.AUTO
    required: bool = False
    draft_max: int | None = None
    draft_min: int = 0
    p_min: float = 0.6
    ngram_min: int = 2
    ngram_max: int = 4
    suffix_cache: bool = True  # auto drafts from earlier generations in this process too
    jump_forward: bool = True  # under a grammar, the text it admits alone is drafted (ForcedDrafter)
    branches: int | None = None

    @property
    def tree_room(self) -> int:
        """Branches the target's context makes room for (0: none; a tree needs two)."""
        wanted = DEFAULT_BRANCHES if self.branches is None else self.branches
        return wanted if wanted > 1 and self.drafting != DrafterKind.PLAIN else 0

    def __post_init__(self):
        if not isinstance(self.drafting, str):
            raise UsageError(f"drafting is a word (plain, ngram, auto, ...), got {type(self.drafting).__name__}")
        # (which words are modes is the drafting plan's to check: engine/drafters/spec.py's check_mode)
        object.__setattr__(self, "drafting", DrafterKind(self.drafting))
        if self.draft_max is not None and self.draft_max < 0:
            raise UsageError(f"draft-max must be >= 0, got {self.draft_max}")
        # (against the mode's default draft-max, where none is given, when the drafting plan is made)
        if self.draft_min < 0 or (self.draft_max is not None and self.draft_min > self.draft_max):
            raise UsageError(f"draft-min must be between 0 and draft-max ({self.draft_max}), got {self.draft_min}")
        if self.branches is not None and not 1 <= self.branches <= MOST_BRANCHES:
            raise UsageError(f"draft-branches must be between 1 and {MOST_BRANCHES}, got {self.branches}")
        if not 0.0 <= self.p_min <= 1.0:
            raise UsageError(f"p-min must be in [0, 1], got {self.p_min}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise UsageError(
                f"n-gram sizes need 1 <= min <= max, got {self.ngram_min}..{self.ngram_max}"
            )


def default_threads() -> int:
    # Hyper-threads slow llama.cpp's matmuls down: one thread per physical core.
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def check_threads(threads: int) -> None:
    """The threads llama.cpp may run, for a model here or one a worker lends to."""
    if threads < 1:
        raise UsageError(f"threads must be >= 1, got {threads}")
    logical = os.cpu_count() or 1
    if threads > logical:
        raise UsageError(f"threads must be at most {logical}, this machine's logical CPUs (more threads than CPUs"
                         f" only slow llama.cpp down), got {threads}")


# What fitting layers to the GPUs leaves free on each (llama.cpp's --fit-target, 1024 MiB): its compute buffers
# grow with the batch, and the desktop and other programs use it too
FIT_MARGIN = 1 << 30
# Prompts kept on disk (engine/prompt_cache.py): those that took at least this long to read, up to this many
# bytes for every model's (llama-server keeps 8 GiB of prompts in RAM, its --cache-ram)
PROMPT_CACHE_LEAST_SECONDS = 1.0
PROMPT_CACHE_BYTES = 8 << 30
AUTO_PARALLEL = 0
PARALLEL_AUTO_MOST = 4  # llama-server's default slots
# llama.cpp's -sm values, as enum llama_split_mode numbers them
SPLIT_MODES = {"none": 0, "layer": 1, "row": 2, "tensor": 3}
# How an embedding or ranking context pools an input into one vector (llama.cpp's --pooling, but its "none": a vector
# a token, which llama-server's /v1/embeddings refuses too), by llama.cpp's enum llama_pooling_type
POOLINGS = {"mean": 1, "cls": 2, "last": 3, "rank": 4}
# The KV cache's types llama.cpp takes (its -ctk/-ctv): ggml's type number, values a block and a block's bytes, as
# ggml.h and ggml's type traits have them (tests check them against the gguf package's)
KV_CACHE_TYPES = {"f32": (0, 1, 4), "f16": (1, 1, 2), "bf16": (30, 1, 2), "q8_0": (8, 32, 34), "q4_0": (2, 32, 18),
                  "q4_1": (3, 32, 20), "iq4_nl": (20, 32, 18), "q5_0": (6, 32, 22), "q5_1": (7, 32, 24)}
UNQUANTIZED = ("f32", "f16", "bf16")
PARALLEL_MOST = 64


ROPE_SCALING = {"none": 0, "linear": 1, "yarn": 2}  # llama.h's enum llama_rope_scaling_type


@dataclass(frozen=True)
class Rope:
    """RoPE's frequency scaling (llama.cpp's --rope-* and --yarn-* options), to read a context beyond what the
    model was trained on (YaRN: Qwen's long-context recipe). Each as the model's file says where None."""

    scaling: str | None = None  # ROPE_SCALING's
    freq_base: float | None = None
    freq_scale: float | None = None  # 1/N expands the context N times (--rope-scale N)
    yarn_orig_ctx: int | None = None  # the context the model was trained on
    yarn_ext_factor: float | None = None
    yarn_attn_factor: float | None = None
    yarn_beta_slow: float | None = None
    yarn_beta_fast: float | None = None

    def __post_init__(self):
        if self.scaling is not None and self.scaling not in ROPE_SCALING:
            raise UsageError(f"--rope-scaling takes {', '.join(ROPE_SCALING)} (llama.cpp's), got {self.scaling!r}")
        for option, value in (("--rope-freq-base", self.freq_base), ("--rope-freq-scale", self.freq_scale),
                              ("--yarn-orig-ctx", self.yarn_orig_ctx)):
            if value is not None and not value > 0:
                raise UsageError(f"{option} must be > 0, got {value}")


# how a file of a Hub repo is named where a local file may be (hf:owner/repo/file.gguf)
HUB_PREFIX = "hf:"


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter the target computes with (llama.cpp's --lora, --lora-scaled), or a control vector added to
    its layers' outputs (--control-vector, --control-vector-scaled): its GGUF (or hf:owner/repo/file.gguf, fetched
    when the pair is) and how much of it (a LoRA adapter's 0: loaded, not applied, until a request or serve's POST
    /lora-adapters asks for it)."""

    path: str
    scale: float = 1.0

    def __post_init__(self):
        if not math.isfinite(self.scale):
            raise UsageError(f"{self.path}: a scale is a number, got {self.scale}")


@dataclass(frozen=True)
class Runtime:
    """Resources for the llama.cpp contexts. gpu_layers: the target's layers on the GPUs, -1 every one; None
    (auto, llama.cpp's -ngl auto): as many as the offload devices' free memory holds, leaving fit_margin bytes
    free on each, the draft model's layers placed first (with workers and no GPU here: the workers' share of
    the free memory); the rest stay on this machine's CPU. draft_gpu_layers: the draft model's, alike."""

    ctx_size: int = 4096
    threads: int = field(default_factory=default_threads)
    gpu_layers: int | None = None
    draft_gpu_layers: int | None = None
    fit_margin: int = FIT_MARGIN
    # Offload devices by name (llama.cpp's --device / --device-draft; ("none",): none); None: all of them.
    devices: tuple[str, ...] | None = None
    draft_devices: tuple[str, ...] | None = None
    prompt_batch: int = 512
    # Run the sampler chain inside the decode graph (None: where the target runs on a GPU, and elsewhere
    # for greedy rows only). Target and draft always sample the same way, so p and q come from the same chain.
    backend_sampling: bool | None = None
    # Other machines' `localspec worker`s (llama.cpp's --rpc), as HOST:PORT: the target's offloaded layers
    # are split across their devices and this machine's; the draft model stays here.
    rpc: tuple[str, ...] = ()
    # The share of the offloaded layers each device takes, in llama.cpp's device order (--tensor-split);
    # None: in proportion to their free memory.
    tensor_split: tuple[float, ...] | None = None
    # Let the CPU lay weights out for its fastest kernels (llama.cpp's repacking; off: --no-repack). A worker
    # computes with the plain layout, which rounds differently: greedy text matches a split run only without it.
    repack: bool = True
    # llama.cpp's -fa on|off (None: auto, on wherever the device supports it), --mmap/--no-mmap (None: as
    # llama.cpp decides for the device) and --mlock, for the target and the draft alike.
    flash_attn: bool | None = None
    mmap: bool | None = None
    mlock: bool = False
    # Sequences decoded together in one context (llama.cpp's --parallel/-np), each holding up to ctx_size
    # tokens: how many requests serve, or items batch, generate at once. AUTO_PARALLEL: as many as
    # PARALLEL_AUTO_MOST whose caches fit the memory beside the models (open_session decides).
    parallel: int = 1
    # Bytes of prompts' caches kept on disk for later runs to read back (0: none kept or read)
    prompt_cache: int = PROMPT_CACHE_BYTES
    # The target's KV cache types (llama.cpp's -ctk/-ctv; KV_CACHE_TYPES): q8_0 halves its memory; a quantized V
    # cache needs flash attention. The drafters' contexts have their own (-ctkd/-ctvd), f16 unless told, as llama.cpp's.
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    draft_cache_type_k: str = "f16"
    draft_cache_type_v: str = "f16"
    # A drafter context's threads (llama.cpp's -td); None: threads
    draft_threads: int | None = None
    # Tensors kept in a buffer of another type than their layer's (llama.cpp's -ot, --cpu-moe, --n-cpu-moe: a
    # MoE's experts in RAM, the rest on the GPU): (pattern, buffer type) each, the first pattern found deciding
    tensor_overrides: tuple[tuple[str, str], ...] = ()
    draft_tensor_overrides: tuple[tuple[str, str], ...] = ()
    # How offloaded layers split across GPUs (llama.cpp's -sm: SPLIT_MODES) and, split none, the one GPU (-mg,
    # in `localspec doctor`'s order of GPUs); kv_offload: the KV cache on the layers' device (-nkvo: in RAM)
    split_mode: str = "layer"
    main_gpu: int = 0
    kv_offload: bool = True
    # RoPE's scaling for a longer context, the target's and a draft model's alike (as llama-server's)
    rope: Rope = Rope()
    # The shortest run of cached tokens a prompt's reading shifts into place past where it departs from the cache
    # (llama-server's --cache-reuse; 0: none)
    cache_reuse: int = 0
    # LoRA adapters applied to the target (never to a draft model: drafts stay the draft's own, and verification
    # keeps the output the adapted target's), in the order serve's /lora-adapters numbers them
    lora: tuple[Adapter, ...] = ()
    # Control vectors added to the target's layers' outputs, each times its scale (llama.cpp's --control-vector),
    # on the layers from control_layers[0] to [1] (--control-vector-layer-range; None: every one llama.cpp steers,
    # from the first's output on)
    control_vectors: tuple[Adapter, ...] = ()
    control_layers: tuple[int, int] | None = None
    # The target's multimodal projector (llama.cpp's --mmproj: a GGUF, or hf:owner/repo/file.gguf), through which it
    # reads images; mmproj_offload: on the GPU where the target has layers there (--no-mmproj-offload: on the CPU);
    # mmproj_auto: where none is named, the one its Hub repo holds beside a target named by repo and quantization
    # (llama.cpp's -hf fetches it so; --no-mmproj: none)
    mmproj: str | None = None
    mmproj_offload: bool = True
    mmproj_auto: bool = True
    # How embeddings and reranking pool each input (llama.cpp's --pooling, POOLINGS): None, as the model's metadata
    # says (a generative model by the mean); "rank" scores query-document pairs with the model's classifier head
    pooling: str | None = None

    def __post_init__(self):
        if 0 < self.ctx_size < 8 or self.ctx_size < 0:
            raise UsageError(f"ctx-size must be at least 8, or 0 for the length the model was trained for;"
                             f" got {self.ctx_size}")
        if not AUTO_PARALLEL <= self.parallel <= PARALLEL_MOST:
            raise UsageError(f"--parallel takes 1 to {PARALLEL_MOST} sequences (0: as many as fit), got {self.parallel}")
        check_threads(self.threads)
        if self.draft_threads is not None:
            check_threads(self.draft_threads)
        if self.pooling is not None and self.pooling not in POOLINGS:
            raise UsageError(f"--pooling takes {', '.join(POOLINGS)} (llama.cpp's), got {self.pooling!r}")
        if self.split_mode not in SPLIT_MODES:
            raise UsageError(f"--split-mode takes {', '.join(SPLIT_MODES)} (llama.cpp's), got {self.split_mode!r}")
        if self.main_gpu < 0:
            raise UsageError(f"--main-gpu takes a GPU's number, 0 the first, got {self.main_gpu}")
        for pattern, _ in self.tensor_overrides + self.draft_tensor_overrides:
            try:
                re.compile(pattern)
            except re.error as error:
                raise UsageError(f"--override-tensor: {pattern!r} is not a regular expression ({error})") from None
            if re.search(r"\(\?[^:=!]", pattern):  # Python's own groups and flags, which llama.cpp's C++ regex lacks
                raise UsageError(f"--override-tensor: {pattern!r} uses a group llama.cpp's regular expressions (C++'s"
                                 " ECMAScript) lack: (?:...), (?=...) and (?!...) are theirs")
        if self.prompt_cache < 0:
            raise UsageError(f"--prompt-cache takes a size >= 0 (0: off), got {self.prompt_cache}")
        if self.control_layers is not None and not 0 < self.control_layers[0] <= self.control_layers[1]:
            raise UsageError(f"--control-vector-layer-range takes START END, 1 <= START <= END, got"
                             f" {self.control_layers[0]} {self.control_layers[1]}")
        if self.cache_reuse < 0:
            raise UsageError(f"--cache-reuse takes a run's length in tokens >= 0 (0: off), got {self.cache_reuse}")
        if self.prompt_batch < 1:
            raise UsageError(f"batch-size must be >= 1, got {self.prompt_batch}")
        if (self.gpu_layers or 0) < -1 or (self.draft_gpu_layers or 0) < -1:
            raise UsageError("gpu layers must be >= 0, or -1 for all layers")
        if self.fit_margin < 0:
            raise UsageError(f"--fit-target takes MiB >= 0 to leave free on each GPU, got {self.fit_margin // 2**20}")
        for endpoint in self.rpc:
            host, _, port = endpoint.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise UsageError(f"--rpc takes HOST:PORT[,HOST:PORT...], got {endpoint!r}")
        if self.tensor_split is not None and (not any(self.tensor_split) or min(self.tensor_split) < 0):
            raise UsageError("--tensor-split takes shares >= 0, not all 0 (3,1: three quarters on the first device)")
        for option, kind in (("--cache-type-k", self.cache_type_k), ("--cache-type-v", self.cache_type_v),
                             ("--cache-type-k-draft", self.draft_cache_type_k),
                             ("--cache-type-v-draft", self.draft_cache_type_v)):
            if kind not in KV_CACHE_TYPES:
                raise UsageError(f"{option} takes one of {', '.join(KV_CACHE_TYPES)} (llama.cpp's), got {kind!r}")
        for option, kind in (("--cache-type-v", self.cache_type_v), ("--cache-type-v-draft", self.draft_cache_type_v)):
            if kind not in UNQUANTIZED and self.flash_attn is False:
                raise UsageError(f"{option} {kind} needs flash attention, which -fa off turns off")

    @property
    def kv_bytes(self) -> tuple[float, float]:
        """Bytes a value of the target's K and V caches takes."""
        return _bytes_a_value(self.cache_type_k, self.cache_type_v)

    @property
    def draft_kv_bytes(self) -> tuple[float, float]:
        """Bytes a value of a drafter's K and V caches takes."""
        return _bytes_a_value(self.draft_cache_type_k, self.draft_cache_type_v)


def _bytes_a_value(*kinds: str) -> tuple[float, ...]:
    return tuple(size / values for _, values, size in map(KV_CACHE_TYPES.__getitem__, kinds))


def check_draft_fits(speculation: Speculation, runtime: Runtime) -> None:
    """A step verifies draft_max + 1 tokens in one batch, which must fit the prompt batch (-b) and the
    context (-c). Checked before anything loads: llama.cpp crashed sizing a batch of 2**31 rows, and one of
    100,000 rows took two minutes to set up, for a context that could never verify more than 4095."""
    if speculation.draft_max is None:
        return  # each kind's default fits: the session sizes its batch for them
    room = min(runtime.ctx_size or runtime.prompt_batch, runtime.prompt_batch) - 1  # (0: the model's, ample)
    if speculation.draft_max > room:
        raise UsageError(f"draft-max {speculation.draft_max} does not fit: a step verifies draft-max + 1 tokens"
                         f" in one batch, and the batch holds {runtime.prompt_batch} tokens (--batch-size) and the"
                         f" context {runtime.ctx_size} (--ctx-size); use at most {room}")


MOST_STOPS = 64  # stop strings a generation takes (OpenAI's API takes 4)
MOST_STOP_CHARACTERS = 1_000


@dataclass(frozen=True)
class Limits:
    """When a generation ends, besides the context filling up. max_tokens None: no limit of its own
    (llama.cpp's -n -1), so the model's end token or a full context ends it. For code completion, as
    llama-server's n_indent and t_max_predict_ms: indent, a line after the first that starts with less
    indentation than this ends the text there (the block is done; its indentation is kept); seconds, once
    decoding has run this long, the next newline ends it."""

    max_tokens: int | None = 512
    stop: tuple[str, ...] = ()
    indent: int = 0
    seconds: float | None = None

    def __post_init__(self):
        of_their_types(self)
        if isinstance(self.stop, str):  # (one stop string, as overridden() takes one: its characters were taken)
            object.__setattr__(self, "stop", (self.stop,))
        if not (isinstance(self.stop, Sequence) and all(isinstance(text, str) for text in self.stop)):
            raise UsageError(f"stop must be a text or a list of texts, got {self.stop!r}", "stop")
        object.__setattr__(self, "stop", tuple(self.stop))
        if self.max_tokens == -1:
            object.__setattr__(self, "max_tokens", None)
        if self.max_tokens is not None and self.max_tokens < 1:
            raise UsageError(f"max-tokens must be >= 1, or -1 for no limit, got {self.max_tokens}")
        if any(s == "" for s in self.stop):
            raise UsageError("a stop string cannot be empty", "stop")
        # every stop string is looked for in the text at every token: 550,000 of them added 0.45 s to each step
        if len(self.stop) > MOST_STOPS:
            raise UsageError(f"{len(self.stop):,} stop strings; at most {MOST_STOPS} are taken", "stop")
        if any(len(s) > MOST_STOP_CHARACTERS for s in self.stop):
            raise UsageError(f"a stop string is longer than {MOST_STOP_CHARACTERS:,} characters", "stop")
        if self.indent < 0:
            raise UsageError(f"indent must be >= 0, got {self.indent}", "indent")
        if self.seconds is not None and not self.seconds > 0:
            raise UsageError(f"a time limit must be above 0 seconds, got {self.seconds}", "seconds")


EFFORTS = ("low", "medium", "high")


@dataclass(frozen=True)
class Thinking:
    """How a reasoning model thinks before it answers.

    think: whether it thinks (None: as its template does by default); effort: how hard (gpt-oss's
    reasoning_effort, one of EFFORTS; None: the template's default); budget: most tokens of thinking,
    after which the block is closed for it and it answers (None: no limit; 0: it answers at once)."""

    think: bool | None = None
    effort: str | None = None
    budget: int | None = None
    # think (True) asked of whatever model answers (a request's enable_thinking, which clients send to every model):
    # a model that does not think answers as it does rather than refuse
    if_able: bool = False

    def __post_init__(self):
        if self.effort is not None and self.effort not in EFFORTS:
            raise UsageError(f"reasoning effort must be one of {', '.join(EFFORTS)}, got {self.effort!r}")
        if self.budget == -1:  # llama.cpp's spelling of no limit
            object.__setattr__(self, "budget", None)
        if self.budget is not None and self.budget < 0:
            raise UsageError(f"reasoning budget must be >= 0 tokens, or -1 for no limit, got {self.budget}")

    @property
    def off(self) -> bool:
        """Whether the model is to answer without thinking."""
        return self.think is False or self.budget == 0


# what a request may set over the sampling it runs under (Sampling's fields but those serve fixes)
OVERRIDABLE = ("temperature", "top_k", "top_p", "min_p", "seed", "grammar", "repeat_penalty", "repeat_last_n",
               "frequency_penalty", "presence_penalty", "logit_bias", "ignore_eos", "dry_multiplier", "dry_base",
               "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers", "xtc_probability", "xtc_threshold",
               "typical_p", "dynatemp_range", "dynatemp_exponent", "top_n_sigma", "mirostat", "mirostat_tau",
               "mirostat_eta", "logprobs", "logprobs_sampled")


def overridden(sampling: Sampling, limits: Limits, *, max_tokens: int | None = None,
               stop: str | Sequence[str] | None = None, **asked) -> tuple[Sampling, Limits]:
    """A request's own settings over the ones it runs under: a batch item's fields, an API request's, a
    library call's keywords (OVERRIDABLE, max_tokens and stop; any other name is a UsageError naming the
    close ones). None keeps what it runs under; stop may be one string. Sampling and Limits check the
    values, so every way in refuses the same ones."""
    unknown = sorted(set(asked) - set(OVERRIDABLE))
    if unknown:
        known = (*OVERRIDABLE, "max_tokens", "stop")
        hint = meant(unknown[0], known) or f"the settings are {', '.join(known)}"
        raise UsageError(f"unknown setting {unknown[0]!r}: {hint}", setting=unknown[0])
    kinds = held_types(Sampling)
    asked = {name: of_its_type(name, value, kinds[name]) for name, value in asked.items() if value is not None}
    max_tokens = None if max_tokens is None else of_its_type("max_tokens", max_tokens, int)
    if stop is not None and not (isinstance(stop, str) or isinstance(stop, Sequence)
                                 and all(isinstance(text, str) for text in stop)):
        raise UsageError(f"stop must be a text or a list of texts, got {stop!r}", setting="stop")
    return (replace(sampling, **asked),
            replace(limits, max_tokens=limits.max_tokens if max_tokens is None else max_tokens,
                    stop=limits.stop if stop is None else tuple([stop] if isinstance(stop, str) else stop)))


def meant(name: str, known) -> str:
    """"did you mean NAME?" for the known name closest to a misspelt one, else nothing."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"did you mean {close[0]}?" if close else ""


@functools.cache
def held_types(settings: type) -> dict[str, type]:
    """What each field of a dataclass of settings holds (bool, int, float or str; object where it is none of these),
    for values that could come of any type (a chat's /set parameter, a library call's keyword): the settings' own
    checks compare and count, and failed on a text with a traceback."""
    return {name: next((kind for kind in (bool, int, float, str)
                        if kind in (typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,))), object)
            for name, hint in typing.get_type_hints(settings).items()}


def of_their_types(settings) -> None:
    """A dataclass of settings' fields as they hold them (of_its_type), set in place: a library caller's Sampling(
    temperature="hot") or Limits(max_tokens=8.0) failed with a traceback in the checks, or later in the engine."""
    for name, kind in held_types(type(settings)).items():
        value = getattr(settings, name)
        if value is not None and kind is not object:
            object.__setattr__(settings, name, of_its_type(name, value, kind))


def of_its_type(name: str, value, kind: type):
    """A setting's value as its field holds it (a whole float as a count: JSON's 40.0 is 40; a path as a text), else a
    UsageError naming the setting as it was given (a keyword, a batch item's field, a chat's /set parameter)."""
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if kind is float and number:
        return value
    if kind is int and number and float(value).is_integer():
        return int(value)
    if kind is object or kind in (bool, str) and isinstance(value, kind) or kind is str and isinstance(value, os.PathLike):
        return value
    wanted = {bool: "true or false", int: "a whole number", float: "a number", str: "a text"}[kind]
    raise UsageError(f"{name} must be {wanted}, got {value!r}", setting=name)  # (the name as the user wrote it)


LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")


@dataclass(frozen=True)
class Serving:
    """How `localspec serve` listens and admits requests. queue: requests that may wait behind the
    running one before more are refused (429). max_body: the largest request body read, in bytes.
    timeout: seconds a connection may hold the door without a complete request (headers or body sent
    slowly, or idle between requests). max_connections: open connections at once; more are closed on arrival."""

    host: str = "127.0.0.1"  # this machine only: exposing a model is the user's explicit choice
    port: int = 8080  # llama-server's
    # Each request must carry one of these (none: any request is served). Each key's client drafts only from
    # its own earlier answers: with a cache shared, one client's timing would tell another's text.
    api_keys: tuple[str, ...] = ()
    queue: int = 16
    max_body: int = 8 * 2**20
    timeout: float = 10.0
    max_connections: int = 1024
    alias: str | None = None  # the model's name in the API; None: the target as named on the command line
    # Seconds a model loaded on demand stays loaded once idle (Ollama's default; math.inf: while serve runs)
    keep_alive: float = 300.0
    # Web pages that may call the API from a browser besides those served from this machine (CORS):
    # scheme://host[:port] each, or "*" for any.
    cors_origins: tuple[str, ...] = ()
    # Whether Ollama's /api/pull may download models (any client could make the server fetch and load any Hub
    # GGUF), and /api/create, /api/copy, /api/delete and /api/blobs change the models here; None: where serve
    # listens on this machine only.
    allow_pull: bool | None = None
    # --offline: requests never make serve contact the Hub either (a pull of a model here answers at once; the
    # SDK's search finds the registry's; a model not here is refused, naming `localspec pull`)
    offline: bool = False
    # llama-server's GET /slots (--no-slots: a 501) and its POST /slots/ID?action=save|restore|erase, with files in
    # this folder (None: a 501, as llama-server without --slot-save-path)
    slots: bool = True
    slot_save_path: Path | None = None
    web_page: bool = True  # the chat page at / for a browser (llama-server's --no-webui: none)
    # HTTPS: a PEM certificate (its chain) and its private key (llama-server's --ssl-cert-file, --ssl-key-file)
    certificate: Path | None = None
    private_key: Path | None = None

    def __post_init__(self):
        if not 0 <= self.port <= 65535:
            raise UsageError(f"port must be between 0 and 65535 (0: any free port), got {self.port}")
        if self.queue < 0:
            raise UsageError(f"queue must be >= 0, got {self.queue}")
        if not 0 < self.timeout <= 3600:
            raise UsageError(f"timeout must be between 0 and 3600 seconds, got {self.timeout}")
        if self.max_connections < 1:
            raise UsageError(f"max-connections must be >= 1, got {self.max_connections}")
        if any(not key.strip() for key in self.api_keys):
            raise UsageError("an API key is empty")
        if (self.certificate is None) != (self.private_key is None):
            raise UsageError("HTTPS takes both --ssl-cert-file and --ssl-key-file (a certificate and its private key)")
        for origin in self.cors_origins:
            if origin != "*" and not re.fullmatch(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s]+", origin):
                raise UsageError(f"--cors-origin {origin!r} is not an origin: scheme://host[:port] with no path"
                                 " (https://example.com, http://localhost:3000), or * for any")

    @property
    def tls(self) -> bool:
        return self.certificate is not None

    @property
    def model_changes(self) -> bool:
        """Whether Ollama's /api/pull downloads, and its /api/create, /api/copy, /api/delete and /api/blobs change
        the models."""
        return self.host in LOOPBACK_HOSTS if self.allow_pull is None else self.allow_pull

    @property
    def exposure_warning(self) -> str | None:
        """What to tell the operator of a server other machines can reach and use without a key."""
        if self.host in LOOPBACK_HOSTS or self.api_keys:
            return None
        return (f"warning: listening on {self.host} without --api-key: anyone who can reach this machine can use"
                " the model")


@dataclass(frozen=True)
class Lending:
    """How `localspec worker` lends this machine to another's llama.cpp over RPC."""

    host: str = "127.0.0.1"
    port: int = 50052  # llama.cpp's rpc-server's
    devices: tuple[str, ...] | None = None  # None: this machine's GPUs, else its CPU
    threads: int = field(default_factory=default_threads)
    cache_dir: str | None = None

    def __post_init__(self):
        if not 0 < self.port < 65536:
            raise UsageError(f"port must be between 1 and 65535, got {self.port}")
        check_threads(self.threads)

    @property
    def exposure_warning(self) -> str | None:
        if self.host in LOOPBACK_HOSTS:
            return None
        return (f"warning: listening on {self.host}: llama.cpp's RPC protocol has no authentication and no"
                " encryption, and whoever reaches this port can use this machine's memory and compute."
                " Run workers on a trusted network only.")
