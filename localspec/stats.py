"""Speculation statistics as a fold over a generation's events: the one place events are counted."""

from dataclasses import asdict, dataclass, field
from time import perf_counter

from .config import DrafterKind
from .events import Done, Logprobs, Prefill, Step, Token

INTERRUPTED = "interrupted"  # the finish reason of a generation stopped by Ctrl-C


@dataclass
class DrafterTally:
    """One drafter's share of a generation: its steps, their tokens and time, and its probes
    (drafts the auto policy made only to learn whether drafting pays) and what the lost ones cost."""

    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    seconds: float = 0.0  # drafting (catch-up included) and verifying its steps
    catch_up_seconds: float = 0.0
    probes: int = 0
    probes_lost: int = 0
    probe_lost_seconds: float = 0.0

    def add(self, step: Step) -> None:
        self.steps += 1
        self.drafted += step.drafted
        self.accepted += step.accepted
        self.seconds += step.draft_seconds + step.verify_seconds
        self.catch_up_seconds += step.catch_up_seconds
        if step.probe:
            self.probes += 1
            lost = step.lost_seconds
            self.probes_lost += lost > 0
            self.probe_lost_seconds += lost


@dataclass
class PartTally:
    """A reply's thinking, or its answer: its tokens, and the steps that made them (a step counted in the
    part its first token falls in), their drafts and time."""

    tokens: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    seconds: float = 0.0  # drafting and verifying its steps

    def add(self, step: Step) -> None:
        self.steps += 1
        self.drafted += step.drafted
        self.accepted += step.accepted
        self.seconds += step.draft_seconds + step.verify_seconds

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Tokens the target settled per verification, in this part (auto's pay: above 1 where drafts were kept)."""
        return self.tokens / self.steps if self.steps else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "tokens_per_second": self.tokens_per_second, "tokens_per_step": self.tokens_per_step}


@dataclass
class TreeTally:
    """The steps that verified a draft tree: their nodes, depths and branches, and which branch the kept
    path took (wins[1]: the one the drafter bet on; wins[2]: a runner-up somewhere; ...)."""

    steps: int = 0
    nodes: int = 0
    depth: int = 0
    branches: int = 0
    accepted: int = 0
    wins: dict[int, int] = field(default_factory=dict)

    def add(self, step: Step) -> None:
        self.steps += 1
        self.nodes += step.drafted
        self.depth += step.depth
        self.branches += step.branches
        self.accepted += step.accepted
        self.wins[step.rank] = self.wins.get(step.rank, 0) + 1

    @property
    def off_the_bet(self) -> int:
        """Steps whose kept path left the branch the drafter bet on: what trees bought over chains."""
        return sum(count for rank, count in self.wins.items() if rank > 1)


THINKING, ANSWER = "thinking", "answer"


