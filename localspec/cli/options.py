"""The options the generating commands share (llama.cpp's spellings), turned into one checked Settings,
and the user's input as given (files, standard input, llama.cpp's escapes)."""

import copy
import dataclasses
import functools
import inspect
import io
import json
import math
import os
import re
import stat
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from .. import paths
from ..config import (
    AUTO_PARALLEL,
    EFFORTS,
    KV_CACHE_TYPES,
    ROPE_SCALING,
    SPEC_CHOICES,
    SPLIT_MODES,
    HUB_PREFIX,
    Adapter,
    DEFAULT_BRANCHES,
    DrafterKind,
    Limits,
    Rope,
    Runtime,
    Sampling,
    Speculation,
    Thinking,
    check_draft_fits,
    default_threads,
)
from ..errors import InputError, LocalspecError, UsageError, json_trouble
from ..engine.drafters.spec import DRAFT_WORDS, PUBLISHED_DRAFTERS, default_draft_max

if TYPE_CHECKING:
    from ..store import Preset

# The store, the prompts' machinery and a session's drafting are imported by the functions that turn options into
# settings: --help, and the shell completing a word, do not load them.

DEFAULT_SAMPLING = Sampling()
DEFAULT_SPECULATION = Speculation()
DEFAULT_RUNTIME = Runtime()
DEFAULT_LIMITS = Limits()

SAMPLING = "Sampling"
SPECULATION = "Speculation"
RESOURCES = "Resources"
THINKING = "Thinking (reasoning models)"
TEMPLATE = "Chat template"
ROPE = "Longer contexts (RoPE scaling)"
ADAPTERS = "LoRA adapters and control vectors"
VISION = "Images and audio"


def complete_model(incomplete: str) -> list[tuple[str, str]]:
    """The model names that begin with what was typed, for the shell's TAB (`localspec --install-completion`). A
    word none begins with gets nothing back: bash then completes it as a file's path (a GGUF file), as zsh and fish
    do with what they are given."""
    from .. import store

    try:
        names = dict(reversed(store.names()))  # (a name given twice keeps what it first is)
    except (LocalspecError, OSError):  # (a broken registry file of one's own: no names rather than a traceback)
        return []
    return [(name, what) for name, what in sorted(names.items()) if name.startswith(incomplete)]


def complete_loaded(incomplete: str) -> list[str]:
    """The models serves on this machine loaded on demand that begin with what was typed (`stop`'s TAB)."""
    from .. import remote

    return [name for name in remote.loaded_on_demand(TAB_SECONDS) if name.startswith(incomplete)]


TAB_SECONDS = 0.5  # what a TAB waits at most for a serve to say what it holds


def complete_draft(incomplete: str) -> list[tuple[str, str]]:
    """--draft's words, then the model names, that begin with what was typed."""
    words = {"auto": "the draft the registry recommends", DrafterKind.NGRAM: "n-gram lookup",
             **{str(word): what for word, what in DRAFT_WORDS.items()}}
    words |= {word: f"the {word} file published beside it" for word in PUBLISHED_DRAFTERS if word not in words}
    return [(word, what) for word, what in words.items() if word.startswith(incomplete)] + complete_model(incomplete)


def completing(words) -> Callable[[str], list[str]]:
    """The completion of an option that takes one of words (on TAB, those that begin with what was typed)."""
    return lambda incomplete: [word for word in words if word.startswith(incomplete)]


SWITCH_WORDS = ("on", "off", "auto")  # what --flash-attn and --reasoning complete to (SWITCH reads more)

