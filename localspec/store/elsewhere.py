"""Models other apps downloaded, each read in place as a model made FROM its file: Ollama's, Jan's and GPT4All's,
named as those apps name them. (LM Studio's and the Hugging Face cache's files are found by their Hub names
instead: download.py.)"""

from collections.abc import Iterable, Iterator
from pathlib import Path

from . import gpt4all_models, jan_models, ollama_models
from .modelfile import Preset

APPS = (ollama_models, jan_models, gpt4all_models)  # who is asked first, where two apps have a name


def find(name: str | None) -> Preset | None:
    """The model of another app's a name means (an app's prefix, ollama:, jan:, gpt4all:, asks that app alone)."""
    if not name:
        return None
    for app in APPS:
        if name.startswith(app.PREFIX):
            return app.find(name)
    return next(filter(None, (app.find(name) for app in APPS)), None)


def beside(own: list[Preset]) -> list[Preset]:
    """Models made here, then the other apps' that no model listed before hides by name."""
    listed = {preset.name: preset for preset in own}
    for app in APPS:
        for preset in app.every():
            listed.setdefault(preset.name, preset)
    return own + [preset for preset in listed.values() if preset.keeper is not None]


def holding(file: str, size: int | None, repos: Iterable[str] = ()) -> Iterator[Preset]:
    """Jan's and GPT4All's models that are the Hub file so named (at that size, where one is given: is_file); Jan's
    named by the file or, as its command line downloads one, by its repo."""
    stem, jans = file.removesuffix(".gguf"), jan_models.data_folder()
    named = [gpt4all_models.find(gpt4all_models.PREFIX + file)]
    named += [jan_models.find_in(jans, model_id) for model_id in dict.fromkeys([stem, _dotless(stem), *repos])]
    return (preset for preset in named if preset is not None and is_file(preset, file, size))


def is_file(preset: Preset, file: str, size: int | None) -> bool:
    """Whether Jan's or GPT4All's model is the Hub file so named (at that size, where one is given): GPT4All keeps a
    file under its Hub name; Jan keeps one it downloads as model.gguf under an ID that is that name (its dots made _
    by some versions), and one its command line downloads under the file's own name."""
    if preset.keeper not in (jan_models.KEEPER, gpt4all_models.KEEPER):
        return False
    path, stem = Path(preset.base), file.removesuffix(".gguf")
    named = path.name == file or preset.keeper == jan_models.KEEPER and (
        preset.name.rpartition("/")[2] in (stem, _dotless(stem)))
    try:
        return named and (size is None or path.stat().st_size == size)
    except OSError:
        return False


def _dotless(stem: str) -> str:
    return stem.replace(".", "_")


def removal(preset: Preset) -> str:
    """How the app that keeps a model deletes it."""
    return next(app.REMOVAL for app in APPS if app.KEEPER == preset.keeper).format(name=preset.name)
