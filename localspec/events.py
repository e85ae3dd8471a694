"""What a generation reports, in order: Prefill, then Token/Step per step, then Done."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .stats import Summary


@dataclass(frozen=True)
class Prefill:
    """The prompt is in the target's KV cache; `reused_tokens` of it were there already."""

    prompt_tokens: int
    reused_tokens: int
    seconds: float


@dataclass(frozen=True)
class Token:
    """One emitted token. text is what may be shown now: it can be empty while a
    multi-byte character or a possible stop string is still incomplete."""

    id: int
    text: str
    from_draft: bool


@dataclass(frozen=True)
class Step:
    """One draft-and-verify round: `drafted` proposed, `accepted` of them kept,
    plus the one token the target adds itself."""

    drafter: str
    drafted: int
    accepted: int
    draft_seconds: float
    verify_seconds: float


@dataclass(frozen=True)
class Done:
    """finish_reason: "stop" (end of generation or a stop string), "length" (max tokens)
    or "context" (the context is full). tail: text held back until the end, not yet
    carried by any Token event. text: everything generated."""

    finish_reason: str
    text: str
    tail: str
    summary: "Summary"


Event = Prefill | Token | Step | Done