OfflineOption = Annotated[bool, typer.Option("--offline", help="Use only downloaded models; never contact the Hub.")]
# The options generating commands share, in groups, each option as (type with its help, default).
# with_options adds them to a command and builds one Settings from them.
MODEL_OPTIONS = {
    "target": (Annotated[Optional[str], typer.Argument(
        help="Target model: a registry name (see `localspec models`) or Ollama's name for it (qwen2.5-coder:1.5b,"
        " llama3.2), a GGUF file, hf:owner/repo/file.gguf, or owner/repo:Q4_K_M.", show_default=False,
        autocompletion=complete_model)], None),
    "model": (Annotated[Optional[str], typer.Option(
        "--model", "-m", help="The target, spelled as llama.cpp spells it (instead of TARGET).",
        show_default=False, autocompletion=complete_model)], None),
    "hf_repo": (Annotated[Optional[str], typer.Option(
        "--hf-repo", "-hf", "-hfr", metavar="OWNER/REPO[:QUANT]", help="The target as llama.cpp's -hf names it: a"
        " Hub repo of GGUFs and a quantization (Q4_K_M where none is given).", show_default=False)], None),
    "hf_repo_draft": (Annotated[Optional[str], typer.Option(
        "--hf-repo-draft", "-hfd", "-hfrd", "--spec-draft-hf", metavar="OWNER/REPO[:QUANT]",
        help="The draft model so (llama.cpp's -hfd).", show_default=False)], None),
    "draft": (Annotated[Optional[str], typer.Option(
        "--draft", "-d", "-md", "--model-draft", "--spec-draft-model",
        help="Draft model: a name, a size in the target's family (0.5b), 'auto' for the one the registry recommends,"
        " a GGUF file (any model: one whose vocabulary is not the target's drafts through text, with lower"
        " acceptance than a same-family draft); 'ngram' to draft by looking up the prompt and output; "
        + "; ".join(f"'{word}' to draft with {what}" for word, what in DRAFT_WORDS.items()) + ". Default: ngram.",
        show_default=False, autocompletion=complete_draft)], None),
    "offline": (OfflineOption, False),
}
DRAFTING_OPTIONS = {
    "no_draft": (Annotated[bool, typer.Option("--no-draft", help="Plain decoding, no speculation.")], False),
    "spec_type": (Annotated[Optional[list[str]], typer.Option(
        "--spec-type", metavar="TYPE[,TYPE]", help="llama-server's names for its drafters, taken as --draft's:"
        " draft-simple: the -md draft model; draft-mtp, draft-eagle3, draft-dflash: --draft mtp, eagle3, dflash"
        " (or the -md file); ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache: n-gram lookup"
        " (localspec has one for all five); none: --no-draft. Several, comma-separated: n-gram lookup beside"
        " one model's drafter.", show_default=False,
        rich_help_panel=SPECULATION)], None),
    "spec_default": (Annotated[bool, typer.Option(
        "--spec-default", help="llama-server's default speculation (its ngram-mod): n-gram lookup here.",
        rich_help_panel=SPECULATION)], False),
    "spec": (Annotated[str, typer.Option(
        "--spec", help="auto: choose each step between plain decoding and drafting with n-gram lookup, earlier"
        " answers (the suffix cache), a --prediction, or the --draft drafter (a draft model, MTP, EAGLE-3, DFlash),"
        " by measured cost and acceptance; fixed: always draft up to --draft-max with the --draft drafter (n-gram"
        " lookup without one); off: plain decoding.",
        autocompletion=completing(SPEC_CHOICES), rich_help_panel=SPECULATION)], "auto"),
}
SPECULATION_OPTIONS = {
    "draft_max": (Annotated[Optional[int], typer.Option(
        "--draft-max", "--spec-draft-n-max", show_default=False, rich_help_panel=SPECULATION,
        help=f"Most tokens drafted a step. Default: {default_draft_max(DrafterKind.AUTO)} with auto;"
        f" {default_draft_max(DrafterKind.DRAFT)} with n-gram lookup or the draft model alone"
        " (--spec fixed; bench's ngram and draft modes).")],
        None),
    "draft_min": (Annotated[int, typer.Option("--draft-min", "--spec-draft-n-min", help="Skip drafts shorter than this.",
                                              rich_help_panel=SPECULATION)], DEFAULT_SPECULATION.draft_min),
    "suffix_cache": (Annotated[bool, typer.Option(
        "--suffix-cache/--no-suffix-cache", help="Let auto draft from earlier generations of this process too"
        " (chat turns, batch items, server requests) where their text repeats, as SuffixDecoding does; kept in"
        " memory only (at most a million tokens), for this model only.", rich_help_panel=SPECULATION)],
        DEFAULT_SPECULATION.suffix_cache),
    "draft_branches": (Annotated[Optional[int], typer.Option(
        "--draft-branches", show_default=False, rich_help_panel=SPECULATION,
        help=f"Most branches a draft tree has: where n-gram lookup or earlier answers saw several continuations,"
        f" or a draft model a close runner-up (sampling: a second draw), the target verifies them side by side in one pass and keeps the"
        f" one it agrees with (output unchanged). Default: auto grows up to {DEFAULT_BRANCHES} where the measured"
        f" cost of the extra rows pays; 1: chains only; N: also --spec fixed drafts (n-gram, the draft model's"
        f" runner-ups, each drafted on) and a --prediction's forks (an edit seen once, made again or not) are trees of up to N"
        f" branches.")], None),
    "p_min": (Annotated[float, typer.Option(
        "--p-min", "--draft-p-min", "--spec-draft-p-min",
        help="Stop a model draft when its likeliest next token is less probable than this (llama.cpp's --draft-p-min).",
        rich_help_panel=SPECULATION)], DEFAULT_SPECULATION.p_min),
}
SAMPLING_OPTIONS = {
    "temp": (Annotated[float, typer.Option("--temp", help="Temperature; 0 is greedy.", rich_help_panel=SAMPLING)],
             DEFAULT_SAMPLING.temperature),
    "top_k": (Annotated[int, typer.Option("--top-k", help="Keep the k likeliest tokens; 0 keeps all.",
                                          rich_help_panel=SAMPLING)], DEFAULT_SAMPLING.top_k),
    "top_p": (Annotated[float, typer.Option("--top-p", help="Keep the smallest set with this much probability.",
                                            rich_help_panel=SAMPLING)], DEFAULT_SAMPLING.top_p),
    "min_p": (Annotated[float, typer.Option("--min-p", help="Drop tokens below this fraction of the likeliest one.",
                                            rich_help_panel=SAMPLING)], DEFAULT_SAMPLING.min_p),
    "seed": (Annotated[Optional[int], typer.Option(
        "--seed", "-s", help="Seed for reproducible sampling. Default (or -1, as in llama.cpp): random.",
        rich_help_panel=SAMPLING)], None),
    "grammar": (Annotated[Optional[str], typer.Option(
        "--grammar", help="A GBNF grammar (llama.cpp's format) the output must follow; speculation stays lossless"
        " under it.", show_default=False, rich_help_panel=SAMPLING)], None),
    "grammar_file": (Annotated[Optional[Path], typer.Option(
        "--grammar-file", help="The same, read from a file.", show_default=False, rich_help_panel=SAMPLING)], None),
    "json_schema": (Annotated[Optional[str], typer.Option(
        "--json-schema", "-j", help="A JSON schema the output must follow, e.g. '{}' for any JSON value; turned"
        " into a grammar by llama.cpp's converter.", show_default=False, rich_help_panel=SAMPLING)], None),
    "json_schema_file": (Annotated[Optional[Path], typer.Option(
        "--json-schema-file", help="The same, read from a file.", show_default=False, rich_help_panel=SAMPLING)],
        None),
    "format": (Annotated[Optional[str], typer.Option(
        "--format", metavar="json", help="Ollama's --format: json makes the output a JSON object (as serve's"
        " format: \"json\"); a schema is --json-schema's.", show_default=False, rich_help_panel=SAMPLING)], None),
    "repeat_penalty": (Annotated[float, typer.Option(
        "--repeat-penalty", help="Divide the logit of a token among the last --repeat-last-n by this (multiply a"
        " negative one), as llama.cpp does; 1.0 is none. Speculation stays lossless under every penalty.",
        rich_help_panel=SAMPLING)], DEFAULT_SAMPLING.repeat_penalty),
    "repeat_last_n": (Annotated[int, typer.Option(
        "--repeat-last-n", help="How many tokens back the penalties count (the prompt's among them); 0: none,"
        " -1: the whole context.", rich_help_panel=SAMPLING)], DEFAULT_SAMPLING.repeat_last_n),
    "presence_penalty": (Annotated[float, typer.Option(
        "--presence-penalty", help="Lower the logit of every token among the last --repeat-last-n by this"
        " (OpenAI's presence_penalty); negative raises it.", rich_help_panel=SAMPLING)],
        DEFAULT_SAMPLING.presence_penalty),
    "frequency_penalty": (Annotated[float, typer.Option(
        "--frequency-penalty", help="Lower a token's logit by this for each time it is among the last"
        " --repeat-last-n (OpenAI's frequency_penalty).", rich_help_panel=SAMPLING)],
        DEFAULT_SAMPLING.frequency_penalty),
    "logit_bias": (Annotated[Optional[list[str]], typer.Option(
        "--logit-bias", "-l", metavar="TOKEN_ID(+/-)BIAS", help="Add BIAS to a token's logit before anything else,"
        " as llama.cpp's: 15043+1 makes token 15043 likelier, 15043-1 less likely, 15043-inf bans it (repeatable;"
        " `localspec tokenize MODEL TEXT` shows the ids). Speculation stays lossless under it.", show_default=False,
        rich_help_panel=SAMPLING)], None),
    "ignore_eos": (Annotated[bool, typer.Option(
        "--ignore-eos", help="Never end at the model's end-of-generation tokens: write on until --max-tokens or the"
        " context is full (llama.cpp's; for benchmarks of fixed lengths). What a model writes past its own end"
        " often repeats itself, which flatters drafting: measure speedups without it.", rich_help_panel=SAMPLING)],
        DEFAULT_SAMPLING.ignore_eos),
    "dry_multiplier": (Annotated[float, typer.Option(
        "--dry-multiplier", help="DRY (\"don't repeat yourself\", llama.cpp's): where a token would extend a repeat"
        " of L >= --dry-allowed-length tokens, lower its logit by this times --dry-base ** (L - --dry-allowed-length);"
        " 0 is off. Speculation stays lossless under it, though it turns down what n-gram drafting proposes inside a"
        " repeat.", rich_help_panel=SAMPLING)], DEFAULT_SAMPLING.dry_multiplier),
    "dry_base": (Annotated[float, typer.Option(
        "--dry-base", help="How fast DRY's penalty grows with a repeat's length (>= 1).", rich_help_panel=SAMPLING)],
        DEFAULT_SAMPLING.dry_base),
    "dry_allowed_length": (Annotated[int, typer.Option(
        "--dry-allowed-length", help="How long a repeat must be for DRY to penalise its going on.",
        rich_help_panel=SAMPLING)],
        DEFAULT_SAMPLING.dry_allowed_length),
    "dry_penalty_last_n": (Annotated[int, typer.Option(
        "--dry-penalty-last-n", help="How many tokens back DRY looks for repeats (the prompt's among them); 0: none,"
        " -1: the whole context.", rich_help_panel=SAMPLING)], DEFAULT_SAMPLING.dry_penalty_last_n),
    "dry_sequence_breaker": (Annotated[Optional[list[str]], typer.Option(
        "--dry-sequence-breaker", metavar="TEXT", help="A repeat never reaches back past this text (repeatable; it"
        " replaces the defaults \\n : \" *; none: no breakers). \\n and the like are read as llama.cpp reads them.",
        show_default=False, rich_help_panel=SAMPLING)], None),
    "xtc_probability": (Annotated[float, typer.Option(
        "--xtc-probability", help="XTC (\"exclude top choices\", llama.cpp's): at a token, with this chance, leave out"
        " every candidate at least --xtc-threshold likely but the least likely of them; 0 is off. Not with --temp 0."
        " Speculation keeps its distribution; drafts are accepted less often while it bites.",
        rich_help_panel=SAMPLING)], DEFAULT_SAMPLING.xtc_probability),
    "xtc_threshold": (Annotated[float, typer.Option(
        "--xtc-threshold", help="How likely a candidate must be for XTC to leave it out (above 0.5: never).",
        rich_help_panel=SAMPLING)], DEFAULT_SAMPLING.xtc_threshold),
    "typical_p": (Annotated[float, typer.Option(
        "--typical", help="Locally typical sampling (llama.cpp's): keep the tokens whose surprise is nearest the"
        " row's entropy, as many as make this much of its probability; 1.0 is off.", rich_help_panel=SAMPLING)],
        DEFAULT_SAMPLING.typical_p),
    "dynatemp_range": (Annotated[float, typer.Option(
        "--dynatemp-range", help="Dynamic temperature (llama.cpp's): each token's temperature between --temp minus"
        " and plus this, higher where the model is less sure; 0 is off.", rich_help_panel=SAMPLING)],
        DEFAULT_SAMPLING.dynatemp_range),
    "dynatemp_exponent": (Annotated[float, typer.Option(
        "--dynatemp-exp", help="How the dynamic temperature follows the row's entropy (its power).",
        rich_help_panel=SAMPLING)], DEFAULT_SAMPLING.dynatemp_exponent),
    "top_n_sigma": (Annotated[float, typer.Option(
        "--top-n-sigma", "--top-nsigma", help="Top-n-sigma (llama.cpp's): keep only the tokens whose logit is within this many"
        " standard deviations of the highest; 0 or less is off.", rich_help_panel=SAMPLING)],
        DEFAULT_SAMPLING.top_n_sigma),
    "mirostat": (Annotated[int, typer.Option(
        "--mirostat", help="Mirostat sampling (llama.cpp's): 1 or 2 (Mirostat 2.0), 0 is off. It keeps the output's"
        " surprise near --mirostat-ent by cutting each token's candidates at a threshold it adjusts as it goes;"
        " --top-k, --top-p, --min-p, --typical, --top-n-sigma and XTC are then not used, as in llama.cpp."
        " Speculation keeps its distribution.", rich_help_panel=SAMPLING)], DEFAULT_SAMPLING.mirostat),
    "mirostat_tau": (Annotated[float, typer.Option(
        "--mirostat-ent", help="Mirostat's target surprise (tau), in bits: lower is more focused.",
        rich_help_panel=SAMPLING)], DEFAULT_SAMPLING.mirostat_tau),
    "mirostat_eta": (Annotated[float, typer.Option(
        "--mirostat-lr", help="Mirostat's learning rate (eta): how fast its threshold follows.",
        rich_help_panel=SAMPLING)], DEFAULT_SAMPLING.mirostat_eta),
}
LIMIT_OPTIONS = {
    "max_tokens": (Annotated[int, typer.Option("--max-tokens", "-n", "--n-predict", help="Most tokens to generate; -1: until the model stops or the context is full.")],
                   DEFAULT_LIMITS.max_tokens),
    "stop": (Annotated[Optional[list[str]], typer.Option(
        "--stop", help="End generation at this text (repeatable); it is not printed.", show_default=False)], None),
}
THINKING_OPTIONS = {
    "think": (Annotated[Optional[bool], typer.Option(
        "--think/--no-think", help="Whether a reasoning model (Qwen3.x, DeepSeek-R1, gpt-oss, Gemma 4, GLM-4.5)"
        " thinks before it answers. Default: it does, as with llama-server and Ollama (its template is told"
        " enable_thinking); gpt-oss always thinks, and --no-think has it answer in its final channel at once.",
        show_default=False, rich_help_panel=THINKING)], None),
    "reasoning": (Annotated[Optional[str], typer.Option(
        "--reasoning", "-rea", metavar="on|off|auto", help="llama-server's switch for the same: on is --think, off"
        " --no-think, auto (the default) as the model's template decides.", show_default=False,
        autocompletion=completing(SWITCH_WORDS), rich_help_panel=THINKING)], None),
    "reasoning_effort": (Annotated[Optional[str], typer.Option(
        "--reasoning-effort", metavar="low|medium|high", help="How hard gpt-oss thinks (its template's"
        " reasoning_effort; medium by default).", show_default=False,
        autocompletion=completing(EFFORTS), rich_help_panel=THINKING)], None),
    "reasoning_budget": (Annotated[int, typer.Option(
        "--reasoning-budget", metavar="N", help="Most tokens of thinking: at N the block is closed for the model"
        " and it answers, as llama.cpp's budget does. -1: no limit; 0: no thinking.",
        rich_help_panel=THINKING)], -1),
}
TEMPLATE_OPTIONS = {
    "chat_template": (Annotated[Optional[str], typer.Option(
        "--chat-template", metavar="JINJA", help="A chat template to render conversations with in place of the"
        " GGUF's own, as llama.cpp's: its Jinja text (a fixed one a model's makers publish).", show_default=False,
        rich_help_panel=TEMPLATE)], None),
    "chat_template_file": (Annotated[Optional[Path], typer.Option(
        "--chat-template-file", metavar="FILE", help="The same, read from a file.", show_default=False,
        rich_help_panel=TEMPLATE)], None),
    "chat_template_kwargs": (Annotated[Optional[str], typer.Option(
        "--chat-template-kwargs", metavar="JSON", help="More variables for the chat template, a JSON object, as"
        " llama.cpp's: a model's own switch ('{\"thinking\": true}' for DeepSeek V3.1), a Llama 3.1 template's"
        " date_string. serve: under each request's chat_template_kwargs. enable_thinking and reasoning_effort are"
        " --think's and --reasoning-effort's to set.", show_default=False, rich_help_panel=TEMPLATE)], None),
    "jinja": (Annotated[bool, typer.Option(
        "--jinja/--no-jinja", help="llama.cpp's: chat templates are always rendered with Jinja here, so --jinja"
        " changes nothing and --no-jinja (llama.cpp's built-in template guesses) is refused.",
        rich_help_panel=TEMPLATE)], True),
}
# What the help of an option of the target's says of the draft model, left out where none runs (perplexity: the
# target alone reads the text)
OF_THE_DRAFT = {
    "gpu_layers": " beside the draft model",
    "flash_attn": " For the target and the draft model.",
    "cache_type_k": " Speculation stays lossless: the text is what the target writes with that cache. The draft's:"
                    " -ctkd.",
    "rpc": " The draft model stays here.",
    "lora": " The draft stays as it is: the text is the adapted target's, and where the adapter moves the target away"
            " from the draft, fewer drafts are accepted (bench --lora measures it).",
    "control_vector": ", drafts checked against it",
}
RESOURCE_OPTIONS = {
    "ctx_size": (Annotated[int, typer.Option(
        "--ctx-size", "-c", help="Context length in tokens (llama.cpp rounds it up to a multiple of 256); 0: the"
        " length the model was trained for, as llama.cpp's -c 0 (each sequence's, with --parallel).",
        rich_help_panel=RESOURCES)], DEFAULT_RUNTIME.ctx_size),
    "threads": (Annotated[int, typer.Option(
        "--threads", "-t", help="CPU threads, at most the machine's logical CPUs. Default (or 0): physical cores.",
        show_default=False, rich_help_panel=RESOURCES)], 0),
    "gpu_layers": (Annotated[Optional[str], typer.Option(
        "--gpu-layers", "-ngl", "--n-gpu-layers", metavar="N", help="Target layers on the GPU: a count, or auto (the"
        " default, llama.cpp's): every one where they fit, else as many as the GPUs' free memory holds"
        + OF_THE_DRAFT["gpu_layers"] + " (the rest run on the CPU); all (or -1): every one, checked to fit.", show_default=False,
        rich_help_panel=RESOURCES)], None),
    "draft_gpu_layers": (Annotated[Optional[str], typer.Option(
        "--draft-gpu-layers", "-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft", "--spec-draft-ngl",
        metavar="N", help="Draft layers on the GPU: a count, or auto (the default) as the target's, placed before the"
        " target's; all (or -1) every one.", show_default=False, rich_help_panel=RESOURCES)], None),
    "fit": (Annotated[Optional[str], typer.Option(
        "--fit", "-fit", metavar="on|off", help="Fit the layers that --gpu-layers leaves to auto to the GPUs'"
        " free memory (on, llama.cpp's default), or offload every one (off).", show_default=False,
        autocompletion=completing(("on", "off")), rich_help_panel=RESOURCES)], None),
    "fit_target": (Annotated[int, typer.Option(
        "--fit-target", "-fitt", metavar="MiB", help="Memory fitting leaves free on each GPU, as llama.cpp's.",
        rich_help_panel=RESOURCES)], DEFAULT_RUNTIME.fit_margin >> 20),
    "draft_threads": (Annotated[Optional[int], typer.Option(
        "--threads-draft", "-td", "--spec-draft-threads",
        help="CPU threads of a draft model (or MTP block, EAGLE-3 or DFlash drafter). Default (or 0): --threads.", show_default=False, rich_help_panel=RESOURCES)], None),
    "split_mode": (Annotated[str, typer.Option(
        "--split-mode", "-sm", metavar="MODE", help="How the offloaded layers split across several GPUs,"
        " as llama.cpp's: layer (by layers, pipelined), row (each weight by rows, in parallel; not on CUDA in this"
        " llama.cpp), tensor (llama.cpp's experimental split of weights and KV cache), or none (all on --main-gpu).",
        autocompletion=completing(SPLIT_MODES), rich_help_panel=RESOURCES)],
        DEFAULT_RUNTIME.split_mode),
    "main_gpu": (Annotated[int, typer.Option(
        "--main-gpu", "-mg", help="With --split-mode none, the device that holds the model, counted as llama.cpp"
        " counts them: in --device's order where it is given, else RPC workers first, then this machine's GPUs.",
        rich_help_panel=RESOURCES)], DEFAULT_RUNTIME.main_gpu),
    "kv_offload": (Annotated[bool, typer.Option(
        "--kv-offload/--no-kv-offload", "-kvo/-nkvo", help="Keep the KV cache beside the offloaded layers on their"
        " GPU, or in RAM (-nkvo: more room for layers, slower attention).", rich_help_panel=RESOURCES)],
        DEFAULT_RUNTIME.kv_offload),
    "override_tensor": (Annotated[Optional[list[str]], typer.Option(
        "--override-tensor", "-ot", metavar="RE=TYPE", help="Keep the tensors whose names the regular"
        " expression finds in a buffer of that type (CPU, CUDA0, ...), as llama.cpp's: the first pattern that finds"
        " a name decides, -ot's before --cpu-moe's and --n-cpu-moe's. Repeatable.", show_default=False,
        rich_help_panel=RESOURCES)], None),
    "cpu_moe": (Annotated[bool, typer.Option(
        "--cpu-moe", "-cmoe", help="Keep a Mixture-of-Experts model's expert weights in RAM, the rest on the GPU"
        " (llama.cpp's): a MoE too big for the GPU runs at a fraction of the CPU's cost.",
        rich_help_panel=RESOURCES)], False),
    "n_cpu_moe": (Annotated[int, typer.Option(
        "--n-cpu-moe", "-ncmoe", metavar="N", help="The same for the first N layers' experts only.",
        rich_help_panel=RESOURCES)], 0),
    "n_cpu_ffn": (Annotated[int, typer.Option(
        "--n-cpu-ffn", "-ncffn", metavar="N", help="A dense model's: the first N layers' feed-forward weights in RAM.",
        rich_help_panel=RESOURCES)], 0),
    "device": (Annotated[Optional[str], typer.Option(
        "--device", "-dev", help="Comma-separated offload devices for the target (`localspec doctor` lists them),"
        " or 'none' for the CPU alone. Default: all.", show_default=False, rich_help_panel=RESOURCES)], None),
    "draft_device": (Annotated[Optional[str], typer.Option(
        "--device-draft", "-devd", "--spec-draft-device",
        help="The same for the draft model, which may sit on another device than the target. Default: all.", show_default=False, rich_help_panel=RESOURCES)], None),
    "backend_sampling": (Annotated[Optional[bool], typer.Option(
        "--backend-sampling/--no-backend-sampling",
        help="Run the sampler chain inside llama.cpp's decode graph, so only each row's surviving candidates come"
        " back (fast on a GPU, slow on a CPU), or in C on the host. Default: on the backend where the target"
        " runs on a GPU; elsewhere greedy rows only (an argmax in the graph costs less than copying a row out).",
        show_default=False, rich_help_panel=RESOURCES)], DEFAULT_RUNTIME.backend_sampling),
    "batch_size": (Annotated[int, typer.Option(
        "--batch-size", "-b", help="Prompt tokens read in one llama.cpp batch (at least a verification's rows).",
        rich_help_panel=RESOURCES)], DEFAULT_RUNTIME.prompt_batch),
    "flash_attn": (Annotated[Optional[str], typer.Option(
        "--flash-attn", "-fa", help="Flash attention: on, off, or auto (llama.cpp's default: on wherever the"
        " device supports it)." + OF_THE_DRAFT["flash_attn"], show_default=False,
        autocompletion=completing(SWITCH_WORDS), rich_help_panel=RESOURCES)], None),
    "mmap": (Annotated[Optional[bool], typer.Option(
        "--mmap/--no-mmap", help="Map model files into memory, or read them in (--no-mmap: slower to load, but"
        " no page faults later). Default: as llama.cpp decides for the device.", show_default=False,
        rich_help_panel=RESOURCES)], None),
    "mlock": (Annotated[bool, typer.Option(
        "--mlock", help="Keep the models' weights in RAM, never swapped out (the system may cap how much a"
        " process can lock: ulimit -l).", rich_help_panel=RESOURCES)], False),
    "cache_type_k": (Annotated[str, typer.Option(
        "--cache-type-k", "-ctk", metavar="TYPE", help="The target's K cache type, as llama.cpp's: f16, q8_0 (half"
        " the memory), q4_0, ... (f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1)."
        + OF_THE_DRAFT["cache_type_k"],
        autocompletion=completing(KV_CACHE_TYPES), rich_help_panel=RESOURCES)], "f16"),
    "cache_type_v": (Annotated[str, typer.Option(
        "--cache-type-v", "-ctv", metavar="TYPE", help="The target's V cache type, the same types; a quantized one"
        " needs flash attention (-fa auto or on).",
        autocompletion=completing(KV_CACHE_TYPES), rich_help_panel=RESOURCES)], "f16"),
    "draft_cache_type_k": (Annotated[str, typer.Option(
        "--cache-type-k-draft", "-ctkd", "--spec-draft-type-k", metavar="TYPE", help="The draft model's K cache"
        " type (or an MTP block's, an EAGLE-3 or DFlash drafter's), the same types: the text is the target's"
        " whatever the draft's cache.", autocompletion=completing(KV_CACHE_TYPES), rich_help_panel=RESOURCES)], "f16"),
    "draft_cache_type_v": (Annotated[str, typer.Option(
        "--cache-type-v-draft", "-ctvd", "--spec-draft-type-v", metavar="TYPE", help="The draft's V cache type.",
        autocompletion=completing(KV_CACHE_TYPES), rich_help_panel=RESOURCES)], "f16"),
}
def _rope_number(flag: str, kind: type, help: str) -> tuple:
    """One of llama.cpp's RoPE or YaRN numbers, the model's own unless given."""
    return (Annotated[Optional[kind], typer.Option(flag, metavar="N", help=help, show_default=False,
                                                   rich_help_panel=ROPE)], None)


