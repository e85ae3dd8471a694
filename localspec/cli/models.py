"""The commands about models and this machine: pull, search, models, show, create, ps, stop, rm, check, doctor, version."""

import dataclasses
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from .. import __version__, running, tui
from ..config import DrafterKind
from ..errors import UsageError
from .app import app, command
from .options import DEFAULT_RUNTIME, OfflineOption, complete_draft, complete_loaded, complete_model, device_names

# Each command imports the store's rooms and the engine it uses as it starts (see generate.py)

@command(epilog="Examples:\n\n  localspec pull qwen3.6-27b\n\n  localspec pull qwen2.5-coder-1.5b --draft auto\n\n"
         "  localspec pull hf:Qwen/Qwen2.5-0.5B-Instruct-GGUF/qwen2.5-0.5b-instruct-q4_k_m.gguf")
def pull(
    name: Annotated[str, typer.Argument(help="A registry name, hf:owner/repo/file.gguf, owner/repo:QUANT or owner/repo (the file llama.cpp's -hf takes).", show_default=False, autocompletion=complete_model)],
    draft: Annotated[Optional[str], typer.Option("--draft", "-d", help="Also fetch this draft ('auto': the drafter published beside it, else the recommended draft model; 'mtp', 'dflash', 'eagle3', 'assistant': the drafter of that kind published beside it). Default: the drafter the registry names beside it, as llama.cpp's downloader fetches one.", show_default=False, autocompletion=complete_draft)] = None,
    no_draft: Annotated[bool, typer.Option("--no-draft", help="Fetch the model alone.")] = False,
    no_mmproj: Annotated[bool, typer.Option(
        "--no-mmproj", "--no-mmproj-auto", help="Not the multimodal projector a Hub repo holds beside a model named by"
        " repo (owner/repo:QUANT), which is fetched with it otherwise, as llama.cpp's downloader fetches it.")] = False,
):
    """Download a model (and a draft) into the models directory, resuming partial downloads."""
    from .. import store
    from ..store import download, registry

    models = store.known()
    target = registry.resolve(name, models)
    wanted = [target]
    if draft == DrafterKind.MTP:  # the MTP sidecar published beside it, where it has one
        wanted += filter(None, [registry.published_drafter(target, DrafterKind.MTP, models)])
    elif draft not in (None, DrafterKind.NGRAM):
        wanted.append(registry.resolve_draft(draft, target, models))
    elif draft is None and not no_draft:
        wanted += filter(None, [download.drafter_beside(target)])
    projector = None if no_mmproj else download.projector_beside(target)
    wanted += [registry.resolve(projector, models)] if projector else []
    for item in wanted:
        path = store.fetch(item, progress=tui.download_progress(), verify_sha256=True)
        print(path)
        if keeper := store.kept_by(item):
            print(f"note: read in place from {keeper}, nothing downloaded: {path}", file=sys.stderr)


@command(epilog="Examples:\n\n  localspec search qwen2.5-coder\n\n  localspec search gemma --limit 5 --json\n\n"
         "  localspec search Qwen/Qwen2.5-Coder-7B-Instruct-GGUF")
def search(
    words: Annotated[list[str], typer.Argument(help="Words a model's name holds (qwen coder), or a Hub repo"
                                               " (owner/repo) to list its GGUF files.", show_default=False)],
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=100, help="The most Hub repos to list.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line instead of a table.")] = False,
    offline: OfflineOption = False,
):
    """Find a model to pull: the registry's models whose names hold the words (with what drafts for them), then the
    Hugging Face Hub's GGUF repos whose names hold them, the most downloaded first.

    Given a Hub repo (owner/repo), its GGUF files instead: each quantization's size, whether it fits this machine
    (on the GPU, partly, in RAM, too big, with a 4096-token context), whether it is here (downloaded by localspec, LM
    Studio or into a Hugging Face cache) and the name `pull` takes for it, the one recommended marked (Q4_K_M where it
    fits, else the largest that fits). --offline: the registry's models alone, or the repo's files downloaded here.
    """
    from .. import store
    from ..store import registry

    text = " ".join(words)
    if registry.is_repo_name(text):
        quantizations = store.quantizations(text, offline)
        if as_json:
            for quantization in quantizations:
                print(json.dumps(dataclasses.asdict(quantization)))
        elif not quantizations:
            print(f"none of {text}'s GGUF model files is downloaded (--offline: the Hub was not asked)" if offline
                  else f"{text} holds no GGUF model file")
        else:
            tui.quantizations_table(text, quantizations)
        return
    found, note = store.search(text, limit, offline)
    if note:
        print(f"note: {note}", file=sys.stderr)
    if as_json:
        for model in found:
            print(json.dumps(dataclasses.asdict(model)))
    elif not found:
        print(f"no model's name holds {text!r}" + ("" if note else " in the registry or on the Hub"))
    else:
        tui.search_table(found)


