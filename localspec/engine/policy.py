"""How much to draft, and with what: chosen each step to maximise expected tokens per second.

A step that drafts k tokens with drafter d is expected to emit

    E(k) = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_k

tokens, where a_i is the acceptance at draft position i given that the positions
before were accepted, and to take T(k) = draft_d(k) + verify(k + 1). The policy
compares E(k) / T(k) across drafters and k (k = 0 is a plain step).

Acceptance is a belief, not a number (belief.py): a Beta distribution per drafter, per kind
of evidence behind the proposal and per position. A draft is *sure* when it pays even at the
doubtful side of its beliefs; the best sure draft, or a plain step, is the default.

An n-gram proposal is deterministic and costs nothing to make, so its beliefs are
learned from the text itself: every step's lookup, drafted or not, is scored
against the tokens the target goes on to commit. (Greedy: a draft token is
accepted exactly when the target commits it. Sampling: a deterministic draft
token x is accepted with probability p(x), the chance the target commits x.) A
copied passage earns n-gram drafts within a few plain steps, and chance matches in a
long document are found out without verifying a single one of them. A kind of
evidence seen for the first time starts from what the next weaker kind (a shorter
match) has shown, else from a doubtful PRIOR.

A draft model's proposals (and the target's MTP block's) cost a forward pass
each, so what it would have proposed is known only where it drafted. A draft
with it that is not sure is a *probe*: a draft that pays only if acceptance
sits at the hopeful end. A probe that fails costs up to T(k) - verify(1) (the
drafter's catch-up included, if it must first read what it missed), so probes
are paid from a bucket of time that
fills at PROBE_SHARE of decode time and empties by what probes lose against plain
decoding: the time lost to drafts that were not sure stays under about 2% of decode
time.

What earlier generations taught carries over only as a prior worth SESSION_WEIGHT
observations for a kind's first position, read only until the new text has shown
its own evidence for that position. How far a run of accepted tokens goes on is a
property of the text at hand: a retrieval answer quotes a dozen tokens of its
document where a code edit copies hundreds, so a long draft must be earned by the
text's own evidence (a kind first seen in a generation starts from what a shorter
match has shown in it, else from the PRIOR, and a draft position no text has
scored yet is doubted by how long the copy has held so far, by the rule of
succession, however well the shallower positions did). Within a generation old
observations fade (FORGET), so a text that stops copying its input soon stops
being drafted for.

Where a change of batch size costs (a GPU: costs.py), a free drafter's draft after a plain step is
also charged its share of the way back to held plain steps: the reshape and recapture that the plain
steps after the run of drafts it starts will pay, times how often a run with that drafter has ended
after a step (ENDING): a chance match in a math answer ends its run at once and pays it all, a long
copy spreads it. Weighed by its own reshape alone, such drafts looked to pay wherever their tokens did.
A costly drafter is left to its probe bucket: its runs go on while it drafts (charged this, a draft
model lost 5-30% of its gain on an 8B target's predicted costs).

Where the chosen draft holds alternatives, it is grown into a draft tree by those that raise the
expected rate (branching.py).

What each step costs is costs.py's.
"""

from collections.abc import Callable, Generator
from dataclasses import dataclass, replace

from ..config import DrafterKind
from ..events import Step
from .belief import HOPEFUL, MEAN, PRIOR, SURE, Belief, copy_goes_on, untried
from .branching import Fork, TreeWeighing
from .costs import Costs
from .drafters import CostlyDrafter, Draft, Drafter, Evidence, Probe, proposal
from .screens import HORIZON, Option, Screen, Weighing, front
from .turns import Turn, decoded_alone