# llama.cpp's RoPE and YaRN options, the target's and a draft model's alike; each the model's own unless given
ROPE_OPTIONS = {
    "rope_scaling": (Annotated[Optional[str], typer.Option(
        "--rope-scaling", metavar="none|linear|yarn", help="RoPE frequency scaling, to read a context longer than the"
        " model was trained on (Qwen's recipe: --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 32768).",
        show_default=False, autocompletion=completing(ROPE_SCALING), rich_help_panel=ROPE)], None),
    "rope_scale": _rope_number("--rope-scale", float, "Expand the context N times (--rope-freq-scale 1/N)."),
    "rope_freq_base": _rope_number("--rope-freq-base", float, "RoPE base frequency (NTK-aware scaling)."),
    "rope_freq_scale": _rope_number("--rope-freq-scale", float,
                                    "RoPE frequency scaling factor: the context expands 1/N times."),
    "yarn_orig_ctx": _rope_number("--yarn-orig-ctx", int, "YaRN: the context the model was trained on."),
    "yarn_ext_factor": _rope_number("--yarn-ext-factor", float, "YaRN: extrapolation mix factor (0: full interpolation)."),
    "yarn_attn_factor": _rope_number("--yarn-attn-factor", float, "YaRN: attention magnitude scaling."),
    "yarn_beta_slow": _rope_number("--yarn-beta-slow", float, "YaRN: high correction dimension."),
    "yarn_beta_fast": _rope_number("--yarn-beta-fast", float, "YaRN: low correction dimension."),
}
PROMPT_CACHE_OPTIONS = {
    "prompt_cache": (Annotated[str, typer.Option(
        "--prompt-cache", "--cache-ram", "-cram", metavar="SIZE",
        help="Keep the cache of each prompt that took a second or more to read on disk, up to SIZE for every model's"
        " (8GiB, 500MiB; a bare number is MiB and -1 no limit, as llama-server's --cache-ram, which names this"
        " too, though llama-server keeps its cache in RAM), so that a later prompt beginning with"
        " the same tokens (a long system prompt, a document, a conversation so far), in this run or the next, is"
        " read back in place of read again. The least recently used go first; off keeps and reads none. Models"
        " whose drafter reads the target's hidden states (MTP, EAGLE-3, DFlash) read their prompts anew.",
        rich_help_panel=RESOURCES)], f"{DEFAULT_RUNTIME.prompt_cache // 2**30}GiB"),
    "cache_reuse": (Annotated[int, typer.Option(
        "--cache-reuse", metavar="N", help="Past where a prompt departs from the cache, shift each run of at least N"
        " tokens the cache holds further on into place rather than read it again, as llama-server's: what follows"
        " a dropped turn or deleted text (a chat that drops its oldest turns, an editor's context). The text kept"
        " so has read the cut text once, so the answer may differ from a fresh reading's. 0: off.",
        rich_help_panel=RESOURCES)], DEFAULT_RUNTIME.cache_reuse),
}
RPC_OPTIONS = {
    "rpc": (Annotated[Optional[str], typer.Option(
        "--rpc", help="Comma-separated HOST:PORT of `localspec worker`s on other machines: the target's layers are"
        " split across their devices and this machine's GPUs (by free memory, or --tensor-split); on a machine"
        " without a GPU, across the workers and this machine's CPU by free memory (--gpu-layers N: N layers to"
        " the workers, -1 all)." + OF_THE_DRAFT["rpc"], show_default=False, rich_help_panel=RESOURCES)], None),
    "no_repack": (Annotated[bool, typer.Option(
        "--no-repack/--repack", "-nr", help="Keep weights in their file layout instead of the CPU's fastest one (slower):"
        " a worker computes with that layout, so only then does greedy text match a run split with --rpc"
        " token for token.", rich_help_panel=RESOURCES)], False),
    "tensor_split": (Annotated[Optional[str], typer.Option(
        "--tensor-split", "-ts", help="Shares of the offloaded layers per device, in `localspec doctor`'s order,"
        " e.g. 3,1. Default: by free memory.", show_default=False, rich_help_panel=RESOURCES)], None),
}
ADAPTER_OPTIONS = {
    "lora": (Annotated[Optional[list[str]], typer.Option(
        "--lora", metavar="FILE[,FILE]", help="A LoRA adapter the target computes with (a GGUF made for its"
        " architecture, as llama.cpp's convert_lora_to_gguf.py writes one; hf:owner/repo/file.gguf downloads it), at"
        " scale 1; comma-separated or repeated for several." + OF_THE_DRAFT["lora"], show_default=False, rich_help_panel=ADAPTERS)], None),
    "lora_scaled": (Annotated[Optional[list[str]], typer.Option(
        "--lora-scaled", metavar="FILE:SCALE[,...]", help="The same at a scale of your own (0.5: half the"
        " adapter's change). serve numbers the adapters from 0, --lora's first, then --lora-scaled's.",
        show_default=False, rich_help_panel=ADAPTERS)], None),
    "lora_init_without_apply": (Annotated[bool, typer.Option(
        "--lora-init-without-apply", help="Load the adapters at scale 0, to be applied by serve's requests (their"
        " lora field) or POST /lora-adapters, as llama-server's.", rich_help_panel=ADAPTERS)], False),
    "control_vector": (Annotated[Optional[list[str]], typer.Option(
        "--control-vector", metavar="FILE[,FILE]", help="A control vector added to the target's layers' outputs (a"
        " GGUF llama.cpp's cvector-generator writes: a direction a layer, steering the model towards a style or"
        " mood); several are summed. The text is the steered target's" + OF_THE_DRAFT["control_vector"] + ".",
        show_default=False, rich_help_panel=ADAPTERS)], None),
    "control_vector_scaled": (Annotated[Optional[list[str]], typer.Option(
        "--control-vector-scaled", metavar="FILE:SCALE[,...]", help="The same times a scale of your own (-1: the"
        " other way).", show_default=False, rich_help_panel=ADAPTERS)], None),
    "control_vector_layer_range": (Annotated[Optional[tuple[int, int]], typer.Option(
        "--control-vector-layer-range", metavar="START END", help="Steer only the layers from START to END"
        " (llama.cpp counts the first layer's output as 1). Default: all.", show_default=False,
        rich_help_panel=ADAPTERS)], None),
}
VISION_OPTIONS = {
    "mmproj": (Annotated[Optional[str], typer.Option(
        "--mmproj", "-mm", metavar="FILE", help="The target's multimodal projector, through which it reads images"
        " (the mmproj-*.gguf published beside a vision model; hf:owner/repo/file.gguf downloads it): run --image,"
        " chat's /image, serve's image_url parts and Ollama's images; an audio model's reads WAV, MP3 and FLAC"
        " (run --audio, chat's /audio, input_audio parts). Drafts stay text: a draft model reads a stand-in where"
        " an image is, and verification keeps the answer the target's.", show_default=False,
        rich_help_panel=VISION)], None),
    "mmproj_auto": (Annotated[bool, typer.Option(
        "--mmproj-auto/--no-mmproj-auto", help="Where no --mmproj is given, the projector a Hub repo holds beside a"
        " model named by repo (-hf owner/repo, owner/repo:Q4_K_M), fetched and loaded as llama.cpp's -hf does.",
        rich_help_panel=VISION)], True),
    "no_mmproj": (Annotated[bool, typer.Option("--no-mmproj", help="No projector at all, not even --mmproj's.",
                                               rich_help_panel=VISION)], False),
    "mmproj_offload": (Annotated[bool, typer.Option(
        "--mmproj-offload/--no-mmproj-offload", help="The projector on the GPU where the target has layers there"
        " (off: on the CPU, leaving its memory to the layers).", rich_help_panel=VISION)], True),
}
# serve's and batch's (their default: "auto")
PARALLEL_OPTIONS = {
    "parallel": (Annotated[str, typer.Option(
        "--parallel", "-np", metavar="N|auto",
        help="Requests (serve) or items (batch) generated at once, as llama-server's slots: each step decodes"
        " all of them in one batch, and one that arrives joins at the next step. Each holds up to --ctx-size"
        " tokens. auto (or 0): 4, fewer where their KV caches do not fit the memory. A draft model (or MTP block,"
        " EAGLE-3 or DFlash drafter) drafts for all of them, their draft tokens decoded side by side.",
        rich_help_panel=RESOURCES)], "1"),
}
# llama.cpp's options that ask for what localspec does anyway, taken so that its command lines run (not listed by
# --help; docs/commands.md names them), or refused with the reason where they ask for what it does not (--swa-full:
# this llama.cpp keeps the whole sliding-window cache by default, which taking drafts back needs; --no-warmup: no
# warm-up decode is run)
LLAMA_CPP_OPTIONS = {
    "kv_unified": (Annotated[bool, typer.Option("--kv-unified", "-kvu", hidden=True)], False),
    "ubatch_size": (Annotated[Optional[int], typer.Option("--ubatch-size", "-ub", hidden=True)], None),
    "threads_batch": (Annotated[Optional[int], typer.Option("--threads-batch", "-tb", hidden=True)], None),
    "draft_override_tensor": (Annotated[Optional[list[str]], typer.Option(
        "--override-tensor-draft", "-otd", "--spec-draft-override-tensor", hidden=True)], None),
    "draft_cpu_moe": (Annotated[bool, typer.Option("--cpu-moe-draft", "-cmoed", "--spec-draft-cpu-moe", hidden=True)],
                      False),
    "draft_n_cpu_moe": (Annotated[int, typer.Option(
        "--n-cpu-moe-draft", "-ncmoed", "--spec-draft-n-cpu-moe", "--spec-draft-ncmoe", hidden=True)], 0),
    "draft_threads_batch": (Annotated[Optional[int], typer.Option(
        "--threads-batch-draft", "-tbd", "--spec-draft-threads-batch", hidden=True)], None),
    "context_shift": (Annotated[Optional[bool], typer.Option("--context-shift/--no-context-shift", hidden=True)], None),
    "swa_full": (Annotated[bool, typer.Option("--swa-full", hidden=True)], False),
    "warmup": (Annotated[bool, typer.Option("--warmup/--no-warmup", hidden=True)], True),
    "perf": (Annotated[bool, typer.Option("--perf/--no-perf", hidden=True)], True),  # timings are always measured
    "cache_prompt": (Annotated[bool, typer.Option("--cache-prompt/--no-cache-prompt", hidden=True)], True),

    "load_mode": (Annotated[Optional[str], typer.Option("--load-mode", "-lm", hidden=True)], None),
}


