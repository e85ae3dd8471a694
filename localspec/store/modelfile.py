"""Models of one's own, made from another as `ollama create` makes them from a Modelfile: the model it is
FROM (a second FROM: its multimodal projector), the LoRA ADAPTERs applied to it, a SYSTEM prompt, PARAMETER
defaults, MESSAGEs that open every conversation, a LICENSE. `localspec create NAME -f Modelfile` keeps each as a Modelfile of its own (FROM resolved, instructions in one order) in
the presets folder; run, chat and serve load the model it is from and ask as it says, a request's own
settings over its parameters."""

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import platformdirs

from .. import paths
from ..config import Limits, Sampling, overridden
from ..errors import UsageError

# Ollama's parameter names, as localspec's settings take them (what overridden() reads, and num_ctx)
PARAMETERS = {"temperature": float, "top_k": int, "top_p": float, "min_p": float, "typical_p": float, "mirostat": int,
              "mirostat_tau": float, "mirostat_eta": float, "seed": int,
              "repeat_penalty": float, "repeat_last_n": int, "presence_penalty": float, "frequency_penalty": float,
              "num_predict": int, "stop": str, "num_ctx": int, "num_gpu": int}
# Ollama's parameters that set up the model as it loads, with the option that sets each here (what a chat's
# /set parameter points to: fixed once loaded); a Modelfile's LOADING ones are applied as its model loads
LOAD_OPTIONS = {"num_ctx": "-c", "num_gpu": "-ngl", "num_thread": "-t", "num_batch": "-b", "main_gpu": "-mg"}
LOADING = ("num_ctx", "num_gpu")
# Ollama's options that change the output, with the values that leave it as localspec makes it (others are
# refused), and those that set up the model, fixed when it loads (serve's command line says them; taken and
# ignored)
NEUTRAL_OPTIONS = {"tfs_z": (1, 1.0), "penalize_newline": (False, True)}
TAKEN_AND_IGNORED = {*LOAD_OPTIONS, "use_mmap", "use_mlock", "numa", "low_vram", "f16_kv", "vocab_only", "num_keep"}
ROLES = ("system", "user", "assistant")
IGNORED = {  # instructions a Modelfile may hold that change nothing here, and why
    "template": "localspec renders conversations with the chat template inside the GGUF file, as llama.cpp"
                " does, not with Ollama's Go templates",
    "requires": "the Ollama version a Modelfile was written for",
}
INSTRUCTIONS = ("from", "parameter", "system", "message", "license", *IGNORED, "adapter")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}$")


