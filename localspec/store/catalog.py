"""What localspec knows of its models, from the registry and the files on disk: the reports of
`localspec models`, `show` and `doctor`, built here for the command line to render."""

from dataclasses import dataclass
from pathlib import Path

from . import download, elsewhere, gguf_meta, hardware, headers, modelfile, placement, registry
from ..config import DrafterKind, Runtime, Speculation
from ..engine.drafters.spec import PUBLISHED_DRAFTERS, SPEC, plan_drafting
from ..errors import InputError, UsageError

Known = tuple[gguf_meta.GGUFInfo | None, int | None]  # a model's header once downloaded, its size in the registry


def header_and_size(entry: registry.ModelEntry) -> Known:
    present = download.installed(entry)
    return _listed_header(present), entry.size


def _listed_header(path: Path | None) -> gguf_meta.GGUFInfo | None:
    """A file's header for a list of models; None where no file is there, or one that does not read (another app's
    partial or broken download: listed as not installed, where `show` and `run` say what is wrong with it)."""
    try:
        return headers.read(path) if path is not None and path.is_file() else None
    except gguf_meta.GGUFError:
        return None


def license_text(entry: registry.ModelEntry) -> str:
    return entry.license + (" (gated)" if entry.gated else "")


def model_rows(installed_only: bool = False) -> list[dict]:
    """`localspec models`: what the registry says of each model and, once it is downloaded, what its
    layers mean for speculation."""
    models = registry.load()
    rows = [_row(entry, models) for entry in models.values() if not entry.drafts]  # (a drafter: with its model)
    rows += [_file_row(path) | dict(name=entry.command_name, kept_by=keeper)  # (pulled by its repo's name, here or
             for entry in download.hub_models() for path, keeper in [_located(entry)]]  # by another app)
    for made in elsewhere.beside(modelfile.every()):  # models made with `create` (Ollama's...), as their base is
        try:
            base = registry.resolve(made.base, models)
        except UsageError:  # (what it is made from is no longer a model here: `show` says so)
            continue
        row = _row(base, models) if isinstance(base, registry.ModelEntry) else _file_row(base)
        rows.append(row | dict(name=made.name, aliases=[], made_from=made.base, adapters=list(made.adapters),
                               projector=made.projector, keeper=made.keeper, kept=made.kept,
                               license=made.license if made.license is not None else row["license"]))
    return [row for row in rows if row["installed"] or not installed_only]


def _located(entry: registry.ModelEntry) -> tuple[Path | None, str | None]:
    """An entry's file where it is installed, and the app whose download that is (None: localspec's own)."""
    path, copy = download.located(entry) or (None, None)
    return path, copy.keeper if copy else None


def _row(entry: registry.ModelEntry, models: dict) -> dict:
    path, keeper = _located(entry)
    header = _listed_header(path)
    drafters = registry.drafters_of(entry, models)
    return dict(name=entry.name, aliases=list(entry.aliases), family=entry.family, params=entry.params,
                size=entry.size, installed=header is not None, draft=entry.draft,
                drafters={d.drafts: d.name for d in drafters}, unverified=entry.unverified,
                unverified_drafters=[d.name for d in drafters if d.unverified],
                license=license_text(entry), kept_by=keeper, **_drafting_fields(header))


def _file_row(path: Path) -> dict:
    header = _listed_header(path)
    return dict(name=path.name, aliases=[], family="", params=header.parameter_size if header else "",
                size=path.stat().st_size if header else None, installed=header is not None, draft=None, drafters={},
                unverified=False, unverified_drafters=[], license="", **_drafting_fields(header))


def _drafting_fields(header: gguf_meta.GGUFInfo | None) -> dict:
    """What a downloaded file's header says of how it can be drafted for (None where it is not here)."""
    return dict(recurrent=header and header.recurrent, rolls_back=header and header.rolls_back,
                mtp_layers=header and header.mtp_layers)


@dataclass(frozen=True)
class ModelCard:
    """`localspec show`: info is what --json prints; the rest is what the text adds to it in words."""

    info: dict
    parameters: str | None  # the file's size label (1.5B), else its count, else the registry's
    pull_name: str | None  # the name to pull it by, for a registry model not downloaded yet
    drafts: str  # what can draft for it, in the words of --draft


def model_card(name: str) -> ModelCard:
    """Reads only what is on disk: a registry model that is not downloaded shows what the registry knows."""
    models = registry.load()
    entry, path = _on_disk(name, models)
    header = headers.read(path) if path else None
    info = {
        "name": entry.name if entry else path.name,
        "ollama_name": entry.ollama_name if entry and not entry.typed else None,  # the same model, as Ollama names it
        "architecture": header.architecture if header else None,
        "parameters": header.parameters if header else None,
        "context_length": header.context_length if header else None,
        "quantization": header.quantization if header else None,
        "file": str(path) if path else None,
        "kept_by": download.kept_by(entry) if entry else None,  # another app's download, read in place
        "size": header.file_size if header else entry.size,
        "chat_template": header.chat_template is not None if header else None,
        "tokenizer": header.vocab_type if header else None,
        "vocab_size": header.vocab_size if header else None,
        "draft": entry.draft if entry else None,
        # a draft model of another vocabulary measured to help it, and how
        "across": {"draft": entry.across.draft, "measured": entry.across.measured} if entry and entry.across else None,
        "drafts": [d.name for d in registry.compatible_drafts(entry, models)] if entry else [],
        # the drafters published beside it that localspec runs, by the kind --draft asks for them by
        "drafters": {d.drafts: d.file for d in registry.drafters_of(entry, models) if d.drafts in PUBLISHED_DRAFTERS}
                    if entry else {},
        "mtp_layers": header.mtp_layers if header else None,
        "recurrent": header.recurrent if header else None,
        "rolls_back": header.rolls_back if header else None,
        "auto": _auto_drafts(header) if header else None,
        # how its replies think (reasoning.py's family), None where its template shows no thinking
        "thinking": _thinking(header.chat_template) if header else None,
        "capabilities": capabilities(header) if header else None,
        "license": license_text(entry) if entry else None,
        # a file applied to a model, not one (a LoRA adapter, a control vector): what it is, for which models, how
        "applied": dict(zip(("is", "for", "option"), header.applied_to_a_model))
                   if header and header.applied_to_a_model else None,
    }
    parameters = header.parameter_size if header else entry.params or None
    return ModelCard(info, parameters, entry.command_name if entry and not path else None,
                     _drafts_text(info, is_registered=entry is not None))


