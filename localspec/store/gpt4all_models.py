"""The models GPT4All downloaded on this machine, read in place: nothing copied, nothing fetched.

GPT4All keeps each model as one GGUF file under the name the Hub gave it, in its download path: the `modelPath` of
its settings (GPT4All.ini), else nomic.ai/GPT4All in the system's folder for local data. A download under way is
incomplete-FILE there. Each model is read as a model made FROM its file, named by its file name, as GPT4All's own
Python library names it (`gpt4all:NAME` where another model has that name; `.gguf` may be left off).
"""

import configparser
import os
import sys
from pathlib import Path

from .modelfile import Preset

PREFIX = "gpt4all:"  # names GPT4All's model where another model has the same name
ENVIRONMENT = "LOCALSPEC_GPT4ALL_MODELS"  # where GPT4All's models are, when not where its settings say; "": none
KEEPER = "GPT4All"
REMOVAL = "GPT4All deletes it"
PARTIAL = "incomplete"  # how GPT4All begins the name of a file still downloading


def folder() -> Path | None:
    """GPT4All's download path: the one its settings name, else its default."""
    if ENVIRONMENT in os.environ:
        given = os.environ[ENVIRONMENT]
        return Path(given).expanduser() if given else None
    settings = configparser.ConfigParser(interpolation=None, strict=False)
    settings.optionxform = str  # (Qt's keys keep their case)
    try:
        settings.read(_settings_file(), encoding="utf-8")
        chosen = settings.get("General", "modelPath", fallback="")
    except (configparser.Error, UnicodeDecodeError):
        chosen = ""
    return Path(chosen.strip('"')).expanduser() if chosen.strip('"') else _default()


def find(name: str) -> Preset | None:
    """The model of GPT4All's a file name names (after gpt4all: or not; .gguf may be left off), where it is whole
    here; a file of that name in the working folder is that file instead."""
    typed = name.startswith(PREFIX)
    name = name.removeprefix(PREFIX)
    models = folder()
    file = Path(name if name.endswith(".gguf") else f"{name}.gguf")
    if models is None or not name or file.is_absolute() or ".." in file.parts or file.name.startswith(PARTIAL):
        return None
    try:
        if not typed and Path(name).exists() or not (models / file).is_file():
            return None
    except OSError:  # (a name no file system takes: too long)
        return None
    return _model(models, models / file)


def every() -> list[Preset]:
    """Every model of GPT4All's here, by file name (letters' case aside)."""
    models = folder()
    if models is None or not models.is_dir():
        return []
    return sorted((_model(models, path) for path in models.rglob("*.gguf")
                   if path.is_file() and not path.name.startswith(PARTIAL)), key=lambda preset: preset.name.lower())


def _model(models: Path, path: Path) -> Preset:
    return Preset(path.relative_to(models).as_posix(), str(path), kept=str(path), keeper=KEEPER)


def _settings_file() -> Path:
    """GPT4All.ini, where Qt keeps the settings of nomic.ai's apps."""
    if sys.platform == "darwin":
        return Path.home() / ".config" / "gpt4all.io" / "GPT4All.ini"
    if sys.platform == "win32":
        return Path(os.environ.get("APPDATA") or Path.home() / "AppData" / "Roaming") / "nomic.ai" / "GPT4All.ini"
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "nomic.ai" / "GPT4All.ini"


def _default() -> Path:
    """Where GPT4All downloads unless told otherwise (Qt's folder for an app's local data)."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "nomic.ai" / "GPT4All"
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local") / "nomic.ai" / "GPT4All"
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "nomic.ai" / "GPT4All"
