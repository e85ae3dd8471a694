"""Finding a model to fetch (`localspec search`, LM Studio's SDK's repository search): the registry's models and the
Hub's GGUF repos whose names hold a search's text, and a repo's GGUF files, a quantization each, with its size and
whether it fits this machine."""

from dataclasses import dataclass

from ..errors import FetchError
from . import download, hardware, registry

# How a quantization fits this machine's memory with a context of the default size (LM Studio's fit estimations)
ON_THE_GPU, PARTLY_ON_THE_GPU, IN_RAM, TOO_BIG = "on the GPU", "partly on the GPU", "in RAM", "too big"
MOST_ASKED = 100  # repos asked of the Hub for a search of several words, before those holding every word are kept
PREFERRED = "Q4_K_M"  # llama.cpp's and Ollama's usual choice, where it fits


@dataclass(frozen=True)
class Found:
    """A model to fetch: name, what `pull` takes; repo, where on the Hub; from_registry, whether the registry names
    it (with its drafts); downloads and likes, the Hub's counts where it was asked."""

    name: str
    repo: str | None
    from_registry: bool
    params: str = ""
    drafts: tuple[str, ...] = ()
    downloaded: bool = False
    downloads: int | None = None
    likes: int | None = None


@dataclass(frozen=True)
class Quantization:
    """A model file of a Hub repo (its parts together, where split): pull, what `pull` takes for it; here, whether it
    is downloaded (by localspec, or read in place where another app downloaded it: download.installed)."""

    file: str
    quant: str
    size: int
    fit: str
    pull: str
    recommended: bool = False
    here: bool = False


def search(text: str, limit: int = 20, offline: bool = False) -> tuple[list[Found], str]:
    """The registry's models whose names (aliases, repo, family) hold every word of text, then the Hub's GGUF repos
    whose names hold every word, the most downloaded first (at most limit of them); and why the Hub's are missing, where
    it could not be reached or the environment said not to ask it (offline: not asked, and nothing said)."""
    words = text.lower().split()
    models = registry.load()
    found = [_registered(entry, models) for entry in models.values()
             if not entry.drafts and all(any(word in said.lower() for said in _said_of(entry)) for word in words)]
    if offline:
        return found, ""
    if download.offline_requested():
        return found, "HF_HUB_OFFLINE is set: the Hub was not searched"
    try:  # (the Hub finds a repo by one piece of its name: asked for the longest word, the rest looked for here)
        hub = download.hub_search(max(words, key=len), limit if len(words) == 1 else MOST_ASKED) if words else []
    except FetchError as error:
        return found, str(error)
    hub = [repo for repo in hub if all(word in repo.repo.lower() for word in words)][:limit]
    registered = {model.repo: number for number, model in enumerate(found) if model.repo}
    for repo in hub:
        if repo.repo in registered:
            at = registered[repo.repo]
            found[at] = Found(**vars(found[at]) | {"downloads": repo.downloads, "likes": repo.likes})
        else:
            found.append(Found(repo.repo, repo.repo, False, _params(repo.parameters), downloads=repo.downloads,
                               likes=repo.likes))
    return found, ""


def _said_of(entry: registry.ModelEntry) -> tuple[str, ...]:
    return entry.name, *entry.aliases, entry.repo or "", entry.family


def _registered(entry: registry.ModelEntry, models: dict) -> Found:
    drafts = (*([entry.draft] if entry.draft else []), *(d.name for d in registry.drafters_of(entry, models)))
    return Found(entry.command_name, entry.repo, True, entry.params, drafts, download.installed(entry) is not None)


def _params(count: int | None) -> str:
    if not count:
        return ""
    return f"{count / 1e9:.3g}B" if count >= 1e9 else f"{count / 1e6:.3g}M"


def quantizations(name: str, offline: bool = False, n_ctx: int = 4096) -> list[Quantization]:
    """A Hub repo's model files (no projector, imatrix or drafter published beside one), a quantization each, by
    size; the one recommended: Q4_K_M where it fits, else the largest that fits. For a registry name, its file.
    Offline: the repo's files downloaded here."""
    machine = hardware.machine()
    entry = registry.load().get(name)
    if entry is not None and not entry.drafts:
        size = entry.size or 0
        return [Quantization(entry.file, registry.quant_of(entry.file), size, _fit(size, n_ctx, machine),
                             entry.command_name, recommended=True, here=download.installed(entry) is not None)]
    downloaded = download.downloaded_sizes(name)
    sizes = downloaded if offline else download.hub_file_sizes(name)
    out = []
    for file in sorted(sizes):
        if not registry.is_model_file(file) or registry.split_parts(file)[:1] not in ((), (file,)):
            continue  # (a split model is named by its first part)
        size = sum(sizes.get(part, 0) for part in registry.split_parts(file) or (file,))
        quant = registry.quant_of(file)
        pull = f"{name}:{quant}" if download.quant_file(sizes, quant) == file else f"hf:{name}/{file}"
        out.append(Quantization(file, quant, size, _fit(size, n_ctx, machine), pull,
                                here=all(part in downloaded for part in registry.split_parts(file) or (file,))))
    fitting = [q for q in out if q.fit != TOO_BIG]
    best = next((q for q in fitting if q.quant == PREFERRED), max(fitting, key=lambda q: q.size, default=None))
    return sorted((Quantization(**vars(q) | {"recommended": q is best}) for q in out), key=lambda q: q.size)


def _fit(size: int, n_ctx: int, machine: hardware.Machine) -> str:
    needed = hardware.estimate_pair([(None, size)], n_ctx) or size
    if machine.gpu_offload and needed <= machine.accelerator_free:
        return ON_THE_GPU
    if needed <= machine.memory_free:
        return PARTLY_ON_THE_GPU if machine.gpu_offload and machine.accelerator_free else IN_RAM
    return TOO_BIG
