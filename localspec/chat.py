"""Interactive multi-turn chat: the conversation, its slash commands, and Ctrl-C/Ctrl-D handling.

Every turn renders the whole conversation with the model's chat template; the
engine keeps both KV caches and only prefills what is new, so a reply starts as
fast in turn 20 as in turn 2.
"""

import atexit
import json
import re
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from typing import Protocol
from dataclasses import dataclass, replace
from pathlib import Path

from rich.text import Text

from . import tui
from .config import OVERRIDABLE, DrafterKind, Limits, Sampling, Thinking, overridden
from .errors import LocalspecError
from .prompts import is_message
from .request import message_as_json, message_of_json
from .session import Session
from .stats import Recorder
from .store.modelfile import LOAD_OPTIONS, Preset

HELP = """\
/help, /?        this list
/show info|parameters|system  the model, sampling settings, system prompt
/stats           speculation statistics of this chat so far
/clear           forget the conversation (the system prompt stays)
/draft off|on|N  stop speculating, resume, or draft up to N tokens a step
/think, /no-think  let a reasoning model think before it answers, or not
/set parameter NAME VALUE  a sampling setting from the next message (Ollama's names:
                 temperature, top_k, top_p, min_p, seed, num_predict, stop, repeat_penalty, ...)
/set system TEXT the system prompt from the next message (/set think, /set nothink as /think)
/set verbose     each reply's timings as Ollama's --verbose prints them (/set quiet: none)
/image FILE      an image for the next message (with --mmproj); a path in a message (./cat.png) is one too
/audio FILE      an audio file (WAV, MP3, FLAC) for the next message, where the projector hears; a path too
/save MODEL      keep this chat as a model of its own (its model, system prompt, parameters and messages),
                 as Ollama's /save: `localspec chat MODEL` goes on from here
/save FILE.json  write the conversation to a file (a name ending .json, or a path: ./chat)
/load MODEL      switch to another model, its chat started over (as `localspec chat MODEL` with this
                 command line's other options would begin it)
/load FILE.json  go on with a conversation saved by /save FILE.json
/exit, /bye      leave (Ctrl-D works too); Ctrl-C stops a reply but keeps the chat
\"\"\"              start or end a message of several lines (pasting several lines sends them as one)"""

BLOCK = '"""'
PROMPT = "you> "
# /set parameter's names as Ollama's options call them, where they are not localspec's
OLLAMA_PARAMETERS = {"num_predict": "max_tokens"}


# An image file named in a message, as Ollama finds one: a path from / ./ ../ or ~/, spaces in it escaped or the
# whole quoted, ending in an image format's extension (of those llama.cpp reads), or an audio file's
IMAGE_PATH = re.compile(r"""(?<!\S)(?:(?P<quote>['"])(?P<quoted>(?:~|\.{1,2})?/[^'"]*?\.(?:jpe?g|png|gif|bmp|wav|mp3|flac))"""
                        r"""(?P=quote)|(?P<path>(?:~|\.{1,2})?/(?:\\ |\S)*?\.(?:jpe?g|png|gif|bmp|wav|mp3|flac)))"""
                        r"""(?=[\s,;:!?]|\.?$|\.\s)""", re.IGNORECASE)


def images_named(text: str) -> tuple[str, list[tuple[str, bytes]]]:
    """A message's text without the image files it names that exist, and those files (path, bytes), in order."""
    found = []

    def taken(match: re.Match) -> str:
        path = Path(match["quoted"] or match["path"].replace("\\ ", " ")).expanduser()
        if not path.is_file():
            return match[0]
        try:
            found.append((str(path), path.read_bytes()))
        except OSError:
            return match[0]
        return ""

    return IMAGE_PATH.sub(taken, text).strip(), found


def _parameter(value: str):
    """A /set parameter's value as it is typed: a number where it reads as one, true or false a switch (stop's words
    stay text; a setting refuses a value of another kind)."""
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(value.lower(), value)


