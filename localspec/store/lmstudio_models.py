"""The models LM Studio downloaded on this machine, read in place: nothing copied, nothing fetched.

LM Studio keeps a Hugging Face repo's files under the names the Hub gives them, in MODELS/OWNER/REPO/FILE; its
models folder is ~/.lmstudio/models unless its settings name another (`downloadsFolder`), its home moved where
~/.lmstudio-home-pointer says, and ~/.cache/lm-studio/models before version 0.3. So a file named by its repo
(owner/repo:Q4_K_M, hf:owner/repo/file.gguf, a registry model) that LM Studio has is the one localspec uses.
"""

import json
import os
from pathlib import Path

ENVIRONMENT = "LOCALSPEC_LMSTUDIO_MODELS"  # where LM Studio's models are, when not where its settings say; "": none


def folders() -> list[Path]:
    """LM Studio's models folders: the one its settings name (or its default), then the one it used before 0.3."""
    if ENVIRONMENT in os.environ:
        given = os.environ[ENVIRONMENT]
        return [Path(given).expanduser()] if given else []
    home = _home()
    try:
        settings = json.loads((home / "settings.json").read_text(encoding="utf-8"))
        chosen = settings.get("downloadsFolder") if isinstance(settings, dict) else None
    except (OSError, UnicodeDecodeError, ValueError):
        chosen = None
    models = Path(chosen).expanduser() if isinstance(chosen, str) and chosen else home / "models"
    return [models, Path.home() / ".cache" / "lm-studio" / "models"]


def roots(repo: str) -> list[Path]:
    """The folders holding a Hub repo's files as LM Studio downloaded them."""
    return [folder / repo for folder in folders() if (folder / repo).is_dir()]


def repos() -> list[tuple[str, Path]]:
    """Every Hub repo (owner/name) of which LM Studio keeps files, with its folder (the first folder's where two
    hold one)."""
    found: dict[str, Path] = {}
    for folder in folders():
        for root in sorted(folder.glob("*/*")) if folder.is_dir() else ():
            if root.is_dir():
                found.setdefault(root.relative_to(folder).as_posix(), root)
    return sorted(found.items())


def _home() -> Path:
    """LM Studio's home: where its pointer file says, else ~/.lmstudio."""
    try:
        pointed = (Path.home() / ".lmstudio-home-pointer").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        pointed = ""
    return Path(pointed).expanduser() if pointed else Path.home() / ".lmstudio"
