"""What a generation reports, in order: Reading while a long prompt is read, Prefill, then Token/Step per step,
then Done.

The engine only emits these; stats.Recorder folds them into text and statistics for every face."""

import base64
from dataclasses import dataclass, fields, is_dataclass

from .config import DrafterKind


@dataclass(frozen=True)
class Prefill:
    """The prompt is in the target's KV cache; `reused_tokens` of it were there already. logprobs: where
    Sampling.prompt_logprobs asked, those of each prompt token (the first's logprob None: nothing before it
    predicts it, as OpenAI's echo and vLLM's prompt_logprobs say)."""

    prompt_tokens: int
    reused_tokens: int
    seconds: float
    logprobs: tuple["Logprobs", ...] = ()


@dataclass(frozen=True)
class Reading:
    """A long prompt is being read: `read` of its `total` tokens are in the target's cache (the `cached` ones
    that were there already among them), `seconds` since it began. Sent after each batch of a prompt whose
    unread part takes more than one, before its Prefill, so that a long read can be watched (a short one sends
    none)."""

    read: int
    total: int
    cached: int
    seconds: float


@dataclass(frozen=True)
class Candidate:
    """A token as logprobs report it: its id, the bytes it stands for and its log probability (None: a
    prompt's first token)."""

    id: int
    piece: bytes
    logprob: float | None


@dataclass(frozen=True)
class Logprobs:
    """What the target's row made of an emitted token: its log probability under the model's own
    distribution (the row's softmax, before penalties, grammar, truncation and temperature, as
    llama-server and vLLM report it) and the likeliest tokens' beside it, likeliest first."""

    chosen: Candidate
    top: tuple[Candidate, ...] = ()


@dataclass(frozen=True)
class Token:
    """One emitted token. text is what may be shown now of the answer: it can be empty while a
    multi-byte character or a possible stop string is still incomplete. A reasoning model's tokens are
    split by the session (reasoning.py): thought is what may be shown now of the thinking, and thinking
    says the token is part of it (its markers included)."""

    id: int
    text: str
    from_draft: bool
    thought: str = ""
    thinking: bool = False
    logprobs: Logprobs | None = None  # where the generation was asked to report them


@dataclass(frozen=True)
class Step:
    """One draft-and-verify round: `drafted` proposed, `accepted` of them kept,
    plus the one token the target adds itself. draft_seconds includes catch_up_seconds,
    the drafter reading what was decided since it last ran (the draft model's prompt, too,
    when the auto policy first chooses it): a one-off cost, not part of drafting per token.
    A probe was drafted only to learn whether drafting pays; plain_seconds is what a plain
    step was expected to cost at the time, so a probe's loss against plain decoding can be told."""

    drafter: DrafterKind
    drafted: int
    accepted: int
    draft_seconds: float
    verify_seconds: float
    # Carried for reports: stats tallies catch-up time, probes and what they lost per drafter (the auto
    # policy, which set the probe, reads the same fields back when it observes the step).
    catch_up_seconds: float = 0.0
    probe: bool = False
    plain_seconds: float = 0.0  # set on probes only
    batch_rows: int = 0  # rows other sequences added to the decode this step shared with them (serve -np)
    # a draft tree's: its branches (0: a chain), its depth (its longest branch), and which of its branches the
    # kept path took (1: the one its drafter bet on; 2: a runner-up somewhere; 0: a chain); its size is `drafted`
    branches: int = 0
    depth: int = 0
    rank: int = 0
    # False where the answer ended inside the accepted draft (an end token, a stop string): `accepted` then counts
    # the draft tokens it took, and the target's own token after them was not taken
    own_taken: bool = True

    @property
    def lost_seconds(self) -> float:
        """Time beyond what plain decoding would have taken for the tokens this step made."""
        return max(0.0, self.draft_seconds + self.verify_seconds - (self.accepted + self.own_taken) * self.plain_seconds)


@dataclass(frozen=True)
class Done:
    """finish_reason: "stop" (end of generation or a stop string), "length" (max tokens)
    or "context" (the context is full). tail: text held back until the end, not carried
    by any Token event (thought_tail: of the thinking, where a reply ends inside it). decode_seconds: from
    the end of the prefill to the end of the last step. stop_sequence: the stop string that ended it, if one did;
    end_token: the end-of-generation token that ended it, if one did (no Token event carries it); unshown_tokens: the
    last tokens generated that no text shows (a stop string's: their Token events carried none of it)."""

    finish_reason: str
    tail: str
    decode_seconds: float
    thought_tail: str = ""
    stop_sequence: str | None = None
    end_token: int | None = None
    unshown_tokens: int = 0  # the last tokens generated that the text does not show: a stop string's


Event = Reading | Prefill | Token | Step | Done


# Events on the wire (serve's own stream, which `run` and `chat` read from a running serve): JSON objects
# named by their kind, a token's bytes in base64.
_KINDS = {cls.__name__.lower(): cls for cls in (Reading, Prefill, Token, Step, Done)}


def to_wire(event: Event) -> dict:
    def plain(value):
        if is_dataclass(value):
            return {field.name: plain(getattr(value, field.name)) for field in fields(value)}
        if isinstance(value, bytes):
            return base64.b64encode(value).decode("ascii")
        if isinstance(value, tuple):
            return [plain(item) for item in value]
        return value

    return {"event": type(event).__name__.lower(), **plain(event)}


def from_wire(data: dict) -> Event:
    """The event to_wire wrote; ValueError where it is not one (fields it does not know are left out, so
    an older client reads a newer server's events)."""
    kind = _KINDS.get(data.get("event"))
    if kind is None:
        raise ValueError(f"not an event: {str(data)[:80]}")
    known = {field.name for field in fields(kind)}
    values = {name: value for name, value in data.items() if name in known}
    def candidate(item: dict) -> Candidate:
        return Candidate(item["id"], base64.b64decode(item["piece"]), item["logprob"])

    def logprobs(item: dict) -> Logprobs:
        return Logprobs(candidate(item["chosen"]), tuple(map(candidate, item["top"])))

    if kind is Token and values.get("logprobs") is not None:
        values["logprobs"] = logprobs(values["logprobs"])
    if kind is Prefill:
        values["logprobs"] = tuple(map(logprobs, values.get("logprobs", ())))
    if kind is Step:
        values["drafter"] = DrafterKind(values["drafter"])
    try:
        return kind(**values)
    except TypeError as error:
        raise ValueError(f"not a {kind.__name__}: {error}") from None
