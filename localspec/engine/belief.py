"""What auto believes of a drafter's acceptance, position by position.

Acceptance is a belief, not a number: a Beta distribution per drafter, per kind
of evidence behind the proposal (n-gram lookup: how far the match runs back and
whether earlier occurrences agree on what follows) and per position. A draft is
*sure* when it pays even at the doubtful side of its beliefs (one standard
deviation below the mean); the best sure draft, or a plain step, is the default.

Within a generation old observations fade (FORGET), so a text that stops copying its input soon
stops being drafted for; a position never tried is taken to be like the deepest one tried, held
loosely (INHERITED_WEIGHT). How policy.py weighs these beliefs is said there.
"""

from dataclasses import dataclass
from functools import lru_cache
from math import sqrt

FORGET = 0.9  # per observation: within a generation the last ~10 observations dominate
INHERITED_WEIGHT = 2.0  # a position never tried is taken to be like the deepest one tried, held loosely
# Where a belief is read: the doubtful side (a draft that pays even there is sure), the mean, and
# the hopeful end a probe bets on.
SURE, MEAN, HOPEFUL = -1.0, 0.0, 3.0


@dataclass
class Belief:
    """Beta(accepted, rejected) pseudo-counts: how likely a draft position is to be accepted."""

    accepted: float
    rejected: float

    @property
    def weight(self) -> float:
        return self.accepted + self.rejected

    @property
    def mean(self) -> float:
        return self.accepted / self.weight

    def view(self, hope: float) -> float:
        """Acceptance read `hope` standard deviations from the mean, one standard deviation being
        sqrt(mean (1 - mean) / (weight + 1)): inline, as auto reads hundreds of views a step."""
        weight = self.accepted + self.rejected
        mean = self.accepted / weight
        return min(1.0, max(0.0, mean + hope * sqrt(mean * (1 - mean) / (weight + 1))))

    def observe(self, accepted: bool, forget: float = FORGET) -> None:
        self.accepted = forget * self.accepted + accepted
        self.rejected = forget * self.rejected + (not accepted)

    def held_to(self, weight: float) -> "Belief":
        """The same mean, worth at most `weight` observations."""
        scale = min(1.0, weight / self.weight)
        return Belief(self.accepted * scale, self.rejected * scale)


PRIOR = Belief(1.0, 2.0)  # never seen: probably poor, and quickly corrected either way


def untried(positions: list[Belief]) -> Belief:
    """A draft position this generation has not tried. In a run of copied text the first positions
    fill in at nearly 1, and long drafts become worth trying: it is taken to be like the deepest
    position tried, held loosely, so a draft (or the text, for n-gram lookups) may show otherwise;
    with nothing tried, the PRIOR."""
    return positions[-1].held_to(INHERITED_WEIGHT) if positions else PRIOR


@lru_cache(maxsize=4096)  # a match may run back as far as the context: keys are not few
def copy_goes_on(held: int, hope: float) -> float:
    """An n-gram draft position no text has scored yet, read `hope` deviations from its mean: the copy has
    held for `held` tokens (how far the match runs back, and the draft positions before this one), and
    Laplace's rule of succession gives (held + 1) / (held + 2) for one more, held as loosely as any untried
    position. The deepest scored position alone would say a copy that never broke never will, and a quote
    of a dozen tokens would earn a draft of thirty. (Kept: auto reads it at every unscored position of
    every free option, several times a step.)"""
    return Belief(held + 1, 1).held_to(INHERITED_WEIGHT).view(hope)