def list_models(
    installed: Annotated[bool, typer.Option("--installed", help="Only the downloaded ones.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line instead of a table.")] = False,
):
    """List the models localspec knows by name: size, whether downloaded, what drafts for them.

    Once a model is downloaded, what its layers mean for speculation (a recurrent state, MTP layers).
    Names are never cut short: at a narrow width the last columns are left out instead.
    """
    from ..store import catalog

    rows = catalog.model_rows(installed_only=installed)
    if as_json:
        for row in rows:
            print(json.dumps(row))
    elif installed and not rows:
        print("no model is downloaded yet: `localspec pull NAME` fetches one (`localspec models` lists the names)")
    else:
        tui.models_table(rows)


command(name="get", hidden=True)(pull)  # LM Studio's `lms get`
command(name="models")(list_models)


def list_installed(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line instead of a table.")] = False,
):
    """List the downloaded models, as Ollama's `ls` does: localspec's, and those Ollama, LM Studio, Jan, GPT4All,
    llama.cpp or the Hugging Face cache downloaded, read where they lie (`localspec models` lists every name it
    knows)."""
    list_models(installed=True, as_json=as_json)


command(name="list", hidden=True)(list_installed)  # Ollama's names
command(name="ls", hidden=True)(list_installed)


@command(epilog="Examples:\n\n  localspec show qwen2.5-coder-1.5b\n\n  localspec show ./model.gguf --json\n\n"
         "  localspec show terse --modelfile")
def show(
    name: Annotated[str, typer.Argument(help="A registry name, a model made with create, a GGUF file or"
                                        " hf:owner/repo/file.gguf.", show_default=False,
                                        autocompletion=complete_model)],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    as_modelfile: Annotated[bool, typer.Option("--modelfile", help="Print its Modelfile (Ollama's).")] = False,
    parameters: Annotated[bool, typer.Option("--parameters", help="Print its PARAMETERs (Ollama's).")] = False,
    system: Annotated[bool, typer.Option("--system", help="Print its SYSTEM prompt (Ollama's).")] = False,
    license: Annotated[bool, typer.Option("--license", help="Print its licence (Ollama's).")] = False,
):
    """Show a model: architecture, parameters, context length, quantization, file, chat template, and what
    can draft for it (draft models, MTP layers, a recurrent state); for a model made with `create`, what it
    is made from and its settings too.

    Reads only what is on disk: a registry model that is not downloaded shows what the registry knows.
    """
    from .. import store
    from ..store import catalog

    made = store.made(name)
    if sum((as_json, as_modelfile, parameters, system, license)) > 1:
        raise UsageError("--json, --modelfile, --parameters, --system and --license each print one thing: give one")
    card = None if made else catalog.model_card(name)  # (a name that is no model: the error whatever is asked)
    if as_modelfile:
        print(made.modelfile() if made else f"FROM {name}\n", end="")
        return
    if parameters or system:  # (a model not made with create has neither: the file's template decides)
        lines = ([f"{key} {value}" for key, value in made.parameters] if parameters else [made.system or ""]) if made else []
        if any(lines):
            print("\n".join(lines))
        return
    card = card or catalog.model_card(name)
    if license:
        text = made.license if made and made.license is not None else card.info["license"]
        if text is None:  # (it printed "None")
            print(f"note: {name} names no licence (its Modelfile has no LICENSE, its file no general.license)",
                  file=sys.stderr)
        else:
            print(text)
        return
    if made:
        card = dataclasses.replace(card, info=card.info | {"name": made.name, "ollama_name": None, "made": {
            "from": made.base, "keeper": made.keeper, "kept": made.kept, "adapters": list(made.adapters),
            "projector": made.projector,
            "system": made.system,
            "parameters": [list(p) for p in made.parameters],
            "messages": [{"role": role, "content": text} for role, text in made.messages]}})
    if as_json:
        print(json.dumps(card.info))
    else:
        tui.model_card(card)


