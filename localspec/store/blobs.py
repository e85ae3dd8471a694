"""Files uploaded as Ollama's API uploads them (POST /api/blobs/sha256:HEX, as `ollama create` does with a
Modelfile FROM a GGUF file on the client's machine, and the `ollama` package's create_blob), kept by
digest in blobs/ beside the models folder. A model made with create from one names its path."""

import hashlib
import os
import re
import shutil
from pathlib import Path

from .. import paths
from . import headers
from .download import LEFT_FREE
from ..errors import UsageError

DIGEST = re.compile(r"sha256[:-]([0-9a-f]{64})$")
GGUF_MAGIC = b"GGUF"


def folder() -> Path:
    return paths.models_dir().parent / "blobs"


def path(digest: str) -> Path:
    """Where the blob of this digest is kept; UsageError where it is no sha256 digest."""
    found = DIGEST.match(digest)
    if not found:
        raise UsageError(f"{digest[:80]!r} is not a blob's digest: sha256: and 64 hexadecimal digits")
    return folder() / f"sha256-{found.group(1)}"


def find(digest: str) -> Path | None:
    """The blob of this digest, where one was uploaded."""
    kept = path(digest)
    return kept if kept.is_file() else None


class Upload:
    """A blob arriving in pieces: written beside where it is kept, hashed as it comes, kept only if its
    bytes have the digest it was sent under."""

    def __init__(self, digest: str, size: int | None):
        self.kept = path(digest)
        self.kept.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.kept.parent).free
        if size is not None and size > free - LEFT_FREE:
            raise UsageError(f"the upload is {size / 1e9:.1f} GB, and {free / 1e9:.1f} GB are free in"
                             f" {self.kept.parent} (1 GB is left free)")
        self.room = free - LEFT_FREE
        self.partial = self.kept.with_name(f"{self.kept.name}.{os.getpid()}.{id(self)}.partial")
        self.file = open(self.partial, "wb", opener=paths.no_follow)
        self.hash = hashlib.sha256()
        self.received = 0

    def write(self, piece: bytes) -> None:
        self.received += len(piece)
        if self.received > self.room:
            raise UsageError(f"the upload would leave less than 1 GB free in {self.kept.parent}")
        self.hash.update(piece)
        self.file.write(piece)

    def finish(self) -> Path:
        """The blob kept; UsageError (nothing kept) where its bytes are not what its digest says."""
        self.file.close()
        if f"sha256-{self.hash.hexdigest()}" != self.kept.name:
            self.abort()
            raise UsageError(f"the upload's sha256 is {self.hash.hexdigest()}, not the digest it was sent under:"
                             " nothing was kept")
        os.replace(self.partial, self.kept)
        return self.kept

    def abort(self) -> None:
        self.file.close()
        self.partial.unlink(missing_ok=True)


def model(files: dict[str, str]) -> tuple[Path, Path | None]:
    """The GGUF model among a create request's uploaded files (name -> digest), and its multimodal projector where
    one is among them (as Ollama's create sends a llava's two FROMs), as they are kept; UsageError naming what is
    missing or not taken."""
    others = [name for name in files if not name.lower().endswith(".gguf")]
    if others:
        raise UsageError(f"files: {others[0]}: only GGUF files are taken, a model and its projector (no safetensors;"
                         " adapters go in adapters)")
    kept = {}
    for name, digest in files.items():
        kept[name] = find(digest)
        if kept[name] is None:
            raise UsageError(f"files: {name} ({digest}) has not been uploaded: POST it to /api/blobs/{digest} first")
        with open(kept[name], "rb") as file:
            if file.read(4) != GGUF_MAGIC:
                raise UsageError(f"files: {name} is not a GGUF file")
    projectors = [path for path in kept.values() if headers.read(path).architecture == "clip"]
    models = [path for path in kept.values() if path not in projectors]
    if len(models) != 1 or len(projectors) > 1:
        raise UsageError(f"files: one GGUF model (and at most one multimodal projector); {len(models)} models and"
                         f" {len(projectors)} projectors given")
    return models[0], (projectors or [None])[0]


def adapters(files: dict[str, str]) -> tuple[str, ...]:
    """The uploaded LoRA adapters a create request names (name -> digest), as they are kept; UsageError naming one
    not uploaded or not a GGUF file (a PEFT adapter's safetensors: convert it with llama.cpp's
    convert_lora_to_gguf.py first)."""
    kept = []
    for name, digest in files.items():
        found = find(digest)
        if found is None:
            raise UsageError(f"adapters: {name} ({digest}) has not been uploaded: POST it to /api/blobs/{digest} first")
        with open(found, "rb") as file:
            if file.read(4) != GGUF_MAGIC:
                raise UsageError(f"adapters: {name} is not a GGUF file: localspec applies LoRA adapters in GGUF files"
                                 " (convert a PEFT adapter with llama.cpp's convert_lora_to_gguf.py)")
        kept.append(str(found))
    return tuple(kept)


def prune(file: Path, still_named: set[str]) -> None:
    """Delete an uploaded file no made model is made from any more (as Ollama prunes its blobs); a file
    elsewhere, or one still named, stays."""
    if file.parent == folder() and str(file) not in still_named:
        try:
            file.unlink(missing_ok=True)
        except OSError:  # (held open where the system keeps such files: left for the next removal)
            pass