def _qwen_coder(size: str) -> str:
    return f"hf:ggml-org/Qwen2.5-Coder-{size.upper()}-Q8_0-GGUF/qwen2.5-coder-{size}-q8_0.gguf"


def _coder(model: str, draft: str | None = None) -> dict:
    """llama-server's --fim-qwen-* presets, as llama.vscode asks for them: the model's own context, batches of 1024,
    --cache-reuse 256."""
    return {"model": model, "batch_size": 1024, "ctx_size": 0, "cache_reuse": 256, "port": 8012} | (
        {"draft": draft} if draft else {})


def _gpt_oss(model: str) -> dict:
    """llama-server's --gpt-oss-* presets: two sequences of 128K tokens, OpenAI's sampling for it."""
    return {"model": model, "batch_size": 2048, "parallel": "2", "ctx_size": 131072, "temp": 1.0, "top_p": 1.0,
            "top_k": 0, "min_p": 0.01, "port": 8013}


# llama-server's presets (a model fetched from the Hub with its settings), as the options that say the same; each
# stands where the command line says otherwise
LLAMA_PRESETS = {
    **{f"fim-qwen-{size}-default": _coder(_qwen_coder(size)) for size in ("1.5b", "3b", "7b")},
    **{f"fim-qwen-{size}-spec": _coder(_qwen_coder(size), _qwen_coder("0.5b")) for size in ("7b", "14b")},
    "fim-qwen-30b-default": _coder(
        "hf:ggml-org/Qwen3-Coder-30B-A3B-Instruct-Q8_0-GGUF/qwen3-coder-30b-a3b-instruct-q8_0.gguf"),
    "gpt-oss-20b-default": _gpt_oss("hf:ggml-org/gpt-oss-20b-GGUF/gpt-oss-20b-mxfp4.gguf"),
    "gpt-oss-120b-default": _gpt_oss("ggml-org/gpt-oss-120b-GGUF:mxfp4"),
}
PRESET_OPTIONS = {name.replace("-", "_").replace(".", "_"): (Annotated[bool, typer.Option(f"--{name}", hidden=True)],
                                                             False) for name in LLAMA_PRESETS}


def _lacking(reason: str, *spellings: str) -> dict[str, str]:
    return dict.fromkeys(spellings, reason)


