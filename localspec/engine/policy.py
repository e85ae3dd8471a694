"""How much to draft, and with what: chosen each step to maximise expected tokens per second.

Speculation pays only when the tokens it wins are worth more than the time it
costs. A step that drafts k tokens with drafter d is expected to emit

    E(k) = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_k

tokens, where a_i is d's acceptance rate at draft position i given that the
positions before were accepted, and to take T(k) = draft_d(k) + verify(k + 1).
The policy picks the drafter and k (k = 0 is a plain step) with the highest
E(k) / T(k). Acceptance rates and costs start from a short calibration at load
and follow what the steps actually measure, so the choice adapts to the
machine, the pair and the text: n-gram drafts cost almost nothing and are used
whenever they have a match; a draft model is used only where it wins.
"""

from dataclasses import dataclass, field
from time import perf_counter

from ..events import Step
from .backend import Context
from .drafters import Draft, ModelDrafter, NgramDrafter

LEARNING_RATE = 0.2  # weight of each new observation in the running estimates
PRIOR_ACCEPTANCE = {"ngram": 0.5, "draft": 0.8}
# Plain steps in a row before trying the draft model again, to keep its estimates fresh. Each try
# first feeds the draft model every token since its last use, so tries are kept rare.
EXPLORE_AFTER = 256
EXPLORE_LENGTH = 3
# An n-gram match passed over this many times in a row is tried anyway: its estimate can only
# recover by being tried, and a miss costs one slightly larger verification batch.
NGRAM_RETRY_AFTER = 8
# n-gram drafts cut short of a longer match this many times in a row while they are being accepted:
# the next one is twice as long, so the estimates that rule long drafts out (a big batch's cost timed
# on a busy machine, deep positions learned on other text) are measured again.
LONGER_AFTER = 4
HIGH_ACCEPTANCE = 0.9
CALIBRATION_TOKEN = 1


@dataclass
class Estimate:
    """A running mean that starts from a prior and follows new observations."""

    value: float

    def update(self, observed: float) -> None:
        self.value += LEARNING_RATE * (observed - self.value)


@dataclass
class Costs:
    """Seconds for the target to verify n tokens in one batch, and for the draft model to draft k."""

    verify: dict[int, Estimate] = field(default_factory=dict)
    draft: dict[int, Estimate] = field(default_factory=dict)

    def verify_seconds(self, n: int) -> float:
        return _interpolate(self.verify, n)

    def draft_seconds(self, k: int) -> float:
        return _interpolate(self.draft, k) if k else 0.0


def _interpolate(table: dict[int, Estimate], n: int) -> float:
    if n in table:
        return table[n].value
    below = max((m for m in table if m < n), default=None)
    above = min((m for m in table if m > n), default=None)
    if below is None:
        return table[above].value * n / above
    if above is None:
        return table[below].value * n / below
    share = (n - below) / (above - below)
    return table[below].value + share * (table[above].value - table[below].value)


def calibrate(target: Context, draft: Context | None, max_batch: int) -> Costs:
    """Time a few target batches and draft-model tokens on throwaway positions; leaves both caches empty."""
    costs = Costs()
    # Powers of two: CPU and GPU matmul kernels work in tiles, so batch cost rises in steps that
    # end there (measured on a 2-core CPU: 4 tokens cost less than 3, 16 no more than 12), and
    # interpolating across a step hides its cheap end. Big batches are timed once: they are slow
    # to time and the steps that use them refine the estimate.
    sizes = [1 << i for i in range(max_batch.bit_length()) if 1 << i <= max_batch]
    for n in sizes:
        costs.verify[n] = Estimate(_time(lambda: target.decode([CALIBRATION_TOKEN] * n, logits="all"), target,
                                         repeats=2 if n <= 8 else 1))
    if draft is not None:
        per_token = _time(lambda: draft.decode([CALIBRATION_TOKEN], logits="last"), draft)
        costs.draft[1] = Estimate(per_token)
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


