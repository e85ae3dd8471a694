"""The typer application: localspec's --help, its commands' registration, and the boundary where
errors become messages and exit codes."""

import copy
import inspect
import os
import re
import sys
from typing import Annotated

import typer

from .. import __version__, tui
from ..errors import IncompatibleDraft, LocalspecError, UsageError
from .options import LLAMA_CPP_LACKS

# What a value looks like in --help, by the Python type Typer read from the annotation; a flag shows none.
METAVARS = {"int": "N", "float": "NUMBER", "str": "TEXT", "Path": "PATH", "list[str]": "TEXT"}


class _PlainHelp:
    """--help that leaves the room to the help text: each option shows one long and one short name
    and a plain metavar (N, TEXT) instead of Typer's type tags; its other spellings (llama.cpp's, the
    --no- form) are named at the end of its help. A docstring's paragraphs flow to the terminal's width:
    Typer's rich help keeps the source's line breaks within them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.help:
            self.help = "\n\n".join(" ".join(paragraph.split()) for paragraph in inspect.cleandoc(self.help).split("\n\n"))

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
            reason = LLAMA_CPP_LACKS.get(arg, "one dash and several letters is one option, as in llama.cpp")
            raise UsageError(f"no such option: {arg}; {reason} (`localspec {command.name} --help` lists those"
                             " localspec takes)")
        value_next = not value_next and arg in taking_values


class _HelpGroup(_PlainHelp, typer.core.TyperGroup):
    pass


# -h as llama.cpp's tools, Ollama's and LM Studio's take it
app = typer.Typer(cls=_HelpGroup, no_args_is_help=True, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["--help", "-h"]})


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
    version: Annotated[bool, typer.Option("--version", "-v", help="Print the version and exit (Ollama's -v).",
                                          callback=_print_version,
                                          is_eager=True)] = False,
):
    """Local GGUF inference with lossless speculative decoding."""


# Ollama's --think=VALUE (a flag that may take a value): spelled as localspec's flags before parsing, where
# `--think VALUE` would be ambiguous (a prompt after --think)
THINK_VALUES = {"true": ["--think"], "false": ["--no-think"], **{effort: ["--think", "--reasoning-effort", effort]
                                                                 for effort in ("low", "medium", "high")}}


def _ollama_spellings(args: list[str]) -> list[str]:
    out = []
    for index, arg in enumerate(args):
        if arg == "--":  # what follows is text
            return out + args[index:]
        if not arg.startswith("--think="):
            out.append(arg)
            continue
        value = arg.removeprefix("--think=").lower()
        if value not in THINK_VALUES:
            raise UsageError(f"--think= takes {', '.join(THINK_VALUES)} (Ollama's values), got {value!r}")
        out += THINK_VALUES[value]
    return out


def main() -> None:
    try:
        # (named so under `python -m localspec` too: its help and its shell completion are the command's)
        status = app(args=_ollama_spellings(sys.argv[1:]), prog_name="localspec", standalone_mode=False)
    except typer.Abort:
        sys.exit(130)
    except typer.TyperException as error:  # typer's command-line parsing errors
        message = error.format_message()
        unknown = getattr(error, "option_name", None) if message.startswith("No such option") else None
        if unknown in LLAMA_CPP_LACKS:  # llama.cpp's, and what localspec does instead
            message = f"no such option: {unknown}; {LLAMA_CPP_LACKS[unknown]}"
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
            tui.compat_report(error.report, console=tui.err)
        print(f"error: {tui.visible(str(error), layout=False)}", file=sys.stderr)
        sys.exit(error.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(status if isinstance(status, int) else 0)
