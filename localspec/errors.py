"""Errors meant for the user: the message is what the CLI prints, the code is its exit status."""

import json
import re


class LocalspecError(Exception):
    """What localspec refuses or fails at, said for its user (each kind below); the CLI prints the message and
    exits with exit_code. Catch it around a library call: anything else is a fault of localspec's own."""

    exit_code = 1


class UsageError(LocalspecError):
    """The user asked for something that cannot work (bad value, bad combination). setting: the one setting
    at fault, as an API request names it (OpenAI's error `param`), where there is one."""

    exit_code = 2

    def __init__(self, message: str, setting: str | None = None):
        super().__init__(message)
        self.setting = setting


class InputError(LocalspecError):
    """A file or prompt given by the user cannot be used."""

    exit_code = 2


class ContextOverflow(InputError):
    """The prompt does not fit the context."""


class UnknownModel(LocalspecError):
    """A request names a model that is neither loaded nor downloaded (serve answers it with a 404)."""


class ModelLoadError(LocalspecError):
    """llama.cpp refused a model file."""

    exit_code = 2


class FetchError(LocalspecError):
    """A model could not be fetched or failed verification."""

    exit_code = 3


class DownloadInterrupted(FetchError):
    """Ctrl-C during a download: what arrived is kept for the next attempt to resume."""

    exit_code = 130


class EngineError(LocalspecError):
    """llama.cpp failed while generating."""

    exit_code = 4


class IncompatibleDraft(UsageError):
    """The draft cannot draft for the target (a drafter of its hidden states or cache made for another, a
    state that cannot be taken back); carries the compatibility report."""

    def __init__(self, message: str, report):
        super().__init__(message)
        self.report = report


def json_trouble(error: ValueError | RecursionError) -> str:
    """What is wrong with a JSON text that json.loads could not take, beyond its syntax: nesting deeper than
    Python's stack, or a number longer than Python reads (its own words)."""
    return "nested too deeply" if isinstance(error, RecursionError) else str(error).split(";")[0]


def loads_json(data: str | bytes | bytearray):
    """json.loads, refusing NaN and Infinity and a lone surrogate (a ValueError, as for any JSON it cannot take): JSON's escapes can
    spell \\ud800, which no UTF-8 text holds, so llama.cpp, a file and a socket could not take it (an editor that
    cut a string inside an emoji sends one; llama-server's parser refuses them too)."""
    value = json.loads(data, parse_constant=_not_json)
    if re.search(rb"\\u[dD][89a-fA-F]" if isinstance(data, (bytes, bytearray)) else r"\\u[dD][89a-fA-F]", data):
        if where := _lone_surrogate(value):
            raise ValueError(f"a lone surrogate (half of a UTF-16 pair, no character of its own) in {where}")
    return value


def _not_json(constant: str):
    """Python's json reads NaN and Infinity, which JSON has not (a temperature of NaN passed every check)."""
    raise ValueError(f"{constant} is not JSON (a number is finite)")


def _lone_surrogate(value, where: str = "") -> str | None:
    """Where in a JSON value a text holds a lone surrogate (its path: messages.0.content), if anywhere."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where or "the text"
    elif isinstance(value, (dict, list)):
        for key, item in value.items() if isinstance(value, dict) else enumerate(value):
            path = f"{where}.{ascii(key)[1:-1] if isinstance(key, str) else key}".lstrip(".")  # (ascii: it may hold one)
            if found := _lone_surrogate(key, path) or _lone_surrogate(item, path):
                return found
    return None