@command(epilog="Examples:\n\n  localspec tokenize qwen2.5-coder-1.5b 'Hello world'\n\n"
         "  localspec tokenize ./model.gguf --ids --no-special ' Hello'")
def tokenize(
    name: Annotated[str, typer.Argument(help="A registry model that is downloaded, a model made with create, or a"
                                        " GGUF file.", show_default=False,
                                        autocompletion=complete_model)],
    text: Annotated[str, typer.Argument(help="The text; - reads standard input.", show_default=False)],
    ids: Annotated[bool, typer.Option("--ids", help="Print the ids alone, as a list (llama-tokenize's --ids).")
                   ] = False,
    special: Annotated[bool, typer.Option(
        "--special/--no-special", help="Read control tokens' spellings as the tokens and put the model's start"
        " token first, as a raw prompt is read; --no-special reads plain text, as a logit bias's text is read.")
        ] = True,
):
    """Show how a model's tokenizer splits a text, a token a line (id, then the text it stands for), as
    llama.cpp's llama-tokenize does: the ids --logit-bias names. Reads the vocabulary alone."""
    from .. import loading
    from ..store import catalog

    tokens = loading.tokens_of(catalog.local_file(name), sys.stdin.read() if text == "-" else text, special)
    if ids:
        print(json.dumps([token for token, _ in tokens]))
        return
    for token, piece in tokens:
        print(f"{token:>8} -> {piece.decode('utf-8', errors='replace')!r}")


@command(epilog="Example, a Modelfile:\n\n  FROM qwen2.5-coder-1.5b\n\n  PARAMETER temperature 0.2\n\n"
         "  PARAMETER num_ctx 8192\n\n  SYSTEM You answer in one short paragraph.\n\n"
         "then: localspec create terse -f Modelfile; localspec run terse")
def create(
    name: Annotated[str, typer.Argument(help="The name to run it by.", show_default=False)],
    file: Annotated[Path, typer.Option("--file", "-f", help="The Modelfile (Ollama's).")] = Path("Modelfile"),
):
    """Make a model of your own from a Modelfile, as `ollama create` does: the model it is FROM (a registry
    name, a GGUF file, or another model made so) with a SYSTEM prompt, PARAMETER defaults (temperature, top_k,
    top_p, min_p, typical_p, mirostat, mirostat_tau, mirostat_eta, seed, repeat_penalty, repeat_last_n,
    presence_penalty, frequency_penalty, num_predict, stop, num_ctx, num_gpu) and MESSAGEs that open every
    conversation.

    run, chat, batch and serve then take its name: they load the model it is made from (nothing is
    copied) and ask as it says, what a command line or request sets standing over its parameters.
    `show NAME --modelfile` prints it back; `rm NAME` removes it again.
    """
    from .. import store

    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"no Modelfile at {file}: write one (FROM, PARAMETER, SYSTEM, MESSAGE) or name it with -f")
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"cannot read {file}: {error}") from None
    made, notes = store.create(name, text, file)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"created {made.name} from {made.base}: `localspec run {made.name}`")


@command(name="cp", epilog="Examples:\n\n  localspec cp terse terse-backup\n\n  localspec cp qwen2.5-coder-1.5b coder")
def copy(
    source: Annotated[str, typer.Argument(help="A model made with create, a registry name or a GGUF file.",
                                          show_default=False, autocompletion=complete_model)],
    destination: Annotated[str, typer.Argument(help="The name to run the copy by.", show_default=False)],
):
    """Copy a model under another name, as `ollama cp` does: a model made with create with all its settings, or
    a registry model or GGUF file as it is. Nothing is copied on disk: the new name is a model made from the
    same file, to change with create or remove with rm."""
    from .. import store

    made = store.copy(source, destination)
    print(f"copied {source} to {made.name}: `localspec run {made.name}`")