@dataclass(frozen=True)
class Summary:
    tokens: int
    steps: int
    drafted: int
    accepted: int
    acceptance_rate: float
    mean_accepted_length: float  # tau: tokens the target settled per verification (an end token included)
    per_position_acceptance: list[float]
    per_position_drafted: list[int]  # steps whose draft reached each position
    tokens_per_second: float
    prompt_tokens: int
    reused_prompt_tokens: int  # already in the KV cache from an earlier turn, or read back from the prompt cache
    prefill_seconds: float
    draft_seconds: float
    verify_seconds: float
    decode_seconds: float
    # Plain decoding's cost per token is the target's time in steps that drafted nothing
    # (their draft time was speculation's overhead, not plain decoding's).
    estimated_speedup: float | None
    drafters: dict[DrafterKind, DrafterTally] = field(default_factory=dict)  # per drafter that drafted
    # a reasoning model's thinking and answer apart (THINKING, ANSWER); empty where nothing was thinking
    parts: dict[str, PartTally] = field(default_factory=dict)
    trees: TreeTally = field(default_factory=TreeTally)
    from_drafts: int = 0  # tokens that came from accepted drafts (an end token drafted and accepted not among them)

    @property
    def probe_lost_seconds(self) -> float:
        return sum(d.probe_lost_seconds for d in self.drafters.values())

    def prediction_tokens(self, predicted: int) -> dict:
        """OpenAI's counts for a prediction of `predicted` tokens: those the answer took (drafted and
        accepted) and the rest."""
        tally = self.drafters.get(DrafterKind.PREDICTION)
        accepted = tally.accepted if tally else 0
        return {"accepted_prediction_tokens": accepted, "rejected_prediction_tokens": max(0, predicted - accepted)}

    def as_dict(self) -> dict:
        out = dict(self.__dict__)
        out["drafters"] = {name: asdict(d) for name, d in self.drafters.items()}
        out["parts"] = {name: part.as_dict() for name, part in self.parts.items()}
        out["trees"] = {**asdict(self.trees), "off_the_bet": self.trees.off_the_bet}
        out["probe_lost_seconds"] = self.probe_lost_seconds
        return out

    def acceptance_by_position_range(self) -> list[tuple[str, float]]:
        """(positions, acceptance) with positions past 4 grouped in doubling ranges (5-8, 9-16, ...),
        so drafts of 32 tokens still fit a few lines."""
        rows, start = [], 1
        while start <= len(self.per_position_acceptance):
            end = min(start if start <= 4 else 2 * (start - 1), len(self.per_position_acceptance))
            drafted = self.per_position_drafted[start - 1 : end]
            kept = sum(rate * n for rate, n in zip(self.per_position_acceptance[start - 1 : end], drafted))
            rows.append((str(start) if start == end else f"{start}-{end}", kept / sum(drafted)))
            start = end + 1
        return rows


