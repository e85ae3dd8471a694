"""What every drafter is and hands the loop: the Drafter protocols, a Draft, and the evidence a
proposal rests on.

`history` is every token committed so far (prompt and output); its last token
has not been decoded by the target yet. A Draft carries the proposal and, when
the proposal was sampled, the distribution q each token was drawn from;
without it the proposal was deterministic and q is one-hot.

Every drafter is a `Drafter` (begin, propose: all a free drafter such as
n-gram lookup is). One that runs a forward pass per drafted token is also a
`CostlyDrafter`, with what the auto policy needs to weigh it (its context,
prepare, behind); the costly drafters share that machinery in ForwardDrafter.
A drafter whose decodes may wait beside other sequences' (a costly drafter on a
context several sequences share), or that asks one, is `Stepwise` (proposing:
its turns, then its Draft); the loop asks every drafter through `proposal`.
Only a drafter that learns is a `Learner` (observe).
"""

from collections.abc import Generator
from dataclasses import dataclass, field, replace
from enum import IntEnum, StrEnum
from typing import Protocol, runtime_checkable

import numpy as np

from ...config import DrafterKind, Sampling
from ...events import Step
from ..backend import Context
from ..sampling import Dist
from ..tree import Alternative, DraftTree
from ..turns import Turn


class RunClass(IntEnum):
    """How far back an n-gram match runs (the n-gram included), by the least run of its class: a long
    copied passage tends to go on being copied; a 2-token match in a long document is mostly chance.
    Strongest first."""

    FROM_16 = 16
    FROM_8 = 8
    FROM_4 = 4
    UNDER_4 = 0

    @classmethod
    def of(cls, run: int) -> "RunClass":
        return _RUN_CLASSES[min(run, len(_RUN_CLASSES) - 1)]  # (iterating an enum costs a microsecond)

    def shorter(self) -> "RunClass | None":
        return _SHORTER[self]

    def __str__(self) -> str:
        return {16: "run 16+", 8: "run 8-15", 4: "run 4-7", 0: "run 2-3"}[self.value]


# looked up, not found: each n-gram proposal (auto asks for one every step) names its run's class
_RUN_CLASSES = [next(least for least in RunClass if run >= least) for run in range(max(RunClass) + 1)]
_SHORTER = dict(zip(RunClass, [*list(RunClass)[1:], None]))


class Agreement(StrEnum):
    """Whether the n-gram's earlier occurrences agree on what follows it (the counts SuffixDecoding scores by)."""

    SEEN_ONCE = "seen once"
    AGREE = "earlier agree"
    DIFFER = "earlier differ"


@dataclass(frozen=True)
class Evidence:
    """What an n-gram proposal rests on; the auto policy keeps acceptance per kind of evidence."""

    run: RunClass
    agreement: Agreement

    def weaker(self) -> "Evidence | None":
        """The same evidence with a match one class shorter, if there is one."""
        shorter = self.run.shorter()
        return Evidence(shorter, self.agreement) if shorter is not None else None

    def __str__(self) -> str:
        return f"{self.run}, {self.agreement}"


@dataclass(frozen=True)
class Probe:
    """The auto policy drafted only to learn whether drafting pays here; a plain step was expected to
    cost plain_seconds then (together they say what the probe lost)."""

    plain_seconds: float


@dataclass(frozen=True)
class Draft:
    tokens: list[int] = field(default_factory=list)
    dists: list[Dist] | None = None
    source: DrafterKind = DrafterKind.PLAIN  # the drafter that made it
    # Seconds a costly drafter spent reading what was decided since it last ran (measured by the drafter
    # itself): part of the step's draft time, reported per drafter (stats), and kept out of its cost per
    # token by the auto policy.
    catch_up_seconds: float = 0.0
    # n-gram lookup: what the proposal rests on, and how many tokens the match runs back (the evidence
    # names only its class); the auto policy weighs the proposal by them.
    evidence: Evidence | None = None
    run: int = 0
    # Set by the auto policy on a probe. The loop carries it into the Step because stats reports probes
    # and what they lost; the policy reads it back from the Step (a draft the loop drops was not verified).
    probe: Probe | None = None
    # several branches verified in one pass (engine/tree.py), in place of tokens
    tree: DraftTree | None = None
    # a free drafter's other continuations beside tokens, for the auto policy to weigh as a tree
    alternatives: tuple[Alternative, ...] = ()

    @property
    def size(self) -> int:
        """The tokens it asks the target to verify."""
        return len(self.tree) if self.tree is not None else len(self.tokens)

    def without_images(self) -> "Draft":
        """The draft up to the first row of an image it copied from the history (engine/vision.py: an image is
        the prompt's to hold, never a token to write), its tree dropped where one holds such a row."""
        tree = None if self.tree is not None and min(self.tree.tokens, default=0) < 0 else self.tree
        cut = next((i for i, token in enumerate(self.tokens) if token < 0), None)
        if cut is None and tree is self.tree:
            return self
        return replace(self, tokens=self.tokens[:cut], dists=self.dists[:cut] if self.dists else self.dists, tree=tree)

    @classmethod
    def nothing(cls, source: DrafterKind = DrafterKind.PLAIN) -> "Draft":
        """An empty proposal by this drafter, made once a kind: most steps propose nothing (auto asks its
        free drafters every step), and a frozen dataclass of nine fields costs a microsecond or two to make.
        Its tokens are never changed in place, as no Draft's are."""
        if source not in _NOTHING:
            _NOTHING[source] = cls(source=source)
        return _NOTHING[source]


_NOTHING: dict[DrafterKind, Draft] = {}


class Drafter(Protocol):
    """What the loop asks of every drafter; a free drafter (n-gram lookup) is just this."""

    kind: DrafterKind

    def begin(self, prompt: list[int], sampling: Sampling, rng: np.random.Generator) -> None:
        """Start a new generation for this prompt."""

    def propose(self, history: list[int], k: int) -> Draft:
        """Up to k tokens that may follow history."""


class Stepwise(Protocol):
    """A drafter whose proposal may need rows decoded beside other sequences' (a draft model on a
    context several sequences share), or that asks one that may: it hands the rows out as Turns."""

    def proposing(self, history: list[int], k: int) -> Generator[Turn, None, Draft]:
        """propose's work: its turns, then the Draft."""


def proposal(drafter: Drafter, history: list[int], k: int) -> Generator[Turn, None, Draft]:
    """What a drafter proposes, with the turns it needs decoded on the way (none but a Stepwise's)."""
    proposing = getattr(drafter, "proposing", None)  # (isinstance on a Protocol costs ~7 us a step)
    if proposing is None:
        return drafter.propose(history, k)
    return (yield from proposing(history, k))


@runtime_checkable
class Learner(Protocol):
    """A drafter that learns from how its proposals fared (the auto policy): the loop shows it every step."""

    def observe(self, step: Step) -> None: ...


class CostlyDrafter(Drafter, Protocol):
    """A drafter that runs a forward pass per drafted token on a context of its own (a draft model, the
    target's MTP block): what the auto policy needs to weigh it and to choose it only when it pays."""

    context: Context

    def prepare(self, sampling: Sampling, rng: np.random.Generator) -> None:
        """Start a generation without reading anything: the first draft reads what the cache lacks."""

    def behind(self, history: list[int]) -> int:
        """Tokens the next draft would first have to read (at most; some may still match the cache)."""


class NoDrafter:
    """Plain decoding: the target alone, one token per step."""

    kind = DrafterKind.PLAIN

    def begin(self, prompt, sampling, rng) -> None:
        pass

    def propose(self, history, k) -> Draft:
        return Draft.nothing()
