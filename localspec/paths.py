"""Where localspec keeps its files. LOCALSPEC_HOME puts everything under one directory."""

import hashlib
import os
from pathlib import Path

import platformdirs

from .errors import UsageError


def home() -> Path | None:
    override = os.environ.get("LOCALSPEC_HOME")
    return Path(override).expanduser() if override else None


def models_dir() -> Path:
    return _cached("models")


def prompts_dir() -> Path:
    """Prompts' caches kept between runs (engine/prompt_cache.py)."""
    return _cached("prompts")


def headers_dir() -> Path:
    """Model files' headers kept between reads (store/headers.py)."""
    return _cached("headers")


def _cached(folder: str) -> Path:
    """A folder of what can be fetched or made again: under LOCALSPEC_HOME where that is set, else the user's cache."""
    root = home()
    return (root if root is not None else Path(platformdirs.user_cache_dir("localspec"))) / folder


def prompts_of(model: Path, root: Path | None = None) -> Path:
    """The folder of a model file's prompts under root (default prompts_dir()): a file replaced (downloaded again,
    requantized) is another model's."""
    stat = model.stat()
    identity = f"{model.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    return (prompts_dir() if root is None else root) / hashlib.sha256(identity.encode()).hexdigest()[:16]


def state_dir() -> Path:
    """Small files localspec keeps between runs (chat history)."""
    root = home()
    return root if root is not None else Path(platformdirs.user_state_dir("localspec"))


def no_follow(path, flags: int) -> int:
    """An opener for open(): a partial download is written only if it is not a link someone planted."""
    return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), 0o644)


def check_output(path: Path, option: str) -> None:
    """A file a command will write, checked before the work that fills it (bench wrote its -o and --plot
    only after the whole run, and then failed)."""
    if path.is_dir():
        raise UsageError(f"{option} {path} is a folder; name a file in it")
    if not path.parent.is_dir():
        raise UsageError(f"{option} {path}: the folder {path.parent} does not exist")
    if not os.access(path if path.exists() else path.parent, os.W_OK):
        raise UsageError(f"cannot write {option} {path}: permission denied")
