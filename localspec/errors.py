"""Errors meant for the user: the message is what the CLI prints, the code is its exit status."""


class LocalspecError(Exception):
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