PROBE_SHARE = 0.02  # of decode time, at most lost to probes that did not pay
# The probe bucket starts with one plain step's time (so the first probe can happen at once) and
# holds at most a few, so a long sure stretch does not save up for a burst of probes.
BUCKET_START = 1.0
BUCKET_LIMIT = 4.0
SESSION_WEIGHT = 2.0  # observations' worth of what earlier generations taught
# A costly drafter carries its first position as the session's generations showed it, fading by this a draft
# (the last ~100 weigh most), not as the last generation left it: a generation whose first two drafts missed
# (it drafted no more) made a draft model right 95% of the time read 0.4, and on a GPU (where it reads the
# prompt only if it would pay) it was never tried again, its catch-up of a whole prompt being more than any
# probe may risk.
LASTING_FORGET = 0.99
# How often a draft model made for its target is right a position (matched pairs measure 0.6-0.9), and the
# longest draft weighed at that rate: where such drafts would pay, a costly drafter no earlier generation
# found worse reads the prompt with the target (begin says why).
TYPICAL_ACCEPTANCE = 0.8
TYPICAL_LENGTH = 8
ENDING = Belief(1.0, 1.0)  # how often a run of drafts with a free drafter ends after a step, before one has


@dataclass
class Choice:
    rate: float  # expected tokens per second
    option: Option | None = None
    length: int = 0
    probe: bool = False


@dataclass
class Shadow:
    """A free drafter's proposal (n-gram lookup, the suffix cache), drafted or not, waiting for the text to
    show how much of it was right."""

    start: int  # where in history its first token would go
    tokens: list[int]
    evidence: Evidence
    drafter: DrafterKind  # the free drafter that proposed it
    scored: int = 0  # positions already learned from


@dataclass
class Bucket:
    """Seconds that probes may still lose: filled by decoding, emptied by probes that lost."""

    seconds: float
    limit: float

    def fill(self, decoded_seconds: float) -> None:
        self.seconds = min(self.limit, self.seconds + PROBE_SHARE * decoded_seconds)


# Where in a belief acceptance is read, in standard deviations from the mean: a sure draft pays even
# one deviation below it (on a text of chance matches, half a deviation let one step in thirty draft
# on beliefs that happened to run high). A probe is worth its chance if it would pay three deviations above:
# for a draft model never seen (PRIOR) that is acceptance 1, so it is tried wherever verifying a few
# more tokens costs less than decoding them one by one, and one or two misses rule it out for the
# rest of the generation. How often probes happen is the bucket's business.


Key = tuple[DrafterKind, Evidence | None]  # beliefs are kept per drafter and kind of evidence

# Drafters whose proposals cost a look-up: their beliefs learn from the text whether drafted or not,
# so they are never probed.
FREE = frozenset({DrafterKind.NGRAM, DrafterKind.SUFFIX})


def _this_and_weaker(key: Key) -> list[Key]:
    """A kind of evidence and the same evidence with ever shorter matches, strongest first."""
    drafter, evidence = key
    kinds = [key]
    while evidence is not None and (evidence := evidence.weaker()) is not None:
        kinds.append((drafter, evidence))
    return kinds


