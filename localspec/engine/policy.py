"""How much to draft, and with what: chosen each step to maximise expected tokens per second.

A step that drafts k tokens with drafter d is expected to emit

    E(k) = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_k

tokens, where a_i is the acceptance at draft position i given that the positions
before were accepted, and to take T(k) = draft_d(k) + verify(k + 1). The policy
picks the drafter and k (k = 0 is a plain step) with the highest E(k) / T(k).

Acceptance is a belief, not a number: a Beta distribution per drafter, per kind
of evidence behind the proposal (n-gram lookup: how far the match runs back and
whether earlier occurrences agree on what follows) and per position. Choices use
the belief's mean, and an unknown drafter or kind of evidence starts out doubtful
(PRIOR). What is known only vaguely may be worth a *probe*: a draft that pays only
if acceptance sits at the optimistic end of its belief. A probe that loses costs
up to verify(k + 1) - verify(1) (plus the draft model's catch-up, if it must first
read what it missed), so probes are paid from a budget: the time probes lost
against plain decoding stays under PROBE_SHARE of the generation's decode time,
plus one plain token's time to begin with.

What earlier generations taught carries over only as a prior worth SESSION_WEIGHT
observations, so a new text's own evidence outweighs it within a few steps; within
a generation old observations fade (FORGET), so a text that stops copying its
input soon stops being drafted for.

Costs come from a calibration at load and are re-measured by every real step:
verify(1), the level everything else is relative to, follows each step's timing
(plain steps measure it for free), so a machine that gets busier or calmer moves
the policy at once; the shape of the cost curve follows the batch sizes used.
"""

from dataclasses import dataclass, field, replace
from math import sqrt
from time import perf_counter

from ..events import Step
from .backend import Context
from .drafters import Draft, ModelDrafter, NgramDrafter

PROBE_SHARE = 0.02  # of decode time, at most lost to probes that did not pay
SESSION_WEIGHT = 2.0  # observations' worth of what earlier generations taught
FORGET = 0.9  # per observation: within a generation the last ~10 observations dominate
INHERITED_WEIGHT = 2.0  # a position never tried is taken to be like the deepest one tried, held loosely
# A one-off cost (the draft model reading the tokens decided while it was idle) is weighed against
# what drafting would gain over this many tokens.
HORIZON = 64
# Observed timings outside [1/CLIP, CLIP] x the prediction are clipped: one stall of the machine
# should not make every batch look slow.
CLIP = 2.0
LEVEL_RATE = 0.1  # weight of each step's timing in the cost level
SHAPE_RATE = 0.2  # weight of each step's timing in its batch size's relative cost
# n-gram drafts cut short of a longer match this many times in a row while they are accepted: one
# twice as long is tried (as a probe), so a big batch's cost timed on a busy moment is measured again.
LONGER_AFTER = 4
HIGH_ACCEPTANCE = 0.9
CALIBRATION_TOKEN = 1


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

    @property
    def optimistic(self) -> float:
        """One standard deviation above the mean."""
        m = self.mean
        return min(1.0, m + sqrt(m * (1 - m) / (self.weight + 1)))

    def observe(self, accepted: bool) -> None:
        self.accepted = FORGET * self.accepted + accepted
        self.rejected = FORGET * self.rejected + (not accepted)

    def held_to(self, weight: float) -> "Belief":
        """The same mean, worth at most `weight` observations."""
        scale = min(1.0, weight / self.weight)
        return Belief(self.accepted * scale, self.rejected * scale)


PRIOR = Belief(1.0, 2.0)  # never seen: probably poor, and quickly corrected either way


@dataclass
class Costs:
    """Seconds for the target to verify n tokens in one batch, and for the draft model to draft,
    kept as a level (verify(1)) times each operation's cost relative to it."""

    level: float  # verify(1)
    verify: dict[int, float]  # batch size -> verify(n) / verify(1)
    draft_token: float = 0.0  # one drafted token / verify(1)
    draft_prefill_token: float = 0.0  # one token of a draft-model catch-up / verify(1)

    def verify_seconds(self, n: int) -> float:
        return self.level * _interpolate(self.verify, n)

    def draft_seconds(self, k: int) -> float:
        return self.level * self.draft_token * k

    def catch_up_seconds(self, tokens: int) -> float:
        return self.level * self.draft_prefill_token * tokens

    def observe_verify(self, n: int, seconds: float) -> None:
        relative = _interpolate(self.verify, n)
        level = min(max(seconds / relative, self.level / CLIP), self.level * CLIP)
        self.level += LEVEL_RATE * (level - self.level)
        if n > 1:
            self.verify[n] = relative + SHAPE_RATE * (min(max(seconds / self.level, relative / CLIP), relative * CLIP)
                                                      - relative)

    def observe_draft(self, tokens: int, seconds: float) -> None:
        per_token = min(max(seconds / tokens / self.level, self.draft_token / CLIP), self.draft_token * CLIP)
        self.draft_token += SHAPE_RATE * (per_token - self.draft_token)


