"""The models Jan downloaded or imported on this machine, read in place: nothing copied, nothing fetched.

Jan (0.6 and later) keeps each model of its llama.cpp engine as DATA/llamacpp/models/ID/model.yml, whose model_path
names the GGUF file (relative to DATA where Jan downloaded it, as model.gguf beside the YAML; absolute where Jan
imported a file and left it where it was) and mmproj_path its vision projector. DATA is JAN_DATA_FOLDER where set,
else the data_folder its settings.json names, else Jan/data in the system's data folder. A model ID may hold
slashes (the `jan` command line downloads a Hub repo's file under owner/repo). Each model is read as a model made
FROM its file, named by its ID (`jan:ID` where another model has that name); Jan's YAML is written only once a
download is whole, so a download under way is no model yet.
"""

import json
import os
import re
import sys
from pathlib import Path

import yaml

from .modelfile import Preset

PREFIX = "jan:"  # names Jan's model where a registry model, one made here or Ollama's has the same name
ENVIRONMENT = "JAN_DATA_FOLDER"  # Jan's own: its data folder ("" here: none)
KEEPER = "Jan"
REMOVAL = "Jan deletes it"
MODEL_ID = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")  # Jan's own check on an ID, and never `..`


def data_folder() -> Path | None:
    """Jan's data folder: JAN_DATA_FOLDER where set, else the one its settings name, else its default."""
    if ENVIRONMENT in os.environ:
        given = os.environ[ENVIRONMENT]
        return Path(given).expanduser() if given else None
    for settings in _settings_files():
        try:
            chosen = json.loads(settings.read_text(encoding="utf-8")).get("data_folder")
        except (OSError, UnicodeDecodeError, ValueError, AttributeError):
            continue
        if isinstance(chosen, str) and chosen:
            return Path(chosen).expanduser()
    return _system_data() / "Jan" / "data"


def find(name: str) -> Preset | None:
    """The model of Jan's an ID names (after jan: or not), where its YAML names a file that is here."""
    return find_in(data_folder(), name)


def find_in(data: Path | None, name: str) -> Preset | None:
    """find's answer where Jan's data folder is data (looked up once for several names; None: Jan has none)."""
    model_id = name.removeprefix(PREFIX)
    return _read(data, model_id) if data is not None and _valid(model_id) else None


def every() -> list[Preset]:
    """Every model of Jan's whose file is here, by ID (as a reader sorts them: letters' case aside)."""
    data = data_folder()
    models = data / "llamacpp" / "models" if data else None
    if models is None or not models.is_dir():
        return []
    found = []
    for described in models.rglob("model.yml"):
        model_id = described.parent.relative_to(models).as_posix()
        if _valid(model_id) and (preset := _read(data, model_id)) is not None:
            found.append(preset)
    return sorted(found, key=lambda preset: preset.name.lower())


def _valid(model_id: str) -> bool:
    return bool(MODEL_ID.match(model_id)) and ".." not in model_id.split("/")


def _read(data: Path, model_id: str) -> Preset | None:
    """A model's YAML as a model made FROM the file it names; None where it names none that is here."""
    described = data / "llamacpp" / "models" / model_id / "model.yml"
    try:
        fields = yaml.safe_load(described.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if not isinstance(fields, dict) or not isinstance(fields.get("model_path"), str):
        return None
    model = data / fields["model_path"]  # (an absolute path, as an import leaves, stays itself)
    projector = fields.get("mmproj_path")
    projector = data / projector if isinstance(projector, str) and projector else None
    if not model.is_file() or (projector is not None and not projector.is_file()):
        return None
    return Preset(model_id, str(model), projector=str(projector) if projector else None, kept=str(described),
                  keeper=KEEPER)


def _settings_files() -> list[Path]:
    """Where Jan has kept its settings.json (its data folder is named there), newest versions' place first."""
    bases = [_system_data()] + ([Path.home() / ".config"] if sys.platform.startswith("linux") else [])
    return [base / app / "settings.json" for base in bases for app in ("Jan", "jan.ai.app")]


def _system_data() -> Path:
    """The system's folder for an app's data, as Jan (Tauri) finds it."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support"
    if sys.platform == "win32":
        return Path(os.environ.get("APPDATA") or Path.home() / "AppData" / "Roaming")
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
