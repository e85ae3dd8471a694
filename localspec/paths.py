"""Where localspec keeps its files. LOCALSPEC_HOME puts everything under one directory."""

import os
from pathlib import Path

import platformdirs


def home() -> Path | None:
    override = os.environ.get("LOCALSPEC_HOME")
    return Path(override).expanduser() if override else None


def models_dir() -> Path:
    root = home()
    if root is not None:
        return root / "models"
    return Path(platformdirs.user_cache_dir("localspec")) / "models"


def state_dir() -> Path:
    """Small files localspec keeps between runs (chat history)."""
    root = home()
    return root if root is not None else Path(platformdirs.user_state_dir("localspec"))


def no_follow(path, flags: int) -> int:
    """An opener for open(): a partial download is written only if it is not a link someone planted."""
    return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), 0o644)