# llama.cpp's options that localspec takes in no spelling, with what it does instead: said where one is given
# (`no such option: --cache-reuse (...)`), for the commands that lack it
LLAMA_CPP_LACKS = {
    **_lacking("localspec's n-gram lookup reads the prompt and output, and its suffix cache earlier answers"
               " (--suffix-cache), in memory: no lookup-cache file", "-lcs", "--lookup-cache-static", "-lcd",
               "--lookup-cache-dynamic"),
    **_lacking("localspec has one n-gram lookup, which finds the longest match itself; --draft-max bounds its"
               " drafts", *(f"--spec-ngram-{kind}-{size}" for kind in ("mod", "simple", "map-k", "map-k4v")
                            for size in ("n-min", "n-max", "n-match", "size-n", "size-m", "min-hits")),
               "--spec-ngram-size-n", "--spec-ngram-size-m", "--spec-ngram-min-hits"),
    **_lacking("localspec grows draft trees where their measured cost pays (--draft-branches)",
               "--spec-draft-p-split", "--draft-p-split"),
    **_lacking("--backend-sampling decides for the target and the draft alike", "--spec-draft-backend-sampling"),
    **_lacking("localspec never shifts the context, so nothing is kept through a shift", "--keep"),
    **_lacking("localspec keeps the whole sliding-window cache and its own snapshots to take drafts back; it makes"
               " no context checkpoints", "-ctxcp", "--ctx-checkpoints", "--swa-checkpoints", "-cms",
               "--checkpoint-min-step"),
    **_lacking("its sampler chain runs in llama.cpp's default order; each sampler has its own option (0 or off"
               " leaves it out)", "--samplers", "--sampler-seq", "--sampling-seq"),
    **_lacking("localspec leaves thread placement and priority to the system (taskset, nice, numactl)", "-C",
               "--cpu-mask", "-Cr", "--cpu-range", "--cpu-strict", "--prio", "--poll", "-Cb", "--cpu-mask-batch",
               "-Crb", "--cpu-range-batch", "--cpu-strict-batch", "--prio-batch", "--poll-batch", "--numa",
               "-Cd", "--cpu-mask-draft", "-Crd", "--cpu-range-draft", "--cpu-strict-draft", "--prio-draft",
               "--poll-draft", "-Cbd", "--cpu-mask-batch-draft", "-Crbd", "--cpu-range-batch-draft",
               "--cpu-strict-batch-draft", "--prio-batch-draft", "--poll-batch-draft",
               *(f"--spec-draft-{what}" for what in ("cpu-mask", "cpu-range", "cpu-strict", "prio", "poll",
                                                     "cpu-mask-batch", "cpu-range-batch", "cpu-strict-batch",
                                                     "prio-batch", "poll-batch"))),
    **_lacking("deprecated in llama.cpp: its KV cache needs no defragmenting", "-dt", "--defrag-thold"),
    **_lacking("localspec reads images only through a projector file (--mmproj FILE or hf:owner/repo/file.gguf), at"
               " its own size", "-mmu", "--mmproj-url", "--image-min-tokens", "--image-max-tokens",
               "--mtmd-batch-max-tokens", "--video-fps", "--video-timestamp-interval", "--video-ffmpeg-dir",
               "--media-path"),
    **_lacking("localspec fits the layers to the GPUs' free memory (--fit), never the context: it says what to"
               " lower where the context does not fit (`localspec doctor` shows it)", "-fitc", "--fit-ctx"),
    **_lacking("`localspec doctor` lists the devices", "--list-devices"),
    **_lacking("`localspec models --installed` lists the downloaded models", "-cl", "--cache-list"),
    **_lacking("`localspec --install-completion` installs completion for your shell", "--completion-bash"),
    **_lacking("not offered: change the GGUF's metadata itself (the gguf package's gguf_set_metadata)",
               "--override-kv"),
    **_lacking("--stop TEXT ends generation at a text", "-r", "--reverse-prompt"),
    **_lacking("serve answers at /; a reverse proxy can put it under a path", "--path", "--api-prefix"),
    **_lacking("serve allows GET, POST and OPTIONS with any header, without credentials; --cors-origin names the"
               " pages", "--cors-methods", "--cors-headers", "--cors-credentials"),
    **_lacking("llama-server's web UI's own: localspec's page takes no configuration, tools or MCP servers",
               "--ui-config", "--webui-config", "--ui-config-file", "--webui-config-file", "--ui-mcp-proxy",
               "--webui-mcp-proxy", "--tools", "--tools-runtime", "--mcp-servers-config", "--mcp-servers-json",
               "-ag", "--agent"),
    **_lacking("serve's settings are its command line's: POST /props is refused", "--props"),
    **_lacking("serve answers on one event loop, generating on a thread of its own", "--threads-http"),
    **_lacking("serve loads any downloaded model a request names (`localspec pull`, `localspec create`), the least"
               " recently used unloaded first where memory is short, each kept --keep-alive once idle",
               "--models-dir", "--models-preset", "--models-max", "--models-autoload", "--no-models-autoload",
               "--sleep-idle-seconds"),
    **_lacking("localspec reads text only (no multimodal projector)", "--vision-gemma-4b-default",
               "--vision-gemma-12b-default"),
    **_lacking("not offered: serve embeds with the model it runs (/v1/embeddings)", "--embd-gemma-default"),
    **_lacking("serve reads back what a sequence's cache holds for any request, and picks the sequence whose cache"
               " holds most of the prompt", "-sps", "--slot-prompt-similarity"),
    **_lacking("serve keeps a long prompt's cache on disk as it is read (--prompt-cache), not when its sequence"
               " is idle", "--cache-idle-slots", "--no-cache-idle-slots"),
    **_lacking("the sequences share one pool of cells, as -kvu", "--kv-unified-per-slot"),
    **_lacking("one serve a port", "--reuse-port"),
    **_lacking("serve sends no pings: a stream carries each token as it comes (and a long prompt's progress with"
               " return_progress)", "--sse-ping-interval"),
    **_lacking("/infill lays its prompt out prefix first, as llama-server does by default", "--spm-infill"),
    **_lacking("a conversation that ends with the assistant's message is its reply's start, gone on from, as"
               " llama-server's default (end it with a user's message for a new turn)", "--prefill-assistant",
               "--no-prefill-assistant"),
    **_lacking("adaptive-p sampling is not in localspec's chain", "--adaptive-target", "--adaptive-decay"),
    **_lacking("serve normalizes each vector to unit length, as llama-server does by default; a request's"
               " embd_normalize asks otherwise", "--embd-normalize"),
    **_lacking("what of earlier thinking a conversation keeps is its chat template's to decide (clients send it"
               " back as reasoning_content)", "--reasoning-preserve", "--no-reasoning-preserve"),
    **_lacking("a thinking budget closes the block without a message (--reasoning-budget)",
               "--reasoning-budget-message"),
    **_lacking("--reasoning-format none leaves the thinking in the content; tool calls are read only where a"
               " request offers tools", "--skip-chat-parsing", "--no-skip-chat-parsing"),
    **_lacking("not offered: localspec's header reader checks each file's structure before llama.cpp loads it, not"
               " its weights' values", "--check-tensors"),
    **_lacking("not offered: llama.cpp decides", "--no-host", "--op-offload", "--no-op-offload", "-lzm",
               "--lazy-mode"),
    **_lacking("scripts/accelerator-report measures the ceiling with a drafter that is always right",
               "--spec-synth-len", "--spec-synth-rates"),
    **_lacking("the prompt is not echoed: the answer alone is written (--json carries the prompt's tokens count)",
               "--verbose-prompt", "--display-prompt", "--no-display-prompt"),
    **_lacking("the summary line counts the tokens", "-ptc", "--print-token-count"),
    **_lacking("--prompt-cache keeps each long prompt's cache by itself and reads it back", "--prompt-cache-all",
               "--prompt-cache-ro"),
    **_lacking("run answers one prompt; chat (or -cnv) takes turns", "-st", "--single-turn"),
    **_lacking("chat takes a message of several lines between triple quotes (as Ollama), and a pasted block whole",
               "-mli", "--multiline-input"),
    **_lacking("not offered: chat sends each message as the chat template writes a user's turn", "--in-prefix",
               "--in-suffix", "--in-prefix-bos"),
    **_lacking("localspec never shifts the context, so no self-extend either", "-gan", "--grp-attn-n", "-gaw",
               "--grp-attn-w"),
    **_lacking("localspec reads text, images and audio (--image, --audio), not video", "--video"),
    **_lacking("the answer goes to stdout: redirect it (> FILE); --json for the statistics too", "--output-file"),
    **_lacking("--no-color writes plain text", "--simple-io"),
    **_lacking("serve logs a line a request to stderr; LOCALSPEC_DEBUG=1 adds llama.cpp's own log", "--log-disable",
               "--log-file", "--log-jsonl", "--log-prompts-dir", "--log-colors", "-lv", "--verbosity",
               "--log-verbosity", "--log-prefix", "--log-timestamps", "--log-verbose"),
}

GENERATION_OPTIONS = (MODEL_OPTIONS, DRAFTING_OPTIONS, SPECULATION_OPTIONS, SAMPLING_OPTIONS, LIMIT_OPTIONS,
                      THINKING_OPTIONS, TEMPLATE_OPTIONS, RESOURCE_OPTIONS, ROPE_OPTIONS, PROMPT_CACHE_OPTIONS,
                      RPC_OPTIONS, ADAPTER_OPTIONS, VISION_OPTIONS, LLAMA_CPP_OPTIONS, PRESET_OPTIONS)
# The environment variables llama.cpp's tools read for these options (its common/arg.cpp's set_env), read here too,
# so that a llama-server container's settings carry over; the command line's own stand over them
LLAMA_ARG_ENV = {
    "model": "MODEL", "hf_repo": "HF_REPO", "hf_repo_draft": "SPEC_DRAFT_HF_REPO", "draft": "SPEC_DRAFT_MODEL",
    "offline": "OFFLINE", "spec_type": "SPEC_TYPE", "draft_max": "SPEC_DRAFT_N_MAX", "draft_min": "SPEC_DRAFT_N_MIN",
    "p_min": "SPEC_DRAFT_P_MIN", "temp": "TEMPERATURE", "top_k": "TOP_K", "top_p": "TOP_P", "min_p": "MIN_P",
    "repeat_penalty": "REPEAT_PENALTY", "presence_penalty": "PRESENCE_PENALTY",
    "frequency_penalty": "FREQUENCY_PENALTY", "max_tokens": "N_PREDICT", "reasoning": "REASONING",
    "reasoning_effort": "REASONING_EFFORT", "reasoning_budget": "THINK_BUDGET", "chat_template": "CHAT_TEMPLATE",
    "chat_template_file": "CHAT_TEMPLATE_FILE", "chat_template_kwargs": "CHAT_TEMPLATE_KWARGS", "jinja": "JINJA",
    "ctx_size": "CTX_SIZE", "threads": "THREADS", "gpu_layers": "N_GPU_LAYERS", "fit": "FIT",
    "fit_target": "FIT_TARGET",
    "draft_gpu_layers": "N_GPU_LAYERS_DRAFT", "split_mode": "SPLIT_MODE", "main_gpu": "MAIN_GPU",
    "kv_offload": "KV_OFFLOAD", "override_tensor": "OVERRIDE_TENSOR", "cpu_moe": "CPU_MOE", "n_cpu_moe": "N_CPU_MOE",
    "n_cpu_ffn": "N_CPU_FFN", "device": "DEVICE", "backend_sampling": "BACKEND_SAMPLING", "batch_size": "BATCH",
    "flash_attn": "FLASH_ATTN", "cache_type_k": "CACHE_TYPE_K", "cache_type_v": "CACHE_TYPE_V",
    "draft_cache_type_k": "SPEC_DRAFT_CACHE_TYPE_K", "draft_cache_type_v": "SPEC_DRAFT_CACHE_TYPE_V",
    "rope_scaling": "ROPE_SCALING_TYPE", "rope_scale": "ROPE_SCALE", "rope_freq_base": "ROPE_FREQ_BASE",
    "rope_freq_scale": "ROPE_FREQ_SCALE", "yarn_orig_ctx": "YARN_ORIG_CTX", "yarn_ext_factor": "YARN_EXT_FACTOR",
    "yarn_attn_factor": "YARN_ATTN_FACTOR", "yarn_beta_slow": "YARN_BETA_SLOW", "yarn_beta_fast": "YARN_BETA_FAST",
    "prompt_cache": "CACHE_RAM", "cache_reuse": "CACHE_REUSE", "rpc": "RPC", "tensor_split": "TENSOR_SPLIT",
    "parallel": "N_PARALLEL", "kv_unified": "KV_UNIFIED", "ubatch_size": "UBATCH", "context_shift": "CONTEXT_SHIFT",
    "swa_full": "SWA_FULL", "perf": "PERF", "cache_prompt": "CACHE_PROMPT", "mmproj": "MMPROJ", "mmproj_offload": "MMPROJ_OFFLOAD",
    "mmproj_auto": "MMPROJ_AUTO", "load_mode": "LOAD_MODE",
    "draft_cpu_moe": "SPEC_DRAFT_CPU_MOE", "draft_n_cpu_moe": "SPEC_DRAFT_N_CPU_MOE",
}
for _group in (*GENERATION_OPTIONS, PARALLEL_OPTIONS):
    for _name, (_kind, _) in _group.items():
        if _name in LLAMA_ARG_ENV:  # (typer's OptionInfo, as the group declares it; --help leaves them out)
            _kind.__metadata__[0].envvar, _kind.__metadata__[0].show_envvar = f"LLAMA_ARG_{LLAMA_ARG_ENV[_name]}", False