def _interpolate(table: dict[int, float], n: int) -> float:
    if n in table:
        return table[n]
    below = max((m for m in table if m < n), default=None)
    above = min((m for m in table if m > n), default=None)
    if below is None:
        return table[above] * n / above
    if above is None:
        return table[below] * n / below
    share = (n - below) / (above - below)
    return table[below] + share * (table[above] - table[below])


def calibrate(target: Context, draft: Context | None, max_batch: int) -> Costs:
    """Time a few target batches and draft-model decodes on throwaway positions; leaves both caches empty."""
    # Powers of two: CPU and GPU matmul kernels work in tiles, so batch cost rises in steps that
    # end there (measured on a 2-core CPU: 4 tokens cost less than 3, 16 no more than 12), and
    # interpolating across a step hides its cheap end. The best of two runs each: a single timing
    # taken while the machine stalls would rule a size out until it is used again.
    sizes = [1 << i for i in range(max_batch.bit_length()) if 1 << i <= max_batch]
    seconds = {n: _time(lambda: target.decode([CALIBRATION_TOKEN] * n, logits="all"), target) for n in sizes}
    level = seconds[1]
    costs = Costs(level, {n: s / level for n, s in seconds.items()})
    if draft is not None:
        costs.draft_token = _time(lambda: draft.decode([CALIBRATION_TOKEN], logits="last"), draft) / level
        batch = min(32, draft.n_batch)
        costs.draft_prefill_token = _time(lambda: draft.decode([CALIBRATION_TOKEN] * batch, logits="last"),
                                          draft) / batch / level
    return costs


def _time(decode, context: Context, repeats: int = 2) -> float:
    best = float("inf")
    for _ in range(repeats):
        context.truncate(0)
        started = perf_counter()
        decode()
        best = min(best, perf_counter() - started)
    context.truncate(0)
    return best


@dataclass(frozen=True)
class Option:
    """Drafting with one drafter on the evidence at hand, up to `most` tokens."""

    drafter: str
    evidence: str
    most: int
    once_seconds: float = 0.0  # paid once before drafting (the draft model's catch-up)


@dataclass
class Choice:
    rate: float  # expected tokens per second
    option: Option | None = None
    length: int = 0
    probe: bool = False


@dataclass
class Budget:
    """Time that probes may still lose in this generation."""

    decode_seconds: float = 0.0
    lost_seconds: float = 0.0
    allowance: float = 0.0

    @property
    def left(self) -> float:
        return self.allowance + PROBE_SHARE * self.decode_seconds - self.lost_seconds