def _on_disk(name: str, models: dict) -> tuple["registry.ModelEntry | None", Path | None]:
    """The registry entry a name stands for (None for a file) and its file where it is on this machine."""
    resolved = registry.resolve(name, models)
    if isinstance(resolved, registry.RepoQuant):  # (the file of it downloaded, as run finds it offline)
        resolved = download.quant_here(resolved) or resolved
    if isinstance(resolved, registry.RepoQuant):
        raise UsageError(f"{name}: which file that is takes the Hub to find; `localspec pull {name}` fetches it")
    entry = resolved if isinstance(resolved, registry.ModelEntry) else None
    return entry, download.locate(resolved) if entry is None else download.installed(entry)


def local_file(name: str) -> Path:
    """The GGUF file a name stands for on this machine, without fetching it (UsageError where it is not here)."""
    entry, path = _on_disk(name, registry.load())
    if path is None:
        raise UsageError(f"{name} is not downloaded: `localspec pull {entry.command_name if entry else name}`")
    return path


def capabilities(header: gguf_meta.GGUFInfo, template: str | None = None) -> list[str]:
    """What a model can be asked for, in Ollama's words: completion, tools (its chat template for tools, else its
    own, or the one given in its place, presents them in a form localspec reads back), insert (it fills in the middle: a
    request's suffix), thinking (a reasoning model); an encoder only embeds; a reranker has no word of Ollama's (it
    only ranks)."""
    from .. import reasoning  # (a template's readers: imported where a card asks, not by every listing)
    from ..tool_calls import tool_format

    if not header.generates:
        return [] if header.ranks else ["embedding"]
    # (a template given in place of the file's own stands for its tool_use one too, as in Prompts)
    tool_use = header.tool_use_template if template in (None, header.chat_template) else None
    template = template or header.chat_template
    found = ["completion"]
    try:
        tool_format(tool_use or template)
        found.append("tools")
    except InputError:
        pass
    if header.fills_in_the_middle:
        found.append("insert")
    if reasoning.family(template) is not reasoning.NONE:
        found.append("thinking")
    return found


def _thinking(template: str | None) -> str | None:
    from .. import reasoning

    found = reasoning.family(template)
    return None if found is reasoning.NONE else found.name


def _auto_drafts(header: gguf_meta.GGUFInfo) -> list[str]:
    """What a session of this file drafts with when no --draft is given: the plan's, by their names."""
    if header.recurrent and not header.rolls_back:
        return []
    plan = plan_drafting(Speculation(), header)
    return [SPEC["ngram"].label, SPEC["suffix"].label, *(spec.describe(header.path.name) for spec in plan.costly)]


def _drafts_text(info: dict, is_registered: bool) -> str:
    if info["capabilities"] is not None and "completion" not in info["capabilities"]:
        return ("none: it embeds text (serve's /v1/embeddings) and does not generate" if info["capabilities"] else
                "none: it is a reranker, it scores documents against a query (serve's /v1/rerank) and does not generate")
    if info["recurrent"] and not info["rolls_back"]:
        return "none: its recurrent state cannot take rejected draft tokens back (it decodes plainly)"
    across = info["across"]
    # registry.auto_drafter's choice
    auto = next(iter(info["drafters"].values()), None) or info["draft"] or (across["draft"] if across else None)
    ways = [f"--draft auto ({auto})"] if auto else []
    ways += [f"--draft {kind} ({file})" for kind, file in info["drafters"].items()]
    ways += [f"--draft {name}" for name in info["drafts"] if name != auto]
    if across:
        ways.append(f"--draft {across['draft']} (through text: {across['measured']})")
    if info["mtp_layers"]:
        ways.append(f"--draft mtp ({info['mtp_layers']} MTP layer{'s' if info['mtp_layers'] > 1 else ''})")
    ways.append("--draft ngram")
    text = ", ".join(ways)
    if info["auto"]:
        *others, last = info["auto"]
        text += f"; without --draft, {DrafterKind.AUTO} drafts with {', '.join(others)} and {last}"
    if not is_registered:
        text += "; or any draft model file (`localspec check` says how it drafts for it)"
    return text


def doctor(rpc: tuple[str, ...], ctx_size: int) -> tuple[hardware.Machine, list[dict]]:
    """This machine (and its --rpc workers), and a row for each registry pair: whether it fits at
    ctx_size and where its layers go, as run places them by default."""
    runtime = Runtime(rpc=rpc)
    machine = hardware.machine(rpc)
    models = registry.load()
    rows = [placement.pair_row(entry.name, entry.draft, header_and_size(entry), header_and_size(models[entry.draft]),
                               runtime, machine, ctx_size)
            for entry in models.values() if entry.draft in models]
    return machine, rows
