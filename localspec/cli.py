"""Command line: flags become config, events become output, errors become messages and exit codes."""

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from . import __version__
from .config import Limits, Runtime, Sampling, Speculation, default_threads
from .errors import InputError, LocalspecError, UsageError
from .events import Done, Token
from .session import NGRAM, Session

app = typer.Typer(
    help="Local GGUF inference with lossless speculative decoding.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

DEFAULT_SAMPLING = Sampling()
DEFAULT_SPECULATION = Speculation()
DEFAULT_RUNTIME = Runtime()
DEFAULT_LIMITS = Limits()

SAMPLING = "Sampling"
SPECULATION = "Speculation"
RESOURCES = "Resources"


@app.command(
    epilog=(
        "Examples:\n\n"
        "  localspec run qwen-1.5b.gguf --draft qwen-0.5b.gguf --prompt 'Write a quicksort in Python'\n\n"
        "  localspec run model.gguf --draft ngram --file edit-request.txt --temp 0\n\n"
        "  echo 'Hello' | localspec run model.gguf --no-draft --json"
    )
)
def run(
    target: Annotated[Path, typer.Argument(help="Target model: a GGUF file.", show_default=False)],
    draft: Annotated[
        Optional[str],
        typer.Option(
            "--draft",
            "-d",
            help="A draft GGUF sharing the target's tokenizer, or 'ngram' to look up drafts in the prompt"
            " and output. Default: ngram.",
            show_default=False,
        ),
    ] = None,
    no_draft: Annotated[bool, typer.Option("--no-draft", help="Plain decoding, no speculation.")] = False,
    prompt: Annotated[Optional[str], typer.Option("--prompt", "-p", help="Prompt text.", show_default=False)] = None,
    file: Annotated[
        Optional[Path], typer.Option("--file", "-f", help="Read the prompt from a file.", show_default=False)
    ] = None,
    raw: Annotated[
        bool, typer.Option("--raw", help="Send the prompt as is, without the model's chat template.")
    ] = False,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", "-n", help="Most tokens to generate.")
    ] = DEFAULT_LIMITS.max_tokens,
    stop: Annotated[
        Optional[list[str]],
        typer.Option("--stop", help="End generation at this text (repeatable); it is not printed.", show_default=False),
    ] = None,
    temp: Annotated[
        float, typer.Option("--temp", help="Temperature; 0 is greedy.", rich_help_panel=SAMPLING)
    ] = DEFAULT_SAMPLING.temperature,
    top_k: Annotated[
        int, typer.Option("--top-k", help="Keep the k likeliest tokens; 0 keeps all.", rich_help_panel=SAMPLING)
    ] = DEFAULT_SAMPLING.top_k,
    top_p: Annotated[
        float, typer.Option("--top-p", help="Keep the smallest set with this much probability.", rich_help_panel=SAMPLING)
    ] = DEFAULT_SAMPLING.top_p,
    min_p: Annotated[
        float,
        typer.Option("--min-p", help="Drop tokens below this fraction of the likeliest one.", rich_help_panel=SAMPLING),
    ] = DEFAULT_SAMPLING.min_p,
    seed: Annotated[
        Optional[int],
        typer.Option("--seed", help="Seed for reproducible sampling. Default: random.", rich_help_panel=SAMPLING),
    ] = None,
    draft_max: Annotated[
        int, typer.Option("--draft-max", help="Most tokens drafted per step.", rich_help_panel=SPECULATION)
    ] = DEFAULT_SPECULATION.draft_max,
    draft_min: Annotated[
        int,
        typer.Option("--draft-min", help="Skip drafts shorter than this.", rich_help_panel=SPECULATION),
    ] = DEFAULT_SPECULATION.draft_min,
    p_min: Annotated[
        float,
        typer.Option(
            "--p-min",
            help="Stop a model draft when its likeliest next token is less probable than this.",
            rich_help_panel=SPECULATION,
        ),
    ] = DEFAULT_SPECULATION.p_min,
    ctx_size: Annotated[
        int, typer.Option("--ctx-size", "-c", help="Context length in tokens.", rich_help_panel=RESOURCES)
    ] = DEFAULT_RUNTIME.ctx_size,
    threads: Annotated[
        int,
        typer.Option("--threads", "-t", help="CPU threads. Default: physical cores.", show_default=False, rich_help_panel=RESOURCES),
    ] = 0,
    gpu_layers: Annotated[
        int, typer.Option("--gpu-layers", help="Target layers on the GPU; -1 for all.", rich_help_panel=RESOURCES)
    ] = DEFAULT_RUNTIME.gpu_layers,
    draft_gpu_layers: Annotated[
        int, typer.Option("--draft-gpu-layers", help="Draft layers on the GPU; -1 for all.", rich_help_panel=RESOURCES)
    ] = DEFAULT_RUNTIME.draft_gpu_layers,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object with the text and statistics at the end.")
    ] = False,
):
    """Generate from a prompt with speculative decoding; text streams to stdout, statistics go to stderr."""
    if no_draft and draft is not None:
        raise UsageError("--draft and --no-draft exclude each other")
    draft_choice = None if no_draft else (draft or NGRAM)
    if draft_choice not in (None, NGRAM) and not Path(draft_choice).exists():
        raise InputError(f"draft model {draft_choice} does not exist (give a GGUF file or 'ngram')")
    sampling = Sampling(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    speculation = Speculation(draft_max=draft_max, draft_min=draft_min, p_min=p_min)
    runtime = Runtime(
        ctx_size=ctx_size,
        threads=threads or default_threads(),
        gpu_layers=gpu_layers,
        draft_gpu_layers=draft_gpu_layers,
    )
    limits = Limits(max_tokens=max_tokens, stop=tuple(stop or ()))
    text = read_prompt(prompt, file)

    with Session(target, draft_choice, runtime, speculation) as session:
        events = session.generate(session.tokenize(text, raw), sampling, limits)
        done = _consume(events, stream=not as_json)
    if as_json:
        print(json.dumps({"text": done.text, "finish_reason": done.finish_reason, "stats": done.summary.as_dict()}))
    else:
        s = done.summary
        print(
            f"{s.tokens} tokens in {s.decode_seconds:.2f} s, {s.tokens_per_second:.1f} tok/s;"
            f" {s.accepted}/{s.drafted} drafted accepted ({s.acceptance_rate:.0%}),"
            f" {s.mean_accepted_length:.2f} tokens/step; prompt {s.prompt_tokens} tokens in"
            f" {s.prefill_seconds:.2f} s; finish: {done.finish_reason}",
            file=sys.stderr,
        )


def _consume(events, stream: bool) -> Done:
    for event in events:
        if stream and isinstance(event, Token) and event.text:
            sys.stdout.write(event.text)
            sys.stdout.flush()
        if isinstance(event, Done):
            if stream:
                sys.stdout.write(event.tail if event.text.endswith("\n") else event.tail + "\n")
                sys.stdout.flush()
            return event
    raise AssertionError("generation ended without a Done event")


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


@app.command()
def version():
    """Print the localspec version."""
    print(__version__)


def main() -> None:
    try:
        app(standalone_mode=False)
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
        print(f"error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