class AutoDrafter:
    """Chooses each step between plain decoding, n-gram lookup and the draft model (if any)."""

    name = "auto"

    def __init__(self, ngram: NgramDrafter, model: ModelDrafter | None, costs: Costs):
        self.ngram = ngram
        self.model = model
        self.costs = costs
        # (drafter, evidence) -> per draft position: P(accepted | the positions before were accepted)
        self.beliefs: dict[tuple[str, str], list[Belief]] = {}
        self.ngram_cut_short = 0

    def begin(self, prompt, sampling, rng) -> None:
        self.ngram.begin(prompt, sampling, rng)
        # The draft model reads the prompt only when first chosen: on machines where it does not
        # pay, it never costs prompt time.
        self.model_started = False
        self.sampling, self.rng = sampling, rng
        for key, positions in self.beliefs.items():
            self.beliefs[key] = [belief.held_to(SESSION_WEIGHT) for belief in positions]
        self.budget = Budget(allowance=self.costs.verify_seconds(1))
        self.chosen: Choice = Choice(0.0)

    def forget(self) -> None:
        """Drop what earlier generations taught about acceptance (a benchmark's fresh session)."""
        self.beliefs.clear()
        self.ngram_cut_short = 0

    def propose(self, history, k) -> Draft:
        plain_seconds = self.costs.verify_seconds(1)
        lookup = self.ngram.propose(history, k)
        options = []
        if lookup.tokens:
            options.append(Option("ngram", lookup.evidence, len(lookup.tokens)))
        if self.model and k:
            behind = self.model.behind(history) if self.model_started else len(history)
            options.append(Option("draft", "", k, self.costs.catch_up_seconds(behind)))
        choice = self._best(options, plain_seconds, optimistic=False, best=Choice(1 / plain_seconds))
        # Probes try what is not being drafted with: longer drafts of the chosen option are the
        # business of inheritance (untried positions are like the deepest tried) and of _maybe_longer.
        untried = [option for option in options if option != choice.option]
        probe = self._best(untried, plain_seconds, optimistic=True, best=Choice(choice.rate))
        if probe.option is not None:
            choice = replace(probe, probe=True)
        if choice.option is not None and choice.option.drafter == "ngram":
            choice = self._maybe_longer(choice, plain_seconds)
        self.chosen = choice
        if choice.option is None:
            return Draft()
        if choice.option.drafter == "ngram":
            draft = replace(lookup, tokens=lookup.tokens[: choice.length])
        else:
            draft = self._draft_with_model(history, choice.length)
        return replace(draft, probe=choice.probe, plain_seconds=plain_seconds)

    def _best(self, options: list[Option], plain_seconds: float, optimistic: bool, best: Choice) -> Choice:
        """The option and length with the highest expected rate above best's. Optimistic: rates at
        the hopeful end of each belief, only for probes the budget can pay if they lose everything."""
        for option in options:
            per_token = self.costs.draft_token * self.costs.level if option.drafter == "draft" else 0.0
            for length, expected in enumerate(self.expected_tokens(option, optimistic), start=1):
                seconds = per_token * length + self.costs.verify_seconds(length + 1)
                # A one-off cost counts in proportion to the tokens this step makes of the horizon.
                rate = expected / (seconds + option.once_seconds * expected / HORIZON)
                if optimistic and seconds + option.once_seconds - plain_seconds > self.budget.left:
                    break  # longer drafts of this option would risk even more
                if rate > best.rate:
                    best = Choice(rate, option, length)
        return best

    def expected_tokens(self, option: Option, optimistic: bool = False) -> list[float]:
        """E(1) .. E(option.most), in one pass."""
        expected, reach, out = 1.0, 1.0, []
        for position in range(option.most):
            belief = self._belief(option.drafter, option.evidence, position)
            reach *= belief.optimistic if optimistic else belief.mean
            expected += reach
            out.append(expected)
        return out

    def _belief(self, drafter: str, evidence: str, position: int) -> Belief:
        positions = self.beliefs.get((drafter, evidence))
        if not positions:
            return PRIOR
        if position < len(positions):
            return positions[position]
        # In a run of copied text the first positions fill in at nearly 1, and long drafts become
        # worth trying; held loosely, so a probe may find out otherwise.
        return positions[-1].held_to(INHERITED_WEIGHT)

    def _maybe_longer(self, choice: Choice, plain_seconds: float) -> Choice:
        # Gated on the chosen draft's own last position, which every step observes: the positions
        # past it may hold stale estimates from other text, or a big batch may have been timed on
        # a busy moment, and only a longer try can tell.
        option, length = choice.option, choice.length
        if length == option.most or self._belief(option.drafter, option.evidence, length - 1).mean < HIGH_ACCEPTANCE:
            self.ngram_cut_short = 0
            return choice
        self.ngram_cut_short += 1
        longer = min(2 * length, option.most)
        risk = self.costs.verify_seconds(longer + 1) - self.costs.verify_seconds(length + 1)
        if self.ngram_cut_short < LONGER_AFTER or risk > self.budget.left:
            return choice  # tried as soon as the budget can pay for it
        self.ngram_cut_short = 0
        return replace(choice, length=longer, probe=True)

    def _draft_with_model(self, history, length: int) -> Draft:
        started = perf_counter()
        if not self.model_started:
            self.model.begin(history, self.sampling, self.rng)
            self.model_started = True
        began = perf_counter() - started
        draft = self.model.propose(history, length)
        return replace(draft, catch_up_seconds=draft.catch_up_seconds + began)

    def observe(self, step: Step) -> None:
        self.costs.observe_verify(step.drafted + 1, step.verify_seconds)
        self.budget.decode_seconds += step.draft_seconds + step.verify_seconds
        if step.probe:
            self.budget.lost_seconds += step.lost_seconds
        option = self.chosen.option
        if not step.drafted or option is None or option.drafter != step.drafter:
            return
        # Position i was tried only if all before it were accepted.
        positions = self.beliefs.setdefault((option.drafter, option.evidence), [])
        for position in range(min(step.accepted + 1, step.drafted)):
            if position == len(positions):
                positions.append(replace(self._belief(option.drafter, option.evidence, position)))
            positions[position].observe(position < step.accepted)
        if step.drafter == "draft":
            self.costs.observe_draft(step.drafted, step.draft_seconds - step.catch_up_seconds)
