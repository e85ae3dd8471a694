"""The files llama.cpp's -hf downloaded before it kept them as the Hugging Face cache does (builds of 2024 and 2025),
read in place: nothing copied, nothing fetched.

Those builds saved a Hub repo's file as one flat file in their cache folder, OWNER_REPO_FILE (every "/" made "_"),
beside a manifest=OWNER=REPO=TAG.json naming the files a tag meant (its ggufFile and mmprojFile). The folder is
$LLAMA_CACHE where set, else llama.cpp in the system's cache folder. (Newer builds move these into the Hugging Face
cache's layout when they next run: download.py reads that.)
"""

import json
import os
import sys
from pathlib import Path

KEEPER = "llama.cpp's cache"
REMOVAL = "deleting that file deletes it (llama.cpp keeps no list of them)"


def folder() -> Path:
    if os.environ.get("LLAMA_CACHE"):
        return Path(os.environ["LLAMA_CACHE"]).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "llama.cpp"
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local") / "llama.cpp"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llama.cpp"


def path(repo: str, file: str) -> Path:
    """Where such a build saved a repo's file."""
    return folder() / f"{repo}_{file}".replace("/", "_")


def files() -> list[tuple[str, str]]:
    """(repo, file) of each file a manifest there names, whose file is there."""
    found = []
    for manifest in sorted(folder().glob("manifest=*=*=*.json")):
        owner, name = manifest.name.split("=")[1:3]
        try:
            named = json.loads(manifest.read_text(encoding="utf-8"))
            listed = [named[key]["rfilename"] for key in ("ggufFile", "mmprojFile") if isinstance(named.get(key), dict)]
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
            continue
        repo = f"{owner}/{name}"
        found += [(repo, file) for file in listed if isinstance(file, str) and path(repo, file).is_file()]
    return list(dict.fromkeys(found))
