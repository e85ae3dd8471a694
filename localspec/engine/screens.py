"""What auto weighs a step with before it weighs it in full: an option (a drafter, its evidence, how far it may
draft), the step's costs in verify(1)s (Weighing), and a costly drafter's screen, the bounds on what its drafts could
earn, so that one that cannot pay is passed over at the price of a look-up (policy.py says how they are used)."""

from collections.abc import Callable
from dataclasses import dataclass, field

from ..config import DrafterKind
from .belief import Belief
from .costs import Costs
from .drafters import Evidence

# A one-off cost (the draft model reading the tokens decided while it was idle) is weighed against
# what drafting would gain over this many tokens.
HORIZON = 64
# The screens' bounds are taken with other roundings than the rates they bound: a draft is passed over
# only where its bound falls short by more than this (relative), and weighed in full otherwise.
ROUNDING = 1e-9


@dataclass(frozen=True)
class Option:
    """Drafting with one drafter on the evidence at hand, up to `most` tokens."""

    drafter: DrafterKind
    evidence: Evidence | None  # n-gram lookup's; a costly drafter's beliefs are one kind
    most: int
    once_seconds: float = 0.0  # paid once before drafting (the draft model's catch-up)
    run: int = 0  # n-gram lookup: how many tokens the match already runs back


@dataclass
class Screen:
    """Bounds on what a costly drafter's drafts of 1 .. option.most tokens could earn, from its beliefs and
    the cost curve's shape alone (verify(1) cancels out of a comparison with a plain step), kept until
    either moves: a drafter that cannot pay is passed over at the price of a look-up, not weighed
    length by length every step. A draft of n tokens expected to make E tokens, for u verify(1)s of drafting
    and verifying, beats a plain step of p verify(1)s where E p > u + x + c E / HORIZON: x what its change
    of batch size costs at least, c its catch-up, spread as _rates spreads it. Both are the step's own: a
    draft model that does not read the prompt falls a token behind a plain step, and on a GPU a draft's
    batch after plain steps pays a reshape (a screen blind to them had auto weigh such a draft model in full
    at every step of the floor and never choose it: half its host work there on a CPU)."""

    option: Option  # the drafter's option when taken (its catch-up then apart)
    positions: list[Belief]  # the beliefs it was taken from (replaced, not only updated, when they are)
    shape: int  # Costs.shape then
    token: float  # a drafted token's cost relative to verify(1) then
    # (u, E) of the lengths that may beat a plain step at SURE and at HOPEFUL: cheapest first, each expected to
    # make more than every cheaper one (a costlier draft making no more can never do better)
    sure: list[tuple[float, float]]
    probes: list[tuple[float, float]]
    # (hope, beyond) -> E(1) .. E(option.most), for the steps that weigh it in full
    expected: dict[tuple[float, float | None], list[float]]
    # sure's and probes' last step on which no length beat a plain step: (its plain, its change, the catch-up).
    # A step whose plain step costs no more, whose change costs no less and whose catch-up is no smaller cannot
    # be beaten either (the floor's held plain steps asked every length again each step: 13 a step).
    beaten_by_none: dict[str, tuple[float, float, float]] = field(default_factory=dict)

    def may_be_sure(self, step: "Weighing", catch_up: float) -> bool:
        return self._cheapest_beating("sure", step, catch_up) is not None

    def may_probe(self, step: "Weighing", catch_up: float, bucket: float) -> bool:
        """Whether the bucket could pay for a draft that hope says may beat a plain step: the cheapest such
        draft risks least."""
        cheapest = self._cheapest_beating("probes", step, catch_up)
        if cheapest is None:
            return False
        risk = step.level * (cheapest[0] + step.change - step.plain + catch_up)
        return risk - bucket <= ROUNDING * (abs(risk) + step.plain * step.level + abs(bucket))

    def _cheapest_beating(self, which: str, step: "Weighing", catch_up: float) -> tuple[float, float] | None:
        """The cheapest (u, E) of `which` (sure, probes) that beats a plain step of this step's, if any."""
        last = self.beaten_by_none.get(which)
        if last is not None and step.plain <= last[0] and step.change >= last[1] and catch_up >= last[2]:
            return None
        for units, tokens in getattr(self, which):
            if step.beats_plain(units, tokens, catch_up):
                return units, tokens
        self.beaten_by_none[which] = (step.plain, step.change, catch_up)
        return None

    def expected_tokens(self, weigh: Callable[[Option, float, float | None], list[float]], hope: float,
                        beyond: float | None = None) -> list[float]:
        """E(1) .. E(option.most) at `hope`, as weigh (AutoDrafter.expected_tokens) reads them, kept."""
        if (hope, beyond) not in self.expected:
            self.expected[hope, beyond] = weigh(self.option, hope, beyond)
        return self.expected[hope, beyond]


@dataclass(frozen=True)
class Weighing:
    """A step's costs as a screen reads them, in verify(1)s (a costly drafter's catch-up apart): a plain
    step's, and the least a draft's change of batch size adds."""

    level: float
    plain: float
    change: float

    @classmethod
    def of(cls, costs: Costs, sizes: tuple[int | None, int | None]) -> "Weighing":
        level, last = costs.level, sizes[1]
        change = costs.reshape if last is None or last < 2 else min(costs.reshape, costs.changing(last, sizes) / level)
        return cls(level, costs.relative(1)[0] + costs.changing(1, sizes) / level, change)

    def beats_plain(self, units: float, tokens: float, catch_up: float) -> bool:
        spread = catch_up * tokens / HORIZON
        margin = tokens * self.plain - units - self.change - spread
        return margin > -ROUNDING * (tokens * self.plain + units + self.change + spread)


def front(units: list[float], tokens: list[float], best_plain: float) -> list[tuple[float, float]]:
    """(u, E) of the lengths that may beat a plain step costing at most best_plain verify(1)s, cheapest first
    (a measured curve may dip: on an H200 a batch of 16 cost less than one of 8), those making no more than a
    cheaper one left out."""
    front: list[tuple[float, float]] = []
    for unit, made in sorted(zip(units, tokens)):
        if made * best_plain > unit * (1 - ROUNDING) and (not front or made > front[-1][1]):
            front.append((unit, made))
    return front