class AutoDrafter:
    """Chooses each step between plain decoding, n-gram lookup and the draft model (if any)."""

    name = "auto"

    def __init__(self, ngram: NgramDrafter, model: ModelDrafter | None, costs: Costs):
        self.ngram = ngram
        self.model = model
        self.costs = costs
        # per drafter, per draft position: P(accepted | the positions before were accepted)
        self.acceptance: dict[str, list[Estimate]] = {"ngram": [], "draft": []}
        self.plain_streak = 0
        self.ngram_passed_over = 0
        self.ngram_cut_short = 0
        self.catch_up_seconds = 0.0

    def begin(self, prompt, sampling, rng) -> None:
        self.ngram.begin(prompt, sampling, rng)
        # The draft model reads the prompt only when first chosen: on machines where it does not
        # pay, it never costs prompt time.
        self.model_started = False
        self.sampling, self.rng = sampling, rng

    def propose(self, history, k) -> Draft:
        best_rate, choice = 1 / self.costs.verify_seconds(1), (None, 0)
        lookup = self.ngram.propose(history, k)
        for length, expected in enumerate(self.expected_tokens("ngram", len(lookup.tokens)), start=1):
            rate = expected / self.costs.verify_seconds(length + 1)
            if rate > best_rate:
                best_rate, choice = rate, ("ngram", length)
        if lookup.tokens and choice[0] is None:
            self.ngram_passed_over += 1
            if self.ngram_passed_over >= NGRAM_RETRY_AFTER:
                choice = ("ngram", min(len(lookup.tokens), EXPLORE_LENGTH))
        if self.model:
            for length, expected in enumerate(self.expected_tokens("draft", k), start=1):
                rate = expected / (self.costs.draft_seconds(length) + self.costs.verify_seconds(length + 1))
                if rate > best_rate:
                    best_rate, choice = rate, ("draft", length)
            if choice[0] is None and self.plain_streak >= EXPLORE_AFTER and k:
                choice = ("draft", min(k, EXPLORE_LENGTH))  # several positions, to learn more than the first
        source, length = choice
        self.plain_streak = self.plain_streak + 1 if source is None else 0
        if source == "ngram":
            self.ngram_passed_over = 0
            return Draft(lookup.tokens[: self._maybe_longer(length, len(lookup.tokens))], source="ngram")
        if source == "draft":
            self._catch_up(history)
            return self.model.propose(history, length)
        return Draft()

    def _maybe_longer(self, length: int, available: int) -> int:
        # Gated on the chosen draft's own last position, which every step observes: the positions
        # past it may hold stale estimates from other text that only a longer try can refresh.
        if length == available or self._acceptance("ngram", length - 1) < HIGH_ACCEPTANCE:
            self.ngram_cut_short = 0
            return length
        self.ngram_cut_short += 1
        if self.ngram_cut_short < LONGER_AFTER:
            return length
        self.ngram_cut_short = 0
        return min(2 * length, available)

    def _catch_up(self, history) -> None:
        """Bring the draft model up to history, timed apart: its cost per drafted token must not
        include reading the tokens decided while it was idle."""
        started = perf_counter()
        if not self.model_started:
            self.model.begin(history, self.sampling, self.rng)
            self.model_started = True
        self.model.catch_up(history)
        self.catch_up_seconds = perf_counter() - started

    def expected_tokens(self, source: str, k_max: int) -> list[float]:
        """E(1) .. E(k_max), in one pass."""
        expected, reach, out = 1.0, 1.0, []
        for position in range(k_max):
            reach *= self._acceptance(source, position)
            expected += reach
            out.append(expected)
        return out

    def _acceptance(self, source: str, position: int) -> float:
        # A position never tried is taken to be as likely as the deepest one tried: in a run of copied
        # text the first positions fill in at nearly 1, and long drafts become worth trying.
        rates = self.acceptance[source]
        if position < len(rates):
            return rates[position].value
        return rates[-1].value if rates else PRIOR_ACCEPTANCE[source]

    def observe(self, step: Step) -> None:
        n = step.drafted + 1
        self.costs.verify.setdefault(n, Estimate(self.costs.verify_seconds(n))).update(step.verify_seconds)
        if step.drafter not in self.acceptance or not step.drafted:
            return
        # Position i was tried only if all before it were accepted.
        rates = self.acceptance[step.drafter]
        for position in range(min(step.accepted + 1, step.drafted)):
            if position == len(rates):
                rates.append(Estimate(self._acceptance(step.drafter, position)))
            rates[position].update(1.0 if position < step.accepted else 0.0)
        if step.drafter == "draft":
            k = step.drafted
            drafting = step.draft_seconds - self.catch_up_seconds
            self.costs.draft.setdefault(k, Estimate(self.costs.draft_seconds(k))).update(drafting)