@command()
def ps(as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line instead of a table.")] = False):
    """List the localspec processes that hold models now (run, chat, batch, bench, serve, worker), and under
    each serve the models it loaded on demand, with when each goes (as `ollama ps`)."""
    from .. import remote

    found = remote.with_loaded(running.processes())
    if as_json:
        for process in found:
            print(json.dumps(process))
    else:
        tui.ps_table(found)


@command(epilog="Example:\n\n  localspec stop qwen2.5-coder:0.5b")
def stop(name: Annotated[str, typer.Argument(help="The model, as `localspec ps` or a request names it.",
                                             show_default=False, autocompletion=complete_loaded)]):
    """Unload a model that a running `localspec serve` loaded on demand, as `ollama stop` does (the model a
    serve started with stays while that serve runs; run, chat and batch let theirs go when they end)."""
    from .. import remote

    print(remote.stop(name))


command(name="unload", hidden=True)(stop)  # LM Studio's `lms unload`


@command(epilog="Example:\n\n  localspec serve qwen2.5-coder-1.5b &\n  localspec load qwen2.5-coder-0.5b --ttl 3600")
def load(name: Annotated[str, typer.Argument(help="A downloaded model, as `localspec list` names it.",
                                             show_default=False, autocompletion=complete_model)],
         ttl: Annotated[Optional[float], typer.Option(
             "--ttl", help="Seconds it stays loaded once idle (-1: while serve runs). Default: serve's --keep-alive.",
             show_default=False)] = None):
    """Load a downloaded model into the `localspec serve` running on this machine, as LM Studio's `lms load` does:
    its first request then finds it loaded (`localspec stop` unloads it)."""
    from .. import remote

    if ttl is not None and ttl < 0 and ttl != -1:
        raise UsageError(f"--ttl is a number of seconds, or -1 for as long as serve runs, not {ttl:g}")
    print(remote.load(name, ttl))


@command(name="rm")
def remove(name: Annotated[str, typer.Argument(help="A registry name, hf:owner/repo/file.gguf or owner/repo[:QUANT] (the"
                                               " file of it downloaded).", show_default=False,
                                               autocompletion=complete_model)]):
    """Delete a downloaded model (partial downloads too), or a model made with create (not the one it is made
    from). Another app's download is left to that app: the error says how it deletes it."""
    from .. import store

    if made := store.made(name):
        store.forget(made.name)
        print(f"removed {made.name} (made from {made.base}, which stays)")
        return
    entry = store.find(name)
    if isinstance(entry, store.RepoQuant):
        entry = store.quant_here(entry) or entry
    if isinstance(entry, store.RepoQuant):
        raise UsageError(f"no file of the Hub repo {name} is downloaded")
    if not isinstance(entry, store.ModelEntry):
        raise UsageError(f"{name} is not a downloaded model (local files are yours to delete)")
    freed = store.remove(entry)
    if not freed:
        raise UsageError(f"{entry.name} is not downloaded")
    print(f"removed {entry.name} ({tui.size_text(freed)})")
    made_from = [made.name for made in store.every_made() if _means(made.base, entry)]
    if made_from:  # (Ollama keeps a layer its models share; here each of them fetches the file again at its next run)
        print(f"note: {', '.join(made_from)} {'are' if len(made_from) > 1 else 'is'} made from it with create and"
              f" fetch{'' if len(made_from) > 1 else 'es'} it again at the next run (`localspec pull {entry.name}`"
              " now)", file=sys.stderr)


def _means(name: str, entry) -> bool:
    """Whether a name means this registry model (or Hub file)."""
    from .. import store

    try:
        return store.find(name) == entry
    except UsageError:  # (a name no longer known: `show` says so)
        return False


@command()
def check(
    target: Annotated[str, typer.Argument(help="Target model (name, file, hf:...).", show_default=False,
                                          autocompletion=complete_model)],
    draft: Annotated[str, typer.Argument(help="Draft model (name, size in the target's family, file, hf:...), or mtp:"
                                         " whether the target has MTP layers to draft with.", show_default=False,
                                         autocompletion=complete_draft)],
    offline: OfflineOption = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
):
    """Check how a draft can speculate for a target; exit 1 if it cannot.

    A draft of the target's vocabulary (llama.cpp's tokenizer rules) hands
    its tokens to the target as they are; a draft model of another vocabulary
    drafts through text (greedy) or the tokens both vocabularies spell alike
    (sampling), with lower acceptance: the report says what share of its
    vocabulary that is."""
    from .. import loading, store

    if draft == DrafterKind.NGRAM:
        raise UsageError("n-gram drafting works with every target; name a draft model to check")
    if draft == DrafterKind.MTP:
        _check_mtp(target, offline, as_json)
        return
    pair = store.pair(target, draft, offline, tui.download_progress(), verify_sha256=True)
    report = pair.report
    shared = loading.shared_vocabulary(report.target.path, report.draft.path) if report.across else None
    if as_json:
        print(json.dumps({"target": report.target.path.name, "draft": report.draft.path.name,
                          "compatible": report.compatible,
                          "vocabulary": "same" if report.same_vocabulary else "through text" if report.across
                          else "differs",
                          **({"single_token_share": round(shared, 4)} if shared is not None else {}),
                          "rules": [{"name": r.name, "passed": r.passed, "detail": r.detail} for r in report.rules]}))
    else:
        tui.compat_report(report, shared)
    if not report.compatible:
        print(pair.advice, file=sys.stderr)
        raise typer.Exit(1)


def _check_mtp(target: str, offline: bool, as_json: bool) -> None:
    """Whether the target has multi-token-prediction layers to draft for itself with; exit 1 if not."""
    from .. import store

    info = store.pair(target, None, offline, tui.download_progress(), verify_sha256=True).target
    if as_json:
        print(json.dumps({"target": info.path.name, "draft": "mtp", "compatible": info.mtp_layers > 0,
                          "mtp_layers": info.mtp_layers}))
    elif info.mtp_layers:
        print(f"{info.path.name} has {info.mtp_layers} multi-token-prediction layer(s): --draft mtp drafts with them")
    else:
        print(f"{info.path.name} has no multi-token-prediction layers: --draft mtp cannot draft for it",
              file=sys.stderr)
    if not info.mtp_layers:
        raise typer.Exit(1)


@command()
def doctor(
    ctx_size: Annotated[int, typer.Option("--ctx-size", "-c", help="Context length to size the KV cache for.")]
    = DEFAULT_RUNTIME.ctx_size,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
    rpc: Annotated[Optional[str], typer.Option(
        "--rpc", help="Also list the devices of these `localspec worker`s (HOST:PORT,...) and count their memory.",
        show_default=False)] = None,
):
    """Show the llama.cpp backend, devices, memory and CPU features, and which registry pairs fit here."""
    from ..store import catalog, hardware

    machine, rows = catalog.doctor(device_names(rpc) or (), ctx_size)
    if as_json:
        print(json.dumps({"machine": dataclasses.asdict(machine), "ctx_size": ctx_size, "pairs": rows}))
    else:
        tui.doctor_report(machine, rows, ctx_size, None if machine.gpu_offload else hardware.REBUILD_HINT)


@command()
def version():
    """Print the localspec version."""
    print(__version__)


def _command_names(context: typer.Context, incomplete: str) -> list[str]:
    commands = context.find_root().command
    return [name for name in commands.list_commands(context)
            if name.startswith(incomplete) and not commands.get_command(context, name).hidden]


@command(name="help", hidden=True)
def help_(command: Annotated[Optional[list[str]], typer.Argument(show_default=False,
                                                                  autocompletion=_command_names)] = None):
    """Show a command's help, as `ollama help run` does (alone: every command)."""
    app(args=[*(command or ()), "--help"], prog_name="localspec", standalone_mode=False)