@dataclass(frozen=True)
class Preset:
    """A model of one's own: base is a registry name, an hf: name or a GGUF file's absolute path."""

    name: str
    base: str
    system: str | None = None
    parameters: tuple[tuple[str, int | float | str], ...] = ()  # Ollama's names, in order; stop may repeat
    messages: tuple[tuple[str, str], ...] = ()  # (role, content)
    license: str | None = None
    adapters: tuple[str, ...] = ()  # LoRA adapters' GGUF files (absolute paths once made), applied at scale 1
    projector: str | None = None  # its multimodal projector's GGUF (a second FROM, as Ollama's llava Modelfiles)
    # where another app keeps it, read in place (an Ollama model's manifest, a Jan model's YAML, a GPT4All model's
    # file): never written or removed here; keeper: that app
    kept: str | None = None
    keeper: str | None = None

    def loading(self) -> dict[str, int]:
        """Its parameters that set up the model as it loads, by Ollama's names (num_ctx, num_gpu)."""
        return {name: value for name, value in self.parameters if name in LOADING}

    def under(self, newer: "Preset") -> "Preset":
        """newer, made FROM this one: its settings over this one's (a parameter it sets replaces every value
        of that name here; its MESSAGEs replace these)."""
        kept = tuple((name, value) for name, value in self.parameters
                     if name not in {name for name, _ in newer.parameters})
        return Preset(newer.name, self.base, self.system if newer.system is None else newer.system,
                      kept + newer.parameters, newer.messages or self.messages,
                      self.license if newer.license is None else newer.license, self.adapters + newer.adapters,
                      newer.projector or self.projector)

    def asked(self) -> dict:
        """Its parameters as overridden() takes them."""
        asked: dict = {}
        for name, value in self.parameters:
            if name == "stop":
                asked.setdefault("stop", []).append(value)
            elif name == "num_predict":
                asked["max_tokens"] = value if value > 0 else None
            elif name not in LOADING:
                asked[name] = value
        return asked

    def settings(self, sampling: Sampling, limits: Limits) -> tuple[Sampling, Limits]:
        """Sampling and limits with its parameters over them: what a request for it runs under, before the
        request's own settings."""
        sampling, limits = overridden(sampling, limits, **self.asked())
        if any(name == "num_predict" and value < 0 for name, value in self.parameters):
            limits = replace(limits, max_tokens=None)
        return sampling, limits

    def conversation(self, messages: Sequence[dict], continued: bool = False) -> list[dict]:
        """A conversation as asked for it: its MESSAGEs first, its SYSTEM prompt where the conversation
        brings none of its own (as Ollama does). continued: it goes on from an earlier exchange's tokens
        (Ollama's context), which began with the MESSAGEs already."""
        opening = [] if continued else [{"role": role, "content": content} for role, content in self.messages]
        own = list(messages[:1]) if messages and messages[0]["role"] == "system" else []
        system = own or ([{"role": "system", "content": self.system}] if self.system else [])
        return system + opening + list(messages[len(own):])

    def modelfile(self) -> str:
        """As `show --modelfile` prints it, and as it is kept."""
        lines = [f"FROM {self.base}"] + ([f"FROM {self.projector}"] if self.projector else [])
        lines += [f"ADAPTER {adapter}" for adapter in self.adapters]
        lines += [f"PARAMETER {name} {_quoted(value) if name == 'stop' else value}" for name, value in self.parameters]
        if self.system is not None:
            lines.append(f"SYSTEM {_quoted(self.system)}")
        lines += [f"MESSAGE {role} {_quoted(content)}" for role, content in self.messages]
        if self.license is not None:
            lines.append(f"LICENSE {_quoted(self.license)}")
        return "\n".join(lines) + "\n"


def _quoted(text: str) -> str:
    """A value as a Modelfile holds it: as it is where it reads back so, else in triple quotes."""
    if text and "\n" not in text and text == text.strip() and not text.startswith('"'):
        return text
    if '"""' in text:
        raise UsageError('a Modelfile value cannot hold three double quotes in a row (""")')
    # a value over several lines starts and ends on a line of its own, so that the newlines framing it in the
    # Modelfile are told apart from its own (a stop of two newlines)
    return f'"""\n{text}\n"""' if "\n" in text else f'"""{text}"""'


def parse(text: str, name: str, where: Path | None = None, notes: list[str] | None = None) -> Preset:
    """A Modelfile's instructions as a Preset named name (FROM as written: see create); UsageError naming
    the line where one cannot be read. where: the Modelfile's path, for messages; notes: told what was
    read and left alone."""
    source = str(where) if where else "the Modelfile"
    text = text.removeprefix("\ufeff")  # (the byte-order mark Windows' Notepad writes first)
    notes = [] if notes is None else notes
    base = system = license = projector = None
    parameters: list[tuple[str, int | float | str]] = []
    messages: list[tuple[str, str]] = []
    adapters: list[str] = []
    for number, instruction, argument in _instructions(text, source):
        def mistake(problem: str) -> UsageError:
            return UsageError(f"{source}, line {number}: {problem}")

        if instruction == "adapter":
            adapters.append(_value(argument))
        elif instruction in IGNORED:
            notes.append(f"line {number}: {instruction.upper()} left alone: {IGNORED[instruction]}")
        elif instruction == "from":  # (a second: the model's projector, as Ollama takes a llava's)
            if projector is not None:
                raise mistake("a third FROM: a model is made from one model and its multimodal projector")
            if base is None:
                base = _value(argument)
            else:
                projector = _value(argument)
        elif instruction == "parameter":
            key, value = _split(argument, mistake, "PARAMETER needs a name and a value")
            parameters += _parameters(key.lower(), [_value(value)], mistake, notes, "PARAMETER ", f"line {number}: ")
        elif instruction == "message":
            role, content = _split(argument, mistake, "MESSAGE needs a role and its text")
            if role.lower() not in ROLES:
                raise mistake(f"MESSAGE {role}: the role is one of {', '.join(ROLES)}")
            messages.append((role.lower(), _value(content)))
        elif instruction == "system":
            system = _value(argument)
        elif instruction == "license":
            license = _value(argument)
    if not base:
        raise UsageError(f"{source} has no FROM: name the model it is made from (`FROM qwen2.5-coder-1.5b`, or a"
                         " GGUF file's path)")
    return Preset(name, base, system, tuple(parameters), tuple(messages), license, tuple(adapters), projector)


