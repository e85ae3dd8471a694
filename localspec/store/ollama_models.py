"""The models Ollama downloaded on this machine, read in place: nothing copied, nothing fetched.

Ollama keeps a model as a manifest per tag (manifests/HOST/NAMESPACE/MODEL/TAG, OCI's JSON) naming blobs by
digest (blobs/sha256-HEX): the GGUF file, and what its Modelfile said (parameters, system prompt, opening
messages, licence, LoRA adapters, a vision projector). That is what localspec calls a model of one's own (a
Preset made FROM a GGUF file), so each tag is read as one: `localspec run llama3.2:3b` runs the file Ollama
pulled, with Ollama's settings for it. Its Go chat template is left alone, as for Modelfiles: the GGUF's own
is used.
"""

import json
import os
import re
from dataclasses import replace
from pathlib import Path

from ..errors import UsageError
from .modelfile import LOADING, NEUTRAL_OPTIONS, PARAMETERS, TAKEN_AND_IGNORED, Preset, requested

PREFIX = "ollama:"  # names Ollama's model where a registry model or one made here has the same name
HOST, NAMESPACE, TAG = "registry.ollama.ai", "library", "latest"  # what a short name leaves out, as Ollama reads it
PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # a name's part, never `..` or a path
MEDIA = "application/vnd.ollama.image."
KEEPER = "Ollama"
REMOVAL = "`ollama rm {name}` removes it"
READ_PARAMETERS = set(PARAMETERS) | set(NEUTRAL_OPTIONS) | TAKEN_AND_IGNORED | set(LOADING)


def folders() -> list[Path]:
    """Where Ollama keeps its models: OLLAMA_MODELS where set (as Ollama reads it), else the user's own and a Linux
    service's."""
    if os.environ.get("OLLAMA_MODELS"):
        return [Path(os.environ["OLLAMA_MODELS"]).expanduser()]
    return [Path.home() / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]


def find(name: str) -> Preset | None:
    """The model of Ollama's a name means (llama3.2, llama3.2:3b, user/model:tag, hf.co/owner/repo:Q4_K_M, any of
    them after ollama:), where Ollama has it whole; None otherwise."""
    parts = _parts(name.removeprefix(PREFIX))
    for folder in folders() if parts else ():
        manifest = folder.joinpath("manifests", *parts)
        if manifest.is_file():
            return _read(folder, manifest, parts)
    return None


def every() -> list[Preset]:
    """Every model Ollama has whole here, by name (the first folder's where two hold one name)."""
    found: dict[str, Preset] = {}
    for folder in folders():
        manifests = folder / "manifests"
        for manifest in sorted(manifests.glob("*/*/*/*")) if manifests.is_dir() else ():
            parts = manifest.relative_to(manifests).parts
            if all(PART.match(part) for part in parts) and manifest.is_file():
                preset = _read(folder, manifest, parts)
                if preset is not None:
                    found.setdefault(preset.name, preset)
    return sorted(found.values(), key=lambda preset: preset.name)


def _parts(name: str) -> tuple[str, ...] | None:
    """A name's manifest path (host, namespace, model, tag), as Ollama completes a short name; None where it is no
    name Ollama takes."""
    path, _, tag = name.rpartition(":") if ":" in name.rpartition("/")[2] else (name, "", TAG)
    parts = path.split("/")
    parts = [HOST, NAMESPACE, *parts][-3:] if len(parts) == 1 else [HOST, *parts] if len(parts) == 2 else parts
    parts = [*parts, tag or TAG]
    return tuple(parts) if len(parts) == 4 and all(PART.match(part) for part in parts) else None


def _short(parts: tuple[str, ...]) -> str:
    """A model's name as `ollama list` says it: its host and namespace left out where they are Ollama's own."""
    host, namespace, model, tag = parts
    if host != HOST:
        return f"{host}/{namespace}/{model}:{tag}"
    return f"{model}:{tag}" if namespace == NAMESPACE else f"{namespace}/{model}:{tag}"


def _read(folder: Path, manifest: Path, parts: tuple[str, ...]) -> Preset | None:
    """A tag's manifest as a model made FROM its GGUF blob; None where a blob it names is missing (a pull under way)
    or it is no model (an embedding-less manifest of another kind)."""
    try:
        layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers")
        if not isinstance(layers, list):
            return None
        files: dict[str, list[Path]] = {}
        for layer in layers:
            kind, digest = layer.get("mediaType", ""), layer.get("digest", "")
            if kind.startswith(MEDIA) and re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
                files.setdefault(kind.removeprefix(MEDIA), []).append(folder / "blobs" / digest.replace(":", "-"))
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return None
    if len(files.get("model", [])) != 1 or not all(path.is_file() for paths in files.values() for path in paths):
        return None
    name = _short(parts)
    try:
        parameters = _json(files, "params") or {}
        messages = _json(files, "messages") or []
        return replace(requested(
            name, str(files["model"][0]), _text(files, "system"),
            {key: value for key, value in parameters.items() if key in READ_PARAMETERS},
            messages, _text(files, "license"), [], [str(path) for path in files.get("adapter", [])],
            str(files["projector"][0]) if files.get("projector") else None), kept=str(manifest), keeper=KEEPER)
    except (OSError, UnicodeDecodeError, ValueError, AttributeError, UsageError):
        return None


def _text(files: dict[str, list[Path]], kind: str) -> str | None:
    paths = files.get(kind)
    return "\n\n".join(path.read_text(encoding="utf-8") for path in paths) if paths else None


def _json(files: dict[str, list[Path]], kind: str):
    text = _text(files, kind)
    return json.loads(text) if text else None