NoColorOption = Annotated[
    bool, typer.Option("--no-color", help="Plain text: no colours or styles, not even the tokens that came"
                                         " from accepted drafts (as NO_COLOR=1 in the environment).")
]


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything the shared options of a generating command say, checked: built in one place."""

    target: str | None
    draft_model: str | None  # None: no draft model (n-gram lookup or plain decoding)
    offline: bool
    sampling: Sampling
    speculation: Speculation
    runtime: Runtime
    limits: Limits
    thinking: Thinking = Thinking()
    made: "Preset | None" = None  # the model made with `create` that the command named (target: its base)
    port: int | None = None  # a llama-server preset's (serve's, where --port says none)
    template_variables: dict = dataclasses.field(default_factory=dict)  # --chat-template-kwargs
    chat_template: str | None = None  # --chat-template(-file): in place of the target's own
    # the settings the same command line gives with another target named (chat's /load MODEL)
    retarget: Callable[[str], "Settings"] | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self):
        check_draft_fits(self.speculation, self.runtime)

    def conversation(self, messages: list[dict]) -> list[dict]:
        """A conversation as the model named asks for it (a made one's SYSTEM and MESSAGEs)."""
        return self.made.conversation(messages) if self.made else messages


def build_settings(context: typer.Context | None = None, **values) -> Settings:
    """Settings from the shared options' values by name; an option a command lacks takes its default.
    context: the command line's, which says which values it gave (a made model's parameters stand for
    the others)."""
    from .. import store
    from ..drafting import speculating
    from ..store import hardware

    defaults = {name: default for group in (*GENERATION_OPTIONS, PARALLEL_OPTIONS) for name, (_, default) in group.items()}
    o = SimpleNamespace(**(defaults | values))
    if context is not None:
        _say_unread_variables(context)
    if o.target is not None:  # a llama-server container's LLAMA_ARG_MODEL yields to the TARGET named
        for name in ("model", "hf_repo"):
            if context is not None and _source(context, name) == "ENVIRONMENT":
                setattr(o, name, None)
    preset = _preset(o, _given(values, context))
    if o.hf_repo is not None:
        if o.target is not None or o.model is not None:
            raise UsageError("TARGET, --model/-m and -hf name two targets; give one")
        o.model = _hub_repo(o.hf_repo)
    if o.hf_repo_draft is not None:
        if o.draft is not None:
            raise UsageError("--draft and -hfd name two draft models; give one")
        o.draft = _hub_repo(o.hf_repo_draft)
    if o.target is not None and o.model is not None:
        raise UsageError("TARGET, --model/-m and -hf name two targets; give one")
    made = store.made(o.target or o.model)
    if made:  # its parameters stand where the command line gives none
        o = SimpleNamespace(**(vars(o) | {name: value for name, value in _options_of(made).items()
                                          if name not in _given(values, context)}))
        o.target, o.model = made.base, None
        o.draft = store.draft_for(made, o.draft) if o.draft is not None else None
    _refuse_what_localspec_lacks(o)
    _spec_types(o)
    _load_mode(o)
    if o.no_draft and o.draft is not None:
        raise UsageError("--draft and --no-draft exclude each other")
    drafting, draft_model = speculating(o.draft, "off" if o.no_draft else o.spec)
    gpu_layers = _layers(o.gpu_layers, "--gpu-layers")
    draft_gpu_layers = _layers(o.draft_gpu_layers, "--draft-gpu-layers")
    gpu_options = [option for option, given in (("--gpu-layers", gpu_layers is not None or draft_gpu_layers is not None),
                                                ("--split-mode", o.split_mode != DEFAULT_RUNTIME.split_mode),
                                                ("--main-gpu", o.main_gpu != DEFAULT_RUNTIME.main_gpu),
                                                ("--no-kv-offload", not o.kv_offload)) if given]
    if gpu_options and not o.rpc and not hardware.gpu_offload():
        print(f"note: this llama.cpp build runs on the CPU only, so {', '.join(gpu_options)}"
              f" {'has' if len(gpu_options) == 1 else 'have'} no effect"
              " (`localspec doctor` says how to build for a GPU)", file=sys.stderr)
    if o.fit is not None and SWITCH.get(o.fit) is None:
        raise UsageError(f"--fit takes on or off, as llama.cpp's; got {o.fit!r}")
    unset = -1 if o.fit is not None and not SWITCH[o.fit] else None  # what layers left to auto come to
    variables = _template_variables(o.chat_template_kwargs)
    return Settings(
        target=o.target or o.model,
        draft_model=draft_model,
        offline=o.offline,
        sampling=Sampling(temperature=o.temp, top_k=o.top_k, top_p=o.top_p, min_p=o.min_p, seed=o.seed,
                          grammar=_grammar(o), repeat_penalty=o.repeat_penalty, repeat_last_n=o.repeat_last_n,
                          presence_penalty=o.presence_penalty, frequency_penalty=o.frequency_penalty,
                          logit_bias=_logit_bias(o.logit_bias or ()), ignore_eos=o.ignore_eos,
                          dry_multiplier=o.dry_multiplier, dry_base=o.dry_base, dry_allowed_length=o.dry_allowed_length,
                          dry_penalty_last_n=o.dry_penalty_last_n,
                          dry_sequence_breakers=_breakers(o.dry_sequence_breaker),
                          xtc_probability=o.xtc_probability, xtc_threshold=o.xtc_threshold, typical_p=o.typical_p,
                          dynatemp_range=o.dynatemp_range, dynatemp_exponent=o.dynatemp_exponent,
                          top_n_sigma=o.top_n_sigma, mirostat=o.mirostat, mirostat_tau=o.mirostat_tau,
                          mirostat_eta=o.mirostat_eta),
        speculation=Speculation(drafting=drafting, required=o.draft is not None or o.spec == "fixed",
                                draft_max=o.draft_max, draft_min=o.draft_min, p_min=o.p_min,
                                suffix_cache=o.suffix_cache, branches=o.draft_branches),
        runtime=Runtime(ctx_size=o.ctx_size, threads=o.threads or default_threads(),
                        gpu_layers=unset if gpu_layers is None else gpu_layers,
                        draft_gpu_layers=unset if draft_gpu_layers is None else draft_gpu_layers,
                        fit_margin=o.fit_target << 20,
                        draft_threads=o.draft_threads if o.draft_threads and o.draft_threads > 0 else None,
                        split_mode=o.split_mode, main_gpu=o.main_gpu,
                        kv_offload=o.kv_offload,
                        tensor_overrides=_overrides(o.override_tensor, o.cpu_moe, o.n_cpu_moe, "", o.n_cpu_ffn),
                        draft_tensor_overrides=_overrides(o.draft_override_tensor, o.draft_cpu_moe, o.draft_n_cpu_moe,
                                                          "-draft"),
                        backend_sampling=o.backend_sampling, devices=device_names(o.device),
                        draft_devices=device_names(o.draft_device), rpc=device_names(o.rpc) or (),
                        tensor_split=_shares(o.tensor_split), repack=not o.no_repack,
                        prompt_batch=o.batch_size, flash_attn=SWITCH[o.flash_attn or "auto"],
                        mmap=o.mmap, mlock=o.mlock, parallel=_parallel(o.parallel),
                        cache_type_k=o.cache_type_k, cache_type_v=o.cache_type_v,
                        draft_cache_type_k=o.draft_cache_type_k, draft_cache_type_v=o.draft_cache_type_v, rope=_rope(o),
                        prompt_cache=_size(o.prompt_cache, "--prompt-cache"), cache_reuse=o.cache_reuse,
                        lora=_adapters(o.lora, o.lora_scaled, o.lora_init_without_apply),
                        control_vectors=_adapters(o.control_vector, o.control_vector_scaled, False, "--control-vector"),
                        control_layers=tuple(o.control_vector_layer_range) if o.control_vector_layer_range else None,
                        mmproj=None if o.no_mmproj else o.mmproj, mmproj_offload=o.mmproj_offload,
                        mmproj_auto=o.mmproj_auto and not o.no_mmproj),
        limits=Limits(max_tokens=o.max_tokens, stop=tuple(o.stop or ())),
        thinking=_thinking(o, variables),
        made=made,
        port=preset.get("port"),
        template_variables=variables,
        chat_template=_chat_template(o),
    )


def _options_of(made: "Preset") -> dict:
    """A made model's parameters as the options that say the same (temperature is --temp; a context, -c;
    num_gpu, -ngl: Ollama's count of layers on the GPU, -1 as many as fit, as Ollama decides them; its
    ADAPTERs, --lora; its projector, --mmproj)."""
    options = {"temp" if name == "temperature" else name: value for name, value in made.asked().items()}
    if "max_tokens" in options and options["max_tokens"] is None:
        options["max_tokens"] = -1  # (until the model stops)
    loading = made.loading()
    return (options | ({"ctx_size": loading["num_ctx"]} if loading.get("num_ctx") else {})
            | ({"gpu_layers": "auto" if loading["num_gpu"] < 0 else str(loading["num_gpu"])} if "num_gpu" in loading
               else {})
            | ({"lora": list(made.adapters)} if made.adapters else {})
            | ({"mmproj": made.projector} if made.projector else {}))


def _preset(o: SimpleNamespace, given: set[str]) -> dict:
    """The llama-server preset the command line names (or {}), its settings put where the command line gives none
    (its model where it names no target)."""
    named = [name for name in LLAMA_PRESETS if getattr(o, PRESET_NAMES[name])]
    if len(named) > 1:
        raise UsageError(f"--{named[0]} and --{named[1]} are two presets; give one")
    if not named:
        return {}
    preset = LLAMA_PRESETS[named[0]]
    said = {"model": o.target is not None or o.model is not None or o.hf_repo is not None,
            "draft": o.no_draft or o.hf_repo_draft is not None or o.spec_type is not None or o.spec_default}
    for name, value in preset.items():
        if name != "port" and name not in given and not said.get(name):
            setattr(o, name, value)
    return preset


PRESET_NAMES = dict(zip(LLAMA_PRESETS, PRESET_OPTIONS))


def _given(values: dict, context: typer.Context | None) -> set[str]:
    """The options the command line set (where no command line parsed them: every value given)."""
    if context is None:
        return set(values)
    return {name for name in values if _source(context, name) in GIVEN}


def _say_unread_variables(context: typer.Context) -> None:
    """One line naming the LLAMA_ARG_* variables set here that this command reads for none of its options
    (a llama-server container's settings localspec lacks, or a misspelt one), rather than leave them silently."""
    read = {name for param in context.command.params
            for name in ([param.envvar] if isinstance(param.envvar, str) else param.envvar or ())}
    unread = sorted(name for name in os.environ if name.startswith("LLAMA_ARG_") and name not in read)
    if unread:
        print(f"note: {', '.join(unread)}: llama.cpp's setting{'s' if len(unread) > 1 else ''} that"
              f" `localspec {context.info_name}` does not take, left alone", file=sys.stderr)


def _source(context: typer.Context, name: str) -> str | None:
    """Where the command line's value of an option came from (click's ParameterSource's name)."""
    return getattr(context.get_parameter_source(name), "name", None)


GIVEN = ("COMMANDLINE", "ENVIRONMENT", "PROMPT")  # click's ParameterSource: not a default


# llama.cpp's values of a three-way switch (-fa, -rea), as Runtime.flash_attn and Thinking.think take them
SWITCH = {**dict.fromkeys(("on", "enabled", "true", "1"), True),
          **dict.fromkeys(("off", "disabled", "false", "0"), False), "auto": None, "-1": None}


# llama-server's --spec-type names (its common/speculative.cpp) as --draft's words: its five n-gram drafters
# are localspec's one n-gram lookup; "model" stands for the -md draft model
SPEC_TYPES = {"none": None, "draft-simple": "model", "draft-mtp": "mtp", "draft-eagle3": "eagle3",
              "draft-dflash": "dflash", **dict.fromkeys(("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod",
                                                           "ngram-cache"), "ngram")}


def _spec_types(o: SimpleNamespace) -> None:
    """--spec-type's names (and --spec-default's ngram-mod) as --draft's word, or --no-draft."""
    names = [name.strip() for given in o.spec_type or () for name in given.split(",")] + (
        ["ngram-mod"] if o.spec_default else [])
    if not names:
        return
    for name in names:
        if name == "draft-dspark":
            raise UsageError("--spec-type draft-dspark: localspec has no DSpark drafter (DFlash's block with a"
                             " Markov head); draft-dflash drafts with a DFlash file")
        if name not in SPEC_TYPES:
            raise UsageError(f"--spec-type takes {', '.join(SPEC_TYPES)} (llama-server's), comma-separated;"
                             f" got {name!r}")
    words = {SPEC_TYPES[name] for name in names} - {None}
    drafters = sorted(words - {"ngram"})
    given = o.draft not in (None, *DRAFT_WORDS, DrafterKind.NGRAM)  # a draft model's name or file
    if not words:
        if o.draft is not None:
            raise UsageError(f"--spec-type none is plain decoding, but --draft names {o.draft}; give one of them")
        o.no_draft = True
    elif len(drafters) > 1:
        raise UsageError(f"--spec-type {','.join(names)}: localspec drafts with one model's drafter at a time (auto"
                         " weighs it against n-gram lookup each step); name one of them")
    elif not drafters:
        if given:
            raise UsageError(f"--spec-type {','.join(names)} drafts by n-gram lookup alone, but --draft names"
                             f" {o.draft}; add draft-simple to draft with it too")
        o.draft = DrafterKind.NGRAM
    elif drafters == ["model"]:
        if not given:
            raise UsageError("--spec-type draft-simple drafts with a draft model: name it with -md FILE"
                             " (or -hfd OWNER/REPO, or --draft NAME)")
    elif not given:  # a drafter published beside the target, unless -md gives its file
        if o.draft not in (None, drafters[0]):
            raise UsageError(f"--spec-type {','.join(names)} and --draft {o.draft} ask for two drafters; give one")
        o.draft = drafters[0]


# llama.cpp's LLM_FFN_EXPS_REGEX and LLM_FFN_DENSE_REGEX: a layer's expert weights, and its dense feed-forward's
EXPERTS = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
DENSE_FFN = r"\.ffn_(up|down|gate)\."


def _overrides(given: list[str] | None, all_experts: bool, first_experts: int, of: str,
               first_dense: int = 0) -> tuple[tuple[str, str], ...]:
    """-ot's PATTERN=TYPE entries, then --cpu-moe's, --n-cpu-moe's and --n-cpu-ffn's, as llama.cpp reads them (of:
    the options' ending, -draft for the draft's)."""
    overrides = []
    for item in (item for text in given or () for item in text.split(",")):
        pattern, equals, kind = item.partition("=")
        if not (pattern and equals and kind):
            raise UsageError(f"--override-tensor{of} takes PATTERN=TYPE entries, comma-separated, as llama.cpp's"
                             f" (blk\\.[0-9]+\\.ffn_.*_exps=CPU); got {item!r}")
        overrides.append((pattern, kind))
    for option, layers in ((f"--n-cpu-moe{of}", first_experts), ("--n-cpu-ffn", first_dense)):
        if layers < 0:
            raise UsageError(f"{option} takes a number of layers >= 0, got {layers}")
    if all_experts:
        overrides.append((EXPERTS, "CPU"))
    overrides += [(f"blk\\.{layer}{EXPERTS}", "CPU") for layer in range(first_experts)]
    overrides += [(f"blk\\.{layer}{DENSE_FFN}", "CPU") for layer in range(first_dense)]
    return tuple(overrides)


# llama.cpp's --load-mode as --mmap (None: as llama.cpp decides) and --mlock
LOAD_MODES = {"auto": (None, False), "none": (False, False), "mmap": (True, False), "mlock": (False, True),
              "mmap+mlock": (True, True)}


def _load_mode(o: SimpleNamespace) -> None:
    if o.load_mode is None:
        return
    if o.load_mode not in LOAD_MODES:
        raise UsageError(f"--load-mode takes {', '.join(LOAD_MODES)} (llama.cpp's; its dio, direct I/O, is not"
                         f" offered here), got {o.load_mode!r}")
    if o.mmap is not None or o.mlock:
        raise UsageError("--load-mode and --mmap/--no-mmap/--mlock each say how the model loads; give one")
    o.mmap, o.mlock = LOAD_MODES[o.load_mode]


def _layers(text: str | None, option: str) -> int | None:
    """-ngl's N, all (-1) or auto (None, as not given: fitted to free memory)."""
    if text is None or text.lower() in ("all", "auto"):
        return None if text is None or text.lower() == "auto" else -1
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"{option} takes a number of layers, all or auto, got {text!r}") from None