def requested(name: str, base: str, system: str | None = None, parameters: dict | None = None,
              messages: Sequence[dict] = (), license: str | Sequence[str] | None = None,
              notes: list[str] | None = None, adapters: Sequence[str] = (), projector: str | None = None) -> Preset:
    """A Preset from what Ollama's /api/create asks field by field (what a Modelfile's FROM, ADAPTER, SYSTEM,
    PARAMETER, MESSAGE and LICENSE would say): parameters by Ollama's names, a list where one has several values
    (stop); UsageError naming the field that cannot be taken; notes: told what was read and left alone."""
    notes = [] if notes is None else notes
    kept: list[tuple[str, int | float | str]] = []
    for key, value in (parameters or {}).items():
        values = value if isinstance(value, list) else [value]
        texts = [str(v).lower() if isinstance(v, bool) else str(v) for v in values]
        kept += _parameters(key.lower(), texts, UsageError, notes, "parameters.")
    opening = []
    for index, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if role not in ROLES or not isinstance(content, str):
            raise UsageError(f"messages[{index}]: a role ({', '.join(ROLES)}) and its content, as text")
        opening.append((role, content))
    if not isinstance(license, str) and license is not None:
        license = "\n\n".join(license)
    return Preset(name, base, system, tuple(kept), tuple(opening), license, tuple(adapters), projector)


def parameters_of(sampling: Sampling, limits: Limits, also: Sequence[str] = ()) -> dict:
    """Sampling and limits as a Modelfile's PARAMETERs say them (chat's /save MODEL): those that differ from
    localspec's defaults, and those named in also (a base's own, which the new model's must replace)."""
    sampled = {name: getattr(sampling, name) for name in PARAMETERS if hasattr(Sampling, name)}
    sampled |= {"num_predict": limits.max_tokens or -1, "stop": list(limits.stop)}
    default = {name: getattr(Sampling(), name) for name in sampled if hasattr(Sampling, name)}
    default |= {"num_predict": Limits().max_tokens or -1, "stop": list(Limits().stop)}
    return {name: value for name, value in sampled.items()
            if value is not None and (value != default[name] or name in also)}


def _instructions(text: str, source: str):
    """(line number, instruction, its argument) for each instruction; a triple-quoted argument may run over
    several lines."""
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        number, line = index + 1, lines[index].strip()
        index += 1
        if not line or line.startswith("#"):
            continue
        instruction, argument = (line.split(maxsplit=1) + [""])[:2]  # (spaces or tabs after it, as Ollama takes)
        instruction = instruction.lower()
        if instruction not in INSTRUCTIONS:
            raise UsageError(f"{source}, line {number}: {instruction.upper()!r} is not a Modelfile instruction"
                             f" ({', '.join(i.upper() for i in INSTRUCTIONS)})")
        if not argument:
            raise UsageError(f"{source}, line {number}: {instruction.upper()} needs a value")
        opened = argument.find('"""')
        while opened >= 0 and argument.find('"""', opened + 3) < 0:  # it goes on below
            if index == len(lines):
                raise UsageError(f'{source}, line {number}: the """ opened here is never closed')
            argument += "\n" + lines[index]
            index += 1
        yield number, instruction, argument


def _split(argument: str, mistake, problem: str) -> tuple[str, str]:
    parts = argument.split(maxsplit=1)
    if len(parts) < 2:
        raise mistake(problem)
    return parts[0], parts[1].strip()