def _stops(value: str) -> list[str]:
    """`/set parameter stop`'s words, each a stop string, as Ollama's chat takes them; quotes hold one with spaces."""
    try:
        return shlex.split(value)
    except ValueError:  # (a quote left open: the words as typed)
        return value.split()


@dataclass(frozen=True)
class Opened:
    """A model a chat runs and how its chat begins: opening, turns before the first (a made model's MESSAGEs);
    template_variables: more the chat template reads."""

    session: Session
    sampling: Sampling
    limits: Limits
    system: str | None = None
    thinking: Thinking = Thinking()
    opening: Sequence[dict] = ()
    template_variables: dict | None = None


class Models(Protocol):
    """What /load MODEL and /save MODEL ask of the command that opened the chat's model."""

    session: Session  # the model open now (after a failed opened(): the chat's before, open again)

    def opened(self, name: str) -> Opened:
        """Another model, the chat's let go (LocalspecError where it cannot be opened)."""

    def saved(self, name: str, system: str | None, sampling: Sampling, limits: Limits, messages: list[dict]) -> Preset:
        """A model made FROM the chat's with these settings and opening messages."""


class Chat:
    """The terminal's chat: a Conversation and the slash commands that steer it."""

    def __init__(self, session: Session, sampling: Sampling, limits: Limits, system: str | None = None,
                 thinking: Thinking = Thinking(), verbose: bool = False, shows_thinking: bool = True,
                 opening: Sequence[dict] = (), template_variables: dict | None = None, models: Models | None = None):
        """verbose: each reply's timings after it, as Ollama's --verbose (or /set verbose); shows_thinking:
        whether a reasoning model's thinking is shown (Ollama's --hidethinking: not); opening, template_variables:
        as Opened's; models: what opens another (/load MODEL) and makes one (/save MODEL), where the chat may."""
        self._begin(Opened(session, sampling, limits, system, thinking, opening, template_variables))
        self.models = models
        self.verbose, self.shows_thinking = verbose, shows_thinking
        self.images: list[bytes] = []  # for the next message (/image)

    def _begin(self, opened: Opened) -> None:
        self.session = opened.session
        self.conversation = opened.session.chat(opened.system, opened.sampling, opened.limits, opened.thinking,
                                                opened.opening, opened.template_variables)

    @property
    def messages(self) -> list[dict]:
        return self.conversation.messages

    @messages.setter
    def messages(self, messages: list[dict]) -> None:
        self.conversation.messages = messages

    @property
    def recorder(self) -> Recorder:
        return self.conversation.recorder

    @property
    def dropped(self) -> int:
        """The oldest turns the latest message dropped to fit the context."""
        return self.conversation.dropped

    def clear(self) -> None:
        self.conversation.clear()

    def reply(self, text: str, show: Callable, console=None) -> str:
        """Answer one user message and return the answer; `show` sees the events as they come. Ctrl-C
        stops the answer, which stays in the conversation as far as it got. The images /image named, and those
        whose files the message names where the model reads images, go with it (console: where that is said)."""
        if self.session.info.vision or self.session.info.audio:  # (a serve's too, where one answers the chat)
            text, named = images_named(text)
            for path, _ in named:
                if console is not None:
                    console.print(f"[dim]added image {tui.shown(path)}[/]", highlight=False)
            self.images += [image for _, image in named]
        images, self.images = self.images, []
        try:
            for event in self.conversation.stream(text, images):
                show(event)
        except KeyboardInterrupt:
            pass
        return self.messages[-1]["content"]

    def command(self, line: str, console) -> bool:
        """Run a slash command; False means leave the chat."""
        name, _, argument = line[1:].partition(" ")
        argument = argument.strip()
        if name in ("exit", "quit", "bye"):
            return False
        if name in ("help", "?"):
            console.print(HELP, highlight=False)
        elif name == "show":
            self._show(argument, console)
        elif name == "stats":
            console.print(tui.stats_panel(self.recorder.summary(), "this chat"))
        elif name == "clear":
            self.clear()
            console.print("[dim]conversation cleared[/]")
        elif name == "draft":
            self._draft(argument, console)
        elif name in ("think", "no-think", "nothink"):
            self._think(name == "think", console)
        elif name == "load":
            self._load(argument, console)
        elif name in ("image", "audio"):
            self._image(name, argument, console)
        elif name == "set":
            self._set(argument, console)
        elif name == "save":
            self._save(argument, console)
        else:
            console.print(f"[red]unknown command /{tui.shown(name)}[/]; /help lists them")
        return True

    def _image(self, kind: str, argument: str, console) -> None:
        """/image FILE, /audio FILE (llama-mtmd-cli's): a file for the next message."""
        if not argument:
            console.print(f"[red]usage: /{kind} FILE[/]")
            return
        info = self.session.info
        if not (info.audio if kind == "audio" else info.vision):
            console.print(f"[red]this model reads no {'audio' if kind == 'audio' else 'images'}: start it with its"
                          " multimodal projector (--mmproj FILE)[/]")
            return
        path = Path(argument.strip("'\"")).expanduser()
        try:
            self.images.append(path.read_bytes())
        except OSError as error:
            console.print(f"[red]cannot read {tui.shown(argument)}: {tui.shown(error.strerror)}[/]")
            return
        console.print(f"[dim]{'audio' if kind == 'audio' else 'image'} {tui.shown(argument)} goes with the next"
                      " message[/]")

    def _save(self, argument: str, console) -> None:
        """/save FILE.json: the conversation as JSON; /save MODEL: a model of one's own, as Ollama's /save."""
        if not argument:
            console.print("[red]usage: /save MODEL, or /save FILE.json[/]")
        elif not names_a_file(argument):
            self._save_model(argument, console)
        else:
            try:
                Path(argument).expanduser().write_text(json.dumps(
                    [message_as_json(m) for m in self.messages], indent=2, ensure_ascii=False) + "\n")
            except OSError as error:  # the conversation is worth more than the file: keep chatting
                console.print(f"[red]cannot save to {tui.shown(argument)}: {tui.shown(error.strerror)}[/]")
            else:
                console.print(f"[dim]saved {len(self.messages)} messages to {tui.shown(argument)}, a file /load"
                              " reads[/]")

    def _save_model(self, name: str, console) -> None:
        """A model made FROM the one this chat runs, with the chat's system prompt, its parameters that differ from
        localspec's defaults and its messages (images left out: a Modelfile's MESSAGE is text)."""
        if self.models is None:
            console.print("[red]/save MODEL: this chat's model has no name a model can be made from (/save FILE.json"
                          " keeps the conversation)[/]")
            return
        conversation = self.conversation
        messages = [{"role": m["role"], "content": m["content"]} for m in self.messages
                    if m["role"] in ("user", "assistant") and isinstance(m.get("content"), str)]
        try:
            made = self.models.saved(name, conversation.system, conversation.sampling, conversation.limits, messages)
        except LocalspecError as error:
            console.print(f"[red]cannot save {tui.shown(name)}: {tui.shown(error)}[/]")
            return
        console.print(f"[dim]created model {tui.shown(made.name)} from {tui.shown(made.base)}"
                      f" ({len(made.messages)} messages, {len(made.parameters)} parameter{'s' * (len(made.parameters) != 1)}"
                      f"{', its system prompt' if made.system else ''}): `localspec chat {tui.shown(made.name)}`"
                      " goes on from here[/]", highlight=False)

    def _load(self, argument: str, console) -> None:
        if not argument:
            console.print("[red]usage: /load MODEL, or /load FILE.json[/]")
            return
        if not names_a_file(argument):
            self._switch(argument, console)
            return
        try:
            messages = json.loads(Path(argument).expanduser().read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
            console.print(f"[red]cannot load {tui.shown(argument)}: {tui.shown(getattr(error, 'strerror', None) or error)}"
                          + (" (/load FILE.json reads what /save FILE.json wrote)"
                             if isinstance(error, FileNotFoundError) else "") + "[/]")
            return
        if not (isinstance(messages, list) and all(is_message(m) for m in messages)):
            console.print(f"[red]{tui.shown(argument)} is not a conversation saved by /save[/]")
            return
        try:
            self.messages = [message_of_json({key: m[key] for key in ("role", "content", "reasoning_content", "images")
                                              if isinstance(m.get(key), list if key == "images" else str)})
                             for m in messages]
        except LocalspecError as error:
            console.print(f"[red]cannot load {tui.shown(argument)}: {tui.shown(error)}[/]")
            return
        console.print(f"[dim]loaded {len(self.messages)} messages from {tui.shown(argument)}[/]")

    def _switch(self, name: str, console) -> None:
        """/load MODEL, as Ollama's: the chat goes on with another model, from its own beginning."""
        if self.models is None:
            console.print("[red]/load MODEL: this chat cannot open another model (/load FILE.json loads a"
                          " conversation)[/]")
            return
        console.print(f"[dim]loading {tui.shown(name)}...[/]", highlight=False)
        try:
            opened = self.models.opened(name)
        except (LocalspecError, KeyboardInterrupt) as error:
            # the model before, opened again where it was let go: the conversation goes on in it
            self.session = self.conversation.session = self.models.session
            said = "interrupted" if isinstance(error, KeyboardInterrupt) else tui.shown(error)
            console.print(f"[red]cannot load {tui.shown(name)}: {said}; the chat goes on with"
                          f" {tui.shown(self.session.info.target)}[/]")
            return
        self._begin(opened)
        console.print(f"[dim]chatting with {tui.shown(self.session.info.target)}, from its beginning"
                      + (f" ({len(opened.opening)} messages of its own)" if opened.opening else "") + "[/]",
                      highlight=False)

    def _set(self, argument: str, console) -> None:
        """Ollama's /set: `parameter NAME VALUE`, `system TEXT`, `think`, `nothink`, `verbose`, `quiet`."""
        what, _, rest = argument.partition(" ")
        if what in ("think", "nothink"):
            self._think(what == "think", console)
        elif what in ("verbose", "quiet") and not rest.strip():
            self.verbose = what == "verbose"
            console.print(f"[dim]{'each reply' if self.verbose else 'no reply'} followed by its timings[/]")
        elif what == "system" and rest.strip():
            self.conversation.system = rest.strip()
            kept = self.messages[1:] if self.messages and self.messages[0]["role"] == "system" else self.messages
            self.messages = [{"role": "system", "content": self.conversation.system}, *kept]
            console.print("[dim]system prompt set[/]")
        elif what == "parameter" and len(rest.split(None, 1)) == 2:
            name, value = rest.split(None, 1)
            setting = OLLAMA_PARAMETERS.get(name, name)
            conversation = self.conversation
            if setting in LOAD_OPTIONS:
                console.print(f"[red]{tui.shown(name)} is fixed when the model loads: start the chat with"
                              f" {LOAD_OPTIONS[setting]} {tui.shown(value)}[/]")
                return
            try:
                conversation.sampling, conversation.limits = overridden(
                    conversation.sampling, conversation.limits,
                    **{setting: _stops(value) if setting == "stop" else _parameter(value)})
            except LocalspecError as error:  # (said under the name typed: num_predict, not max_tokens)
                console.print(f"[red]{tui.shown(str(error).replace(setting, name, 1))}[/]")
            else:
                console.print(f"[dim]{tui.shown(name)} set to {tui.shown(value)} from the next message[/]")
        else:
            console.print("[red]usage: /set parameter NAME VALUE, /set system TEXT, /set think, /set nothink,"
                          " /set verbose, /set quiet[/]")

    def _show(self, argument: str, console) -> None:
        """Ollama's /show: `info`, `parameters`, `system`."""
        if argument == "info":
            info = self.session.info
            console.print(f"{tui.shown(self.session.describe())}\ncontext {info.n_ctx:,} tokens, vocabulary"
                          f" {info.n_vocab:,} tokens", highlight=False, markup=False)
        elif argument == "parameters":
            sampling, limits = self.conversation.sampling, self.conversation.limits
            # what /set parameter sets, but a grammar's text and logprobs (no chat shows those)
            shown = {name: getattr(sampling, name) for name in OVERRIDABLE if name not in ("grammar", "logprobs")}
            shown |= {"num_predict": limits.max_tokens, "stop": list(limits.stop)}
            console.print("\n".join(f"{name:<18} {json.dumps(value)}" for name, value in shown.items()),
                          highlight=False, markup=False)
        elif argument == "system":
            console.print(self.conversation.system or "(no system prompt)", highlight=False, markup=False)
        else:
            console.print("[red]usage: /show info, /show parameters, /show system[/]")

    def _think(self, on: bool, console) -> None:
        if not self.session.thinks:
            console.print("[red]this model does not think before it answers (its chat template shows no thinking)[/]")
            return
        self.conversation.thinking = replace(self.conversation.thinking, think=on,
                                             budget=None if on else self.conversation.thinking.budget)
        console.print(f"[dim]thinking {'on' if on else 'off'} from the next message[/]")

    def _draft(self, argument: str, console) -> None:
        if argument == "off":
            self.session.use(DrafterKind.PLAIN)
            console.print("[dim]speculation off: plain decoding[/]")
        elif argument == "on" or argument.isdigit():
            if not self.session.can_speculate:
                console.print("[red]this chat was started without a drafter (--no-draft)[/]")
                return
            if argument.isdigit():
                try:
                    self.session.set_draft_max(int(argument))
                except LocalspecError as error:
                    console.print(f"[red]{tui.shown(error)}[/]")
                    return
            self.session.use(self.session.default_mode)
            console.print(f"[dim]speculation on, up to {self.session.draft_limit} draft tokens a step[/]")
        else:
            console.print("[red]usage: /draft off|on|N[/]")


def names_a_file(argument: str) -> bool:
    """Whether /save's or /load's argument names a file (a path, a name ending .json, a file there is) rather than
    a model, as Ollama's /save and /load name one."""
    return (argument.lower().endswith(".json") or "/" in argument or argument.startswith(("~", "."))
            or Path(argument).expanduser().exists())


def run(chat: Chat, interactive: bool, color: bool, history_file: Path | None) -> None:
    """The read-reply loop. Not interactive (stdin is a pipe): one message a line, plain output."""
    console = tui.out
    if interactive:
        _enable_line_editing(history_file)
        info = chat.session.info
        sees = "".join(([" It reads images: /image FILE, or a path in a message."] if info.vision else [])
                       + ([" It reads audio: /audio FILE, or a path in a message."] if info.audio else []))
        console.print(f"[dim]Chatting with {tui.shown(chat.session.info.target)}. /help for commands,"
                      f' """ for several lines, Ctrl-D to leave.{sees}[/]')
    while True:
        try:
            line = input(PROMPT if interactive else "")
        except EOFError:
            if interactive:
                console.print()
            return
        except KeyboardInterrupt:
            console.print("\n[dim](Ctrl-D or /exit to leave)[/]")
            continue
        if interactive and _taller_than(line, console):
            _echo_again(line, console)
        opened = _opened_block(line.strip())
        if opened is not None:
            try:
                rest = _read_block(opened[1], interactive)
            except KeyboardInterrupt:  # (as at the prompt: the block is dropped, the chat goes on)
                console.print("\n[dim](message dropped; Ctrl-D or /exit to leave)[/]")
                continue
            if rest is None:
                return
            line = opened[0] + rest
        line = line.strip()
        if not line:
            continue
        if line.startswith("/"):
            if not chat.command(line, console):
                return
            continue
        try:
            started = time.perf_counter()
            if interactive:
                with tui.LiveView(console, color=color, summary=False, thinking=chat.shows_thinking) as view:
                    chat.reply(line, view.add, console)
                if chat.dropped:
                    console.print(f"[dim]{_dropped_line(chat)}[/]", highlight=False)
                console.print(f"[dim]{tui.reply_line(view.recorder)}[/]", highlight=False)
                recorder = view.recorder
            else:
                recorder = Recorder()
                tui.write_text(chat.reply(line, recorder.add) + "\n")
                if chat.dropped:
                    print(f"note: {_dropped_line(chat)}", file=sys.stderr)  # (whole: a script reads it)
            if chat.verbose:  # (the models loaded before the first message: no reply waited for them)
                timings = tui.ollama_timings(recorder.summary(), time.perf_counter() - started, None)
                if interactive:
                    console.print(timings, highlight=False, markup=False)
                else:
                    print(timings, file=sys.stderr)
        except LocalspecError as error:
            console.print(f"[red]error: {tui.shown(error)}[/] (/clear starts over)")


def _taller_than(text: str, console) -> bool:
    """Whether a message, as the prompt echoed it, takes more rows than the terminal has: readline's echo
    of a paste that tall is garbled (rows lost, tails of lines written over others)."""
    width = max(1, console.width)
    rows = sum(max(1, -(-(len(PROMPT) * (number == 0) + len(line)) // width))
               for number, line in enumerate(text.split("\n")))
    return rows >= console.height - 1


def _echo_again(text: str, console) -> None:
    """The screen cleared (what scrolled off stays in the terminal's scrollback) and the message written
    whole, wrapped by us, so that what the model is sent is what shows."""
    console.file.write("\x1b[H\x1b[2J")
    console.print(Text(PROMPT + text), highlight=False)


def _dropped_line(chat: Chat) -> str:
    dropped = chat.dropped
    return (f"the oldest {dropped} turn{'s were' if dropped > 1 else ' was'} dropped to fit the context of"
            f" {chat.session.info.n_ctx:,} tokens (the system prompt is kept)")


def _opened_block(line: str) -> tuple[str, str] | None:
    """Where a line opens triple quotes, as Ollama's chat reads them: a message (the quotes, then its text) or a
    system prompt (`/set system `, the quotes, its text): what comes before the quotes, and the text after them."""
    head = next((head for head in ("", "/set system ") if line.startswith(head + BLOCK)), None)
    return None if head is None else (head, line[len(head) + len(BLOCK):])


def _read_block(first: str, interactive: bool) -> str | None:
    """The text of several lines from the one that opened triple quotes (first: its text after them) to the one
    that closes them (as in Ollama); None if the input ends first."""
    lines = [first]
    while not lines[-1].rstrip().endswith(BLOCK):
        try:
            lines.append(input("... " if interactive else ""))
        except EOFError:
            return None
    lines[-1] = lines[-1].rstrip()[: -len(BLOCK)]
    return "\n".join(lines)


def _enable_line_editing(history_file: Path | None) -> None:
    try:
        import readline
    except ImportError:  # no readline on this platform: plain input() still works
        return
    # Python turns bracketed paste off; with it on, readline takes a pasted block of lines as one
    # input instead of sending each line as a message.
    readline.parse_and_bind("set enable-bracketed-paste on")
    if history_file is None:
        return
    history_file.parent.mkdir(parents=True, exist_ok=True)
    if history_file.exists():
        readline.read_history_file(history_file)
    atexit.register(readline.write_history_file, history_file)