def _refuse_what_localspec_lacks(o: SimpleNamespace) -> None:
    """llama.cpp's options that localspec cannot honour: refused, with the reason, unless they ask for
    what happens anyway."""
    if o.flash_attn is not None and o.flash_attn not in SWITCH:
        raise UsageError(f"--flash-attn takes a value, as llama.cpp's does: on, off or auto;"
                         f" got {o.flash_attn!r}")
    if o.ubatch_size is not None and o.ubatch_size != o.batch_size:
        raise UsageError(f"--ubatch-size {o.ubatch_size}: localspec reads each batch in one ubatch of --batch-size"
                         f" tokens ({o.batch_size}; a verification's rows must be one); give --batch-size instead")
    if o.threads_batch is not None and o.threads_batch not in (o.threads or default_threads(), -1):
        raise UsageError(f"--threads-batch {o.threads_batch}: localspec reads prompts and generates with the same"
                         " --threads (a verification is a batch too); give --threads instead")
    draft_threads = o.draft_threads or o.threads or default_threads()
    if o.draft_threads_batch is not None and o.draft_threads_batch not in (draft_threads, -1):
        raise UsageError(f"--threads-batch-draft {o.draft_threads_batch}: a draft reads and drafts with the same"
                         " --threads-draft here; give --threads-draft instead")
    if not o.cache_prompt:
        raise UsageError("--no-cache-prompt: localspec always reads back what a cache holds of a prompt (the answer is"
                         " the same, read faster); --prompt-cache off keeps none on disk")
    if o.context_shift:
        raise UsageError("--context-shift: localspec never shifts the context (it would drop the prompt's beginning"
                         " mid-answer); a generation ends at the context's end (finish reason length), and a chat"
                         " drops its oldest turns before it is read")


def device_names(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(name.strip() for name in text.split(",") if name.strip())


def _shares(text: str | None) -> tuple[float, ...] | None:
    """--tensor-split's 3,1 (or llama.cpp's 3/1) as numbers."""
    if text is None:
        return None
    try:
        return tuple(float(share) for share in text.replace("/", ",").split(","))
    except ValueError:
        raise UsageError(f"--tensor-split takes numbers separated by commas (3,1), got {text!r}") from None


def _retargeted(context: typer.Context, values: dict, target: str) -> Settings:
    """The settings a command line gives with another target named (chat's /load MODEL), the draft model and Hub
    names left for the new target's own."""
    values = values | {"target": target, "model": None, "hf_repo": None, "draft": None, "hf_repo_draft": None}
    return dataclasses.replace(build_settings(context, **values), retarget=functools.partial(_retargeted, context, values))


def without_the_draft(group: dict) -> dict:
    """A group of options as a command that runs no draft model offers them: the draft's own left out, and what the
    target's help says of the draft (OF_THE_DRAFT)."""
    out = {}
    for name, (kind, default) in group.items():
        if name.startswith("draft_"):
            continue
        if name in OF_THE_DRAFT:
            option = copy.copy(kind.__metadata__[0])  # (typer's OptionInfo)
            option.help = option.help.replace(OF_THE_DRAFT[name], "")
            kind = Annotated[kind.__origin__, option]
        out[name] = (kind, default)
    return out


def with_options(*groups: dict, before=None, **defaults):
    """Give a command these groups of shared options (defaults: other defaults for some of them) and
    call it with `settings`, built from them by build_settings. They come before the command's own
    parameters: TARGET must precede a command's own arguments. before(values): may rearrange the
    parsed values first."""

    def decorate(command):
        shared = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=kind,
                                    default=defaults.get(name, default))
                  for group in groups for name, (kind, default) in group.items()]
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in inspect.signature(command).parameters.values()
               if p.name != "settings"]
        names = {p.name for p in shared}
        # (typer hands the command line's context to a parameter of this type)
        context = inspect.Parameter("command_line", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)

        @functools.wraps(command)
        def with_settings(command_line: typer.Context, **values):
            if before:
                before(values)
            shared = {name: values.pop(name) for name in names}
            settings = dataclasses.replace(build_settings(command_line, **shared),
                                           retarget=functools.partial(_retargeted, command_line, shared))
            return command(settings=settings, **values)

        with_settings.__signature__ = inspect.Signature([context, *shared, *own])
        return with_settings

    return decorate


def _adapters(plain: list[str] | None, scaled: list[str] | None, unapplied: bool,
              option: str = "--lora") -> tuple[Adapter, ...]:
    """--lora's files at scale 1, then --lora-scaled's FILE:SCALE (each option comma-separated or repeated, as
    llama.cpp's); every scale 0 under --lora-init-without-apply. option: --control-vector's, alike."""
    adapters = [(item, "1") for given in plain or () for item in given.split(",") if item]
    for item in (item for given in scaled or () for item in given.split(",") if item):
        path, colon, scale = item.rpartition(":")
        if not colon or not path:
            raise UsageError(f"{option}-scaled takes FILE:SCALE (llama.cpp's), got {item!r}")
        adapters.append((path, scale))
    if unapplied and not adapters:
        raise UsageError("--lora-init-without-apply: give the adapters to load with --lora FILE")
    made = []
    for path, scale in adapters:
        try:
            number = float(scale)
        except ValueError:
            raise UsageError(f"{option}-scaled {path}: a scale is a number, got {scale!r}") from None
        file = Path(path).expanduser()
        if not (path.startswith(HUB_PREFIX) or file.is_file()):
            raise InputError(f"{option} {path}: no such file (a file on the Hub: hf:owner/repo/file.gguf)")
        made.append(Adapter(path if path.startswith(HUB_PREFIX) else str(file.resolve()),
                            0.0 if unapplied else number))
    return tuple(made)