class AutoDrafter(TreeWeighing):
    """Chooses each step between plain decoding, n-gram lookup, the draft model and the target's MTP
    block (those there are)."""

    kind = DrafterKind.AUTO

    def __init__(self, ngram: Drafter, costly: list[CostlyDrafter], costs: Costs, suffix: Drafter | None = None,
                 alongside: Callable[[], tuple[int, int]] = lambda: (0, 0), branches: int = 1):
        """ngram, suffix: the free drafters (n-gram lookup in this text, the suffix cache of earlier
        generations), whose proposals name their Evidence, each weighed with beliefs of its own; costly: the
        drafters whose drafts cost a forward pass a token (a draft model, the target's MTP block), each
        weighed with its own costs and beliefs under its kind. alongside: the rows other sequences are
        expected to add to the next step's batch, and how many sequences they are (parallel sequences of
        one context): a step is then weighed by the tokens all of them make in the time it takes, each
        other sequence counted for one token (what their drafts make is theirs, paid by their rows).
        branches: the most a draft tree may have (the target's room for them; 1: chains only): a free
        drafter's chain grows the alternatives it holds where they raise the expected rate."""
        self.alongside, self.branches = alongside, branches
        # (drafter, rank) -> P(the alternative of that rank at a fork is right | the chain was wrong there)
        self.ranks: dict[tuple[DrafterKind, int], Belief] = {}
        self.ngram = ngram
        self.suffix = suffix
        self.costly = {drafter.kind: drafter for drafter in costly}
        self.costs = costs
        # (drafter, evidence) -> per draft position: P(accepted | the positions before were accepted),
        # learned in this generation
        self.beliefs: dict[Key, list[Belief]] = {}
        # (drafter, evidence) -> the first position's belief as earlier generations left it
        self.carried: dict[Key, Belief] = {}
        # costly drafter -> its first position over the session's generations (LASTING_FORGET): what it carries
        self.lasting: dict[DrafterKind, Belief] = {}
        self.bucket: Bucket | None = None  # made at the first generation, when costs are known
        self.screens: dict[DrafterKind, Screen] = {}
        self._others_tokens = 0  # the other sequences' tokens in the step being weighed
        # free drafter -> P(the step after one that drafted with it drafts nothing): a run of its drafts ends
        self.endings: dict[DrafterKind, Belief] = {}
        self._way_back = 0.0  # what the plain steps after a run of drafts started now would pay for changes of size

    def begin(self, prompt, sampling, rng) -> None:
        for drafter in self._free():
            drafter.begin(prompt, sampling, rng)
        # (a costly drafter's beliefs are all in its lasting one: it carries that)
        self.carried.update({key: positions[0].held_to(SESSION_WEIGHT)
                             for key, positions in self.beliefs.items() if positions and key[0] not in self.lasting})
        self.carried.update({(kind, None): belief.held_to(SESSION_WEIGHT) for kind, belief in self.lasting.items()})
        self.beliefs = {}
        for drafter in self.costly.values():
            # A costly drafter reads the prompt while the target does (as fixed drafting has it) only where it
            # would pay here: on machines where it does not, it never costs prompt time, and its first draft
            # reads all it lacks. Left to its first draft, the prompt's catch-up would be a probe's risk the
            # bucket never holds wherever a token of it costs more than PROBE_SHARE of a plain step (a 0.5B
            # draft for an 8B target on an H200: 0.03), and the draft model would never be tried.
            if self._would_pay(drafter.kind):
                drafter.begin(prompt, sampling, rng)
            else:
                drafter.prepare(sampling, rng)
        self.shadows: list[Shadow] = []
        self.forks: list[Fork] = []
        self.screens.clear()
        if self.bucket is None:
            plain = self.costs.verify_seconds(1)
            self.bucket = Bucket(BUCKET_START * plain, BUCKET_LIMIT * plain)
        self.chosen: Choice = Choice(0.0)
        # the target's last two batch sizes (the last one second): the prompt's is none a step has
        self.sizes: tuple[int | None, int | None] = (None, None)
        self._drafted_with: DrafterKind | None = None  # the last step's drafter, if it drafted

    def _would_pay(self, kind: DrafterKind) -> bool:
        """Whether a draft of some length with this costly drafter, right a position as often as earlier
        generations found it (else TYPICAL_ACCEPTANCE), would beat a plain step on this machine's costs."""
        carried = self.carried.get((kind, None))
        acceptance = carried.mean if carried is not None else TYPICAL_ACCEPTANCE
        verify = self.costs.verify_table(TYPICAL_LENGTH + 1)
        drafting = self.costs.draft_table(kind, TYPICAL_LENGTH)
        return any(sum(acceptance ** i for i in range(n + 1)) / (drafting[n - 1] + verify[n]) > 1 / verify[0]
                   for n in range(1, TYPICAL_LENGTH + 1))

    def _free(self) -> list[Drafter]:
        return [self.ngram] + ([self.suffix] if self.suffix else [])

    def forget(self) -> None:
        """Drop what earlier generations taught (a benchmark's fresh session); costs stay, being the machine's."""
        self.beliefs.clear()
        self.carried.clear()
        self.lasting.clear()
        self.ranks.clear()
        self.screens.clear()
        self.endings.clear()
        self.bucket = None

    def propose(self, history, k) -> Draft:
        return decoded_alone(self.proposing(history, k))

    def proposing(self, history: list[int], k: int) -> Generator[Turn, None, Draft]:
        self._learn_from_text(history)
        rows, self._others_tokens = self.alongside()
        # the whole step's, others' rows and all, and what its batch's size costs after the last ones
        plain_seconds = self.costs.verify_seconds(rows + 1, self.sizes)
        # a run of drafts that starts here leaves held plain steps (alone: beside other sequences' drafts the
        # batch's size changes whatever this one does)
        self._way_back = (self.costs.level * (self.costs.reshape + self.costs.recapture)
                          if rows == 0 and self.sizes[1] == 1 else 0.0)
        options, lookups = [], {}
        for drafter in self._free():
            lookup = drafter.propose(history, k)
            if lookup.tokens:
                lookups[drafter.kind] = lookup
                options.append(Option(drafter.kind, lookup.evidence, len(lookup.tokens), run=lookup.run))
                self.shadows.append(Shadow(len(history), lookup.tokens, lookup.evidence, drafter.kind))
                self.forks += self._forks(len(history), lookup)
        may_be_sure, may_probe = list(options), []
        # A costly drafter is weighed length by length only where its screen says a draft of it could
        # beat a plain step: where it does not pay, a step that drafts nothing costs a look-up.
        step = Weighing.of(self.costs, self.sizes) if k and self.costly else None
        for kind, drafter in self.costly.items() if step else ():
            once_seconds = self.costs.catch_up_seconds(kind, drafter.behind(history))
            screen, catch_up = self._screen(kind, k), once_seconds / step.level
            sure, probe = screen.may_be_sure(step, catch_up), screen.may_probe(step, catch_up, self.bucket.seconds)
            if sure or probe:
                option = Option(kind, None, k, once_seconds)
                options.append(option)
                if sure:
                    may_be_sure.append(option)
                if probe:
                    may_probe.append(option)
        plain_rate = (1 + self._others_tokens) / plain_seconds
        if not options:
            self.chosen = Choice(plain_rate)
            return Draft.nothing()
        # seconds[option][n - 1]: drafting and verifying n tokens with it (a one-off catch-up apart)
        # verify[n]: a step with n + 1 rows of this sequence's, after the others' rows
        verify = self.costs.verify_table(rows + max((option.most for option in options), default=0) + 1,
                                         self.sizes)[rows:]
        seconds = {option: [drafting + verifying for drafting, verifying
                            in zip(self.costs.draft_table(option.drafter, option.most), verify[1:])]
                   for option in options}
        # The sure option is the one whose best length pays most even on the doubtful side of its
        # beliefs. It drafts the length it is expected to do best at, of those that beat a plain
        # step on the doubtful side: reading every position's noisy belief at its doubtful side
        # would stop it short wherever one deep position happened to read low. An n-gram position
        # the text has not scored is read at its doubtful side all the same: every lookup is scored
        # for free as far as it offered, so such a position is one this text has never shown a copy
        # reach. At its mean (the deepest scored position's), a math answer that copies three tokens
        # of its question and departs would draft a dozen more wherever verifying 16 tokens costs
        # little more than 8. A draft model learns its deeper positions only by drafting them, so
        # there the mean leads.
        doubtful = {option: self._rates(option, seconds[option], SURE) for option in may_be_sure}
        sure = Choice(plain_rate)
        likeliest = max(may_be_sure, key=lambda option: max(doubtful[option]), default=None)
        if likeliest is not None and max(doubtful[likeliest]) > plain_rate:
            expected = self._rates(likeliest, seconds[likeliest], MEAN, beyond=self._beyond(likeliest))
            length = max((n for n in range(1, likeliest.most + 1) if doubtful[likeliest][n - 1] > plain_rate),
                         key=lambda n: expected[n - 1])
            sure = Choice(expected[length - 1], likeliest, length)
        sure_seconds = seconds[sure.option][sure.length - 1] if sure.option else plain_seconds

        def risk(option: Option, length: int) -> float:
            """What a probe may lose: all of it against a plain step, or, for a longer draft with
            the sure option, the positions beyond the sure ones."""
            if option == sure.option:
                return seconds[option][length - 1] - sure_seconds if length > sure.length else float("inf")
            return seconds[option][length - 1] + option.once_seconds - plain_seconds

        # Only the draft model (or MTP block) is probed: n-gram beliefs learn from the text at no cost.
        choice = self._best([o for o in options if o.drafter not in FREE and (o in may_probe or o == sure.option)],
                            seconds, HOPEFUL, sure, risk)
        choice.probe = choice is not sure
        self.chosen = choice
        if choice.option is None:
            return Draft.nothing()
        if choice.option.drafter in FREE:
            draft = lookups[choice.option.drafter]
        else:
            draft = yield from proposal(self.costly[choice.option.drafter], history, choice.length)
            self.forks += self._forks(len(history), draft)  # its runner-ups, known only where it drafted
        length = min(choice.length, len(draft.tokens))
        tree = self._tree(draft, choice.option, length, choice.length, seconds[choice.option], rows) if length else None
        return replace(draft, tokens=draft.tokens[:length], tree=tree, probe=Probe(plain_seconds) if choice.probe else None)

    @staticmethod
    def _beyond(option: Option) -> float | None:
        """How positions the text has not scored are read at the mean: a free drafter's at their doubtful side,
        a costly drafter's at the mean (proposing says why)."""
        return SURE if option.drafter in FREE else None

    def _screen(self, kind: DrafterKind, most: int) -> Screen:
        """The costly drafter's screen for drafts of up to `most` tokens, made anew if what it was taken
        from has moved."""
        screen = self.screens.get(kind)
        key = (kind, None)
        token = self.costs.drafts[kind].token if kind in self.costs.drafts else 0.0
        if (screen is not None and screen.option.most >= most and screen.positions is self.beliefs.get(key)
                and screen.shape == self.costs.shape and screen.token == token):
            return screen
        option = Option(kind, None, most)
        relative = self.costs.relative(option.most + 1)
        # draft(n) + verify(n + 1), in verify(1)s
        units = [drafting / self.costs.level + relative[n]
                 for n, drafting in enumerate(self.costs.draft_table(option.drafter, option.most), start=1)]
        expected = {(hope, None): self.expected_tokens(option, hope) for hope in (SURE, HOPEFUL)}
        best_plain = relative[0] + max(self.costs.reshape, self.costs.recapture)
        screen = Screen(option, self.beliefs[key], self.costs.shape, token,
                        front(units, expected[SURE, None], best_plain), front(units, expected[HOPEFUL, None], best_plain),
                        expected)
        self.screens[option.drafter] = screen
        return screen

    def _best(self, options: list[Option], seconds: dict, hope: float, best: Choice, risk) -> Choice:
        """The option and length with the highest expected rate above best's, acceptance seen at
        `hope`. risk(option, length): what the draft may lose; only what the probe bucket can pay
        is considered."""
        for option in options:
            for length, rate in enumerate(self._rates(option, seconds[option], hope), start=1):
                if rate > best.rate and risk(option, length) <= self.bucket.seconds:
                    best = Choice(rate, option, length)
        return best

    def _rates(self, option: Option, seconds: list[float], hope: float, beyond: float | None = None) -> list[float]:
        """Expected tokens per second of drafting 1 .. option.most tokens, the other sequences' of the step
        counted in. A one-off cost counts in proportion to the tokens the step makes of the horizon."""
        screen = self.screens.get(option.drafter)  # a costly drafter's, taken this step
        tokens = (screen.expected_tokens(self.expected_tokens, hope, beyond) if screen
                  else self.expected_tokens(option, hope, beyond))
        way_back = self._way_back * self.endings.get(option.drafter, ENDING).mean if option.drafter in FREE else 0.0
        return [(expected + self._others_tokens) / (s + option.once_seconds * expected / HORIZON + way_back)
                for expected, s in zip(tokens, seconds)]

    def expected_tokens(self, option: Option, hope: float = MEAN, beyond: float | None = None) -> list[float]:
        """E(1) .. E(option.most), in one pass; positions this generation has not scored are read at
        `beyond` (default: hope)."""
        beyond = hope if beyond is None else beyond
        key = (option.drafter, option.evidence)
        positions = self._positions(key)
        views = [belief.view(hope) for belief in positions[: option.most]] or [self._first(key).view(hope)]
        unscored = untried(positions).view(beyond)
        expected, reach, out = 1.0, 1.0, []
        for position in range(option.most):
            if position < len(views):
                reach *= views[position]
            elif option.drafter in FREE:
                reach *= min(unscored, copy_goes_on(option.run + position, beyond))
            else:
                reach *= unscored
            expected += reach
            out.append(expected)
        return out

    def _first(self, key: Key) -> Belief:
        """The first position of a kind this generation has not tried: what earlier generations
        left about it, or about a shorter match, else the PRIOR."""
        return next((self.carried[kind] for kind in _this_and_weaker(key) if kind in self.carried), PRIOR)

    def _positions(self, key: Key) -> list[Belief]:
        """This generation's beliefs about a kind of evidence. One seen for the first time starts as
        a copy of the nearest weaker kind's: a match that runs further back is no worse a sign, so
        that is a cautious estimate, and a copy that grows past a length class need not be learned
        again from nothing."""
        if key not in self.beliefs:
            inherited = next((self.beliefs[kind] for kind in _this_and_weaker(key)[1:] if self.beliefs.get(kind)), [])
            self.beliefs[key] = [replace(belief) for belief in inherited]
        return self.beliefs[key]

    def observe(self, step: Step) -> None:
        """Learn from a verified step. Whether it was a probe is read from the step, not from the choice:
        the loop drops a draft shorter than draft_min, and what was not verified lost nothing."""
        rows = step.drafted + 1 + step.batch_rows
        if self._drafted_with in FREE:
            self.endings.setdefault(self._drafted_with, replace(ENDING)).observe(not step.drafted)
        self._drafted_with = step.drafter if step.drafted else None
        self.costs.observe_verify(rows, step.verify_seconds, self.sizes)
        self.sizes = (self.sizes[1], rows)
        self.bucket.fill(step.draft_seconds + step.verify_seconds)
        if step.probe:
            self.bucket.seconds -= step.lost_seconds
        option = self.chosen.option
        if option is not None and option.drafter == step.drafter and step.drafter not in FREE and step.drafted:
            # Position i was tried only if all before it were accepted.
            self._learn((step.drafter, None), 0, min(step.accepted + 1, step.drafted), step.accepted)
            self.lasting.setdefault(step.drafter, Belief(0.0, 0.0)).observe(step.accepted > 0, LASTING_FORGET)
            self.costs.observe_draft(step.drafter, step.drafted, step.draft_seconds - step.catch_up_seconds)

    def _learn_from_text(self, history: list[int]) -> None:
        """Learn from each n-gram proposal as far as the committed tokens now tell its fate."""
        waiting = []
        for shadow in self.shadows:
            written = history[shadow.start : shadow.start + len(shadow.tokens)]
            agreed = next((i for i, (a, b) in enumerate(zip(written, shadow.tokens)) if a != b), len(written))
            self._learn((shadow.drafter, shadow.evidence), shadow.scored, min(agreed + 1, len(written)), agreed)
            shadow.scored = agreed
            if agreed == len(written) < len(shadow.tokens):
                waiting.append(shadow)  # right so far; the rest is not written yet
        self.shadows = waiting
        self._learn_forks(history)

    def _learn(self, key: Key, first: int, tried: int, accepted: int) -> None:
        """Positions first .. tried - 1 were tried; those before `accepted` were accepted."""
        positions = self._positions(key)
        self.screens.pop(key[0], None)  # taken from beliefs that now move
        for position in range(first, tried):
            if position == len(positions):
                positions.append(replace(untried(positions)))
            positions[position].observe(position < accepted)