@dataclass
class Recorder:
    """Folds the events of a generation, or of several in a row (a chat's turns, a benchmark's
    prompts): counts and times over all of them, and the latest one's text and finish reason.
    summary() can be taken at any point, while generating too."""

    prompt_tokens: int = 0
    reused_prompt_tokens: int = 0
    prefill_seconds: float = 0.0
    tokens: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    decided: int = 0  # tokens the target settled, the end-of-generation token included
    from_drafts: int = 0  # tokens from accepted drafts
    plain_steps: int = 0
    plain_step_seconds: float = 0.0
    shared_steps: int = 0  # steps decoded in one batch with other sequences' rows (serve -np, batch --parallel)
    last_drafted: int = 0
    # reached[i]: steps that drafted a token at position i; kept[i]: of those, accepted ones
    reached: list[int] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)
    drafters: dict[DrafterKind, DrafterTally] = field(default_factory=dict)
    parts: dict[str, PartTally] = field(default_factory=lambda: {THINKING: PartTally(), ANSWER: PartTally()})
    trees: TreeTally = field(default_factory=TreeTally)
    text: str = ""  # of the latest generation: what its Token events carried, and the held-back tail
    ids: list[int] = field(default_factory=list)  # of the latest generation: its tokens, the thinking's too
    end_token: int | None = None  # the end-of-generation token that ended the latest generation, if one did
    unshown_tokens: int = 0  # of the latest generation: its last tokens that no text shows (a stop string's)
    logprobs: list[Logprobs] = field(default_factory=list)  # of the latest generation's answer tokens, where asked
    prompt_logprobs: tuple[Logprobs, ...] = ()  # of its prompt's tokens (the first's None), where asked
    reasoning: str = ""  # of the latest generation: its thinking, as its Token events carried it
    finish_reason: str | None = None  # of the latest generation; None while it runs
    stop_sequence: str | None = None  # the stop string that ended the latest generation, if one did
    finished_seconds: float = 0.0  # decode time of the generations that ended
    decode_started: float | None = None  # when the running generation's prefill ended
    _unplaced: Step | None = None  # the latest step, until its first token says which part it made
    _part: str = ANSWER  # the part of the latest token

    def add(self, event) -> None:
        if isinstance(event, Prefill):
            self.prompt_tokens += event.prompt_tokens
            self.reused_prompt_tokens += event.reused_tokens
            self.prefill_seconds += event.seconds
            self.text, self.reasoning, self.finish_reason, self.stop_sequence = "", "", None, None
            self.logprobs, self.prompt_logprobs, self.ids, self.end_token = [], event.logprobs, [], None
            self.unshown_tokens = 0
            self.decode_started = perf_counter()
        elif isinstance(event, Token):
            self.tokens += 1
            self.from_drafts += event.from_draft
            self.ids.append(event.id)
            self.text += event.text
            self.reasoning += event.thought
            self._part = THINKING if event.thinking else ANSWER
            if event.logprobs is not None and not event.thinking:
                self.logprobs.append(event.logprobs)
            self.parts[self._part].tokens += 1
            self._place_step()
        elif isinstance(event, Step):
            self._place_step()
            self._unplaced = event
            self._add_step(event)
        elif isinstance(event, Done):
            self._place_step()
            self.text += event.tail
            self.reasoning += event.thought_tail
            self.finish_reason, self.stop_sequence = event.finish_reason, event.stop_sequence
            self.end_token, self.unshown_tokens = event.end_token, event.unshown_tokens
            self.finished_seconds += event.decode_seconds
            self.decode_started = None

    def _add_step(self, step: Step) -> None:
        self.steps += 1
        self.drafted += step.drafted
        self.accepted += step.accepted
        self.draft_seconds += step.draft_seconds
        self.verify_seconds += step.verify_seconds
        self.last_drafted = step.drafted
        self.decided += step.accepted + step.own_taken
        self.shared_steps += step.batch_rows > 0
        if step.drafted == 0:
            self.plain_steps += 1
            self.plain_step_seconds += step.verify_seconds
        positions = step.depth if step.branches else step.drafted  # a tree's reach down, not its size
        while len(self.reached) < positions:
            self.reached.append(0)
            self.kept.append(0)
        for i in range(positions):
            self.reached[i] += 1
            self.kept[i] += i < step.accepted
        if step.drafted or step.probe:
            self.drafters.setdefault(step.drafter, DrafterTally()).add(step)
        if step.branches:
            self.trees.add(step)

    def _place_step(self) -> None:
        if self._unplaced is not None:
            self.parts[self._part].add(self._unplaced)
            self._unplaced = None

    def interrupt(self) -> None:
        """The running generation was stopped (Ctrl-C): it ends where it got to."""
        self.finished_seconds = self.decode_seconds
        self.decode_started = None
        self.finish_reason = INTERRUPTED

    @property
    def decode_seconds(self) -> float:
        running = perf_counter() - self.decode_started if self.decode_started is not None else 0.0
        return self.finished_seconds + running

    def summary(self) -> Summary:
        decode_seconds = self.decode_seconds
        return Summary(
            tokens=self.tokens,
            steps=self.steps,
            drafted=self.drafted,
            accepted=self.accepted,
            acceptance_rate=self.accepted / self.drafted if self.drafted else 0.0,
            mean_accepted_length=self.decided / self.steps if self.steps else 0.0,
            per_position_acceptance=[k / r for k, r in zip(self.kept, self.reached)],
            per_position_drafted=list(self.reached),
            tokens_per_second=self.tokens / decode_seconds if decode_seconds > 0 else 0.0,
            prompt_tokens=self.prompt_tokens,
            reused_prompt_tokens=self.reused_prompt_tokens,
            prefill_seconds=self.prefill_seconds,
            draft_seconds=self.draft_seconds,
            verify_seconds=self.verify_seconds,
            decode_seconds=decode_seconds,
            estimated_speedup=self.estimated_speedup(),
            drafters={kind: DrafterTally(**asdict(d)) for kind, d in self.drafters.items()},
            parts={name: PartTally(**asdict(part)) for name, part in self.parts.items()}
            if self.parts[THINKING].tokens else {},
            trees=TreeTally(**{**asdict(self.trees), "wins": dict(self.trees.wins)}),
            from_drafts=self.from_drafts,
        )

    def estimated_speedup(self) -> float | None:
        spent = self.draft_seconds + self.verify_seconds
        if not self.plain_steps or not spent:
            return None
        # plain decoding would have spent one plain step on every token the target settled
        return self.plain_step_seconds / self.plain_steps * self.decided / spent


def record(events) -> Recorder:
    """A generation's events, all folded: for callers that want only the outcome (batch, bench)."""
    recorder = Recorder()
    for event in events:
        recorder.add(event)
    return recorder