def _value(argument: str) -> str:
    """An argument's text: inside its triple or double quotes where it has them."""
    argument = argument.strip()
    if argument.startswith('"""') and argument.endswith('"""') and len(argument) >= 6:
        return argument[3:-3].removeprefix("\n").removesuffix("\n") if "\n" in argument else argument[3:-3]
    if len(argument) >= 2 and argument.startswith('"') and argument.endswith('"'):
        return argument[1:-1].replace('\\"', '"')
    return argument


def _parameters(name: str, texts: list[str], mistake, notes: list[str], label: str,
                where: str = "") -> list[tuple[str, int | float | str]]:
    """A parameter's values as kept (stop may have several); none where it is read and left alone, which
    notes then say. label: how the parameter is named where it was read ("PARAMETER ", "parameters."); where:
    the line it was read on, for notes."""
    if name in NEUTRAL_OPTIONS:
        refused = [text for text in texts if text.lower() not in {str(v).lower() for v in NEUTRAL_OPTIONS[name]}]
        if refused:
            raise mistake(f"{label}{name} {refused[0]}: not supported by localspec (only {NEUTRAL_OPTIONS[name][0]})")
    if name in TAKEN_AND_IGNORED - set(LOADING) or name in NEUTRAL_OPTIONS:
        notes.append(f"{where}{label}{name} left alone: localspec's own settings decide it")
        return []
    if len(texts) > 1 and name != "stop":
        raise mistake(f"{label}{name}: one value (stop alone may have several)")
    return [(name, _parameter(name, text, mistake, label)) for text in texts]


def _parameter(name: str, text: str, mistake, label: str) -> int | float | str:
    if name not in PARAMETERS:
        raise mistake(f"{label}{name}: not a parameter localspec takes ({', '.join(PARAMETERS)})")
    kind = PARAMETERS[name]
    try:
        value = kind(text)
    except ValueError:
        raise mistake(f"{label}{name}: {'a whole number' if kind is int else 'a number'}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise mistake(f"{label}{name}: a number, got {text!r}")
    if name == "num_ctx" and value < 1:
        raise mistake(f"{label}num_ctx: a count of tokens, got {value}")
    return value


# --- Kept by name

def folder() -> Path:
    """Where the models made with `create` are kept (beside the user's models.toml)."""
    root = paths.home()
    return (root if root is not None else Path(platformdirs.user_config_dir("localspec"))) / "presets"


def checked_name(name: str) -> str:
    if not NAME.match(name):
        shown = name if len(name) <= 60 else name[:57] + "..."
        raise UsageError(f"{shown!r} cannot name a model: use letters, digits, '.', '_', '+' and '-' (200 at most),"
                         " starting with a letter or digit")
    return name


def find(name: str | None) -> Preset | None:
    """The model made under this name, if one was (Ollama's `:latest` taken off)."""
    if not name or not NAME.match(name.removesuffix(":latest")):
        return None
    path = folder() / f"{name.removesuffix(':latest')}.Modelfile"
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"cannot read {path}: {error}") from None
    return parse(text, name.removesuffix(":latest"), path)


def every() -> list[Preset]:
    """Every model made with `create`, by name; one whose kept Modelfile no longer reads (an edit by hand)
    is left out here, and named with what is wrong where it is asked for by name."""
    made = []
    for path in sorted(folder().glob("*.Modelfile")) if folder().is_dir() else ():
        try:
            made += filter(None, [find(path.stem)])
        except UsageError:
            continue
    return made


def keep(preset: Preset) -> Path:
    path = folder() / f"{checked_name(preset.name)}.Modelfile"
    path.parent.mkdir(parents=True, exist_ok=True)
    written = path.with_suffix(".partial")
    written.write_text(preset.modelfile(), encoding="utf-8")
    os.replace(written, path)
    return path


def forget(name: str) -> bool:
    """Remove a model made with `create` (not the model it is from); False where none is named so."""
    path = folder() / f"{name.removesuffix(':latest')}.Modelfile"
    if not NAME.match(name.removesuffix(":latest")) or not path.exists():
        return False
    path.unlink()
    return True