SIZE_UNITS = {"": 2**20, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
UNLIMITED = 2**62  # (-1: as much as the disk holds)


def _size(value: str, option: str) -> int:
    """Bytes, from 8GiB, 8G, 500MiB, 500 (MiB, as llama-server's --cache-ram), -1 (no limit), or off (0)."""
    if value.strip().lower() in ("off", "none", "no"):
        return 0
    if value.strip() == "-1":
        return UNLIMITED
    spelled = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", value, re.IGNORECASE)
    if not spelled:
        raise UsageError(f"{option} takes a size (8GiB, 500MiB, 0, -1 for no limit) or off, got {value!r}: localspec"
                         " keeps every long prompt's cache by itself, under " + str(paths.prompts_dir())
                         + " (llama-completion's --prompt-cache FILE named one file for it)")
    return int(float(spelled[1]) * SIZE_UNITS[spelled[2].lower()])


def _parallel(value: str) -> int:
    if value == "auto":
        return AUTO_PARALLEL
    if not value.isdigit():
        raise UsageError(f"--parallel takes a number of sequences or auto, got {value!r}")
    return int(value)


def _chat_template(o: SimpleNamespace) -> str | None:
    """--chat-template's or --chat-template-file's template (one of them), checked to parse."""
    if not o.jinja:
        raise UsageError("--no-jinja asks for llama.cpp's built-in template guesses; localspec renders the chat"
                         " template with Jinja always (--chat-template gives another)")
    if o.chat_template is not None and o.chat_template_file is not None:
        raise UsageError("--chat-template and --chat-template-file each give the chat template; give one")
    if o.chat_template is not None:
        if "{{" not in o.chat_template and "{%" not in o.chat_template:
            raise UsageError(f"--chat-template takes the template's Jinja text (--chat-template-file reads it from a"
                             f" file); llama.cpp's built-in names such as {o.chat_template!r} are not kept here")
        return _checked_template(o.chat_template, "--chat-template")
    if o.chat_template_file is not None:
        return _checked_template(read_text(o.chat_template_file), str(o.chat_template_file))
    return None


def _rope(o: SimpleNamespace) -> Rope:
    """The RoPE options as one Rope (--rope-scale N is --rope-freq-scale 1/N, as llama.cpp reads it)."""
    if o.rope_scale is not None and o.rope_freq_scale is not None:
        raise UsageError("--rope-scale and --rope-freq-scale each set the same factor; give one")
    if o.rope_scale is not None and not o.rope_scale > 0:
        raise UsageError(f"--rope-scale must be > 0, got {o.rope_scale}")
    return Rope(o.rope_scaling, o.rope_freq_base, 1 / o.rope_scale if o.rope_scale is not None else o.rope_freq_scale,
                o.yarn_orig_ctx, o.yarn_ext_factor, o.yarn_attn_factor, o.yarn_beta_slow, o.yarn_beta_fast)


def _hub_repo(text: str) -> str:
    """llama.cpp's -hf OWNER/REPO[:QUANT], which localspec takes as it is (with no quantization, the one llama.cpp's
    downloader would take)."""
    from ..store import registry

    if not registry.is_repo_name(text.partition(":")[0]):
        raise UsageError(f"-hf {text!r}: name a Hub repo, as OWNER/REPO or OWNER/REPO:QUANT")
    return text


def _thinking(o: SimpleNamespace, variables: dict) -> Thinking:
    """--think, --reasoning-effort and --reasoning-budget; --chat-template-kwargs' enable_thinking and
    reasoning_effort where those are not given (guides turn Qwen3's thinking off so, as llama.cpp still takes)."""
    enable, effort = variables.get("enable_thinking"), variables.get("reasoning_effort")
    if enable is not None and not isinstance(enable, bool):
        raise UsageError(f"--chat-template-kwargs: enable_thinking is true or false, got {enable!r}")
    if effort is not None and not isinstance(effort, str):
        raise UsageError(f"--chat-template-kwargs: reasoning_effort is low, medium or high, got {effort!r}")
    if o.reasoning is not None and o.reasoning not in SWITCH:
        raise UsageError(f"--reasoning takes on, off or auto, as llama.cpp's does; got {o.reasoning!r}")
    switched = SWITCH[o.reasoning or "auto"]
    if None not in (o.think, switched) and o.think != switched:
        raise UsageError(f"--{'' if o.think else 'no-'}think and --reasoning {o.reasoning} disagree; give one")
    think = next((said for said in (o.think, switched) if said is not None), False if enable is False else None)
    return Thinking(think=think, effort=o.reasoning_effort or effort, budget=o.reasoning_budget)


def _checked_template(text: str, where: str) -> str:
    from ..chat_template import checked

    return checked(text, where)


def _template_variables(given: str | None) -> dict:
    """--chat-template-kwargs' JSON object."""
    if given is None:
        return {}
    try:
        variables = json.loads(given)
    except (ValueError, RecursionError) as error:
        raise UsageError(f"--chat-template-kwargs is not JSON: {json_trouble(error)}") from None
    if not isinstance(variables, dict):
        raise UsageError(f"--chat-template-kwargs takes a JSON object of the template's variables, as"
                         f" '{{\"thinking\": true}}'; got {given!r}")
    from ..prompts import RENDERED

    if taken := RENDERED.intersection(variables):
        raise UsageError(f"--chat-template-kwargs: {', '.join(sorted(taken))} is each request's own to give, not a"
                         " variable's")
    return variables


def _logit_bias(given: Sequence[str]) -> tuple[tuple[int, float], ...]:
    """--logit-bias's TOKEN_ID(+/-)BIAS values, as llama.cpp reads them."""
    pairs = []
    for value in given:
        spelled = re.fullmatch(r"\s*(\d+)\s*([+-])\s*(\S+)\s*", value)
        try:
            bias = float(spelled[3]) if spelled else math.nan
        except ValueError:
            bias = math.nan
        if math.isnan(bias):
            raise UsageError(f"--logit-bias takes TOKEN_ID(+/-)BIAS, as llama.cpp's: 15043+1, 15043-0.5 or 15043-inf;"
                             f" got {value!r}")
        pairs.append((int(spelled[1]), bias if spelled[2] == "+" else -bias))
    return tuple(pairs)


def _breakers(given: Sequence[str] | None) -> tuple[str, ...]:
    """--dry-sequence-breaker's texts, as llama.cpp reads them: any replaces the defaults, none means no breaker
    at all, and escapes are read (\\n is a newline)."""
    if given is None:
        return DEFAULT_SAMPLING.dry_sequence_breakers
    breakers = []
    for text in given:
        breakers = [] if text == "none" else [*breakers, unescape(text)]
    return tuple(breakers)


def _grammar(o: SimpleNamespace) -> str | None:
    """The output's grammar from --grammar, --grammar-file, --json-schema, --json-schema-file or --format (one of
    them)."""
    given = {"--grammar": o.grammar, "--grammar-file": o.grammar_file, "--json-schema": o.json_schema,
             "--json-schema-file": o.json_schema_file, "--format": o.format}
    named = [name for name, value in given.items() if value is not None]
    if len(named) > 1:
        raise UsageError(f"{' and '.join(named)} each give the output's grammar; give one")
    from ..prompts import output_grammar

    if o.format is not None:
        if o.format != "json":
            raise UsageError(f"--format takes json, as Ollama's does (got {o.format!r}); a JSON schema is"
                             " --json-schema's")
        return output_grammar(any_object=True)
    if o.grammar is not None or o.grammar_file is not None:
        return o.grammar if o.grammar is not None else read_text(o.grammar_file)
    if o.json_schema is None and o.json_schema_file is None:
        return None
    where = "--json-schema" if o.json_schema is not None else str(o.json_schema_file)
    try:
        schema = json.loads(o.json_schema if o.json_schema is not None else read_text(o.json_schema_file))
    except json.JSONDecodeError as error:
        raise InputError(f"{where}: not valid JSON: {error.msg} at line {error.lineno}, column {error.colno}") from None
    except (ValueError, RecursionError) as error:  # a number of over 4,300 digits; nesting deeper than Python's stack
        raise InputError(f"{where}: not JSON that can be read: {json_trouble(error)}") from None
    return output_grammar(schema=schema)


# A prompt, prediction, grammar or schema file is read up to this size (`-f /dev/zero` ran the process out of
# memory, and no context holds a prompt of a tenth of it); batch's input, a file of many prompts, up to BATCH's.
MOST_FILE_BYTES = 64 * 2**20
MOST_BATCH_BYTES = 2**30


def read_text(source: str | Path, most: int = MOST_FILE_BYTES) -> str:
    """A file, or standard input for "-", as UTF-8 text, of at most `most` bytes."""
    if source == "-":
        data, where = sys.stdin.buffer.read(most + 1), "standard input"
    else:
        try:
            with open(source, "rb") as file:
                data, where = file.read(most + 1), str(source)
        except OSError as error:
            raise InputError(f"cannot read {source}: {error.strerror}") from None
    if len(data) > most:
        raise InputError(f"{where} is larger than {most // 2**20:,} MiB, the most taken here")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError(f"{where} is not UTF-8 text (byte {error.start})") from None


def read_prompt(prompt: str | None, file: Path | None) -> str:
    if prompt is not None and file is not None:
        raise UsageError("two prompts: --prompt and --file; give one")
    if prompt is not None:
        return prompt
    return read_text(file or "-")


def piped_input() -> str:
    """Text piped or redirected to standard input from a file, for Ollama's `cat app.py | ollama run MODEL 'Explain
    this'` (empty where there is none). A terminal, nothing at all or a socket is not read: a process started with
    an input it never closes would wait forever."""
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError, io.UnsupportedOperation):  # (not a file: a test's, an embedding program's stream)
        return "" if sys.stdin is None or sys.stdin.isatty() else read_text("-")
    return read_text("-") if stat.S_ISFIFO(mode) or stat.S_ISREG(mode) else ""


# llama.cpp's -e: these backslash escapes in a prompt stand for the characters a shell makes hard to type
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "'": "'", '"': '"', "\\": "\\"}


def unescape(text: str) -> str:
    r"""text with llama.cpp's escapes (\n, \r, \t, \', \", \\, \xNN) replaced by what they stand for;
    any other backslash stays as it is."""
    return re.sub(r"\\(x[0-9A-Fa-f]{2}|[nrt'\"\\])",
                  lambda m: chr(int(m[1][1:], 16)) if m[1][0] == "x" else _ESCAPES[m[1]], text)


def after_model(positional: str, *instead: str) -> Callable[[dict], None]:
    """`COMMAND -m MODEL X`: the one positional argument is X, not a second target (unless an option
    named in `instead` gave X already)."""

    def rearrange(values: dict) -> None:
        if values[positional] is None and values["model"] is not None and all(values[o] is None for o in instead):
            values["target"], values[positional] = None, values["target"]

    return rearrange


SystemOption = Annotated[Optional[str], typer.Option(
    "--system", "--system-prompt", "-sys", help="System prompt: the first turn of the conversation, through the"
    " model's chat template.", show_default=False)]
SystemFileOption = Annotated[Optional[Path], typer.Option(
    "--system-prompt-file", "-sysf", help="The system prompt, read from a file (llama.cpp's -sysf).",
    show_default=False)]
# llama-cli's -co on|off|auto (off: --no-color; on and auto: colours where the output is a terminal) and
# --show-timings/--no-show-timings (off: --quiet), taken so its command lines run (not listed)
ColorOption = Annotated[Optional[str], typer.Option("--color", "-co", hidden=True)]
TimingsOption = Annotated[bool, typer.Option("--show-timings/--no-show-timings", hidden=True)]


def system_prompt(system: str | None, system_file: Path | None) -> str | None:
    """-sys's text, or -sysf's file's (one of them)."""
    if system is not None and system_file is not None:
        raise UsageError("--system and --system-prompt-file each give the system prompt; give one")
    return read_text(system_file) if system_file is not None else system


def colorless(no_color: bool, color: str | None) -> bool:
    """--no-color, or llama-cli's -co off."""
    if color is not None and color not in SWITCH:
        raise UsageError(f"--color takes on, off or auto, as llama.cpp's does; got {color!r}")
    return no_color or (color is not None and SWITCH[color] is False)


LocalOption = Annotated[bool, typer.Option(
    "--local", help="Load the model in this process even where a running `localspec serve` holds it (by default"
    " such a serve answers, at once: its context, threads and drafts are its own).")]
HostOption = Annotated[Optional[str], typer.Option(
    "--host", envvar="LOCALSPEC_HOST", help="Answer through the `localspec serve` at this URL"
    " (http://HOST:PORT; its --api-key from LOCALSPEC_API_KEY) instead of loading the model here.",
    show_default=False)]
VerboseOption = Annotated[bool, typer.Option(
    "--verbose", help="After each answer, its timings as `ollama run --verbose` prints them (total and load"
    " duration, prompt eval and eval counts, durations and rates), then what speculation did; on standard error.")]
HideThinkingOption = Annotated[bool, typer.Option(
    "--hidethinking", "--hide-thinking", help="A reasoning model thinks as before, but its thinking is not shown"
    " (Ollama's --hidethinking); --json still carries it.", rich_help_panel=THINKING)]
