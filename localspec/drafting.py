"""A session's drafting: the words that ask for it (--draft, --spec), and the drafters a loaded session
drafts with (n-gram lookup, the suffix cache of earlier generations, the costly drafters its plan made,
auto over them, and each sequence's own twins of them), with the mode they draft in."""

from collections.abc import Iterator
from contextlib import closing
from dataclasses import replace

from . import running

from .store import calibration, hardware, registry
from .config import SPEC_CHOICES, DrafterKind, Speculation
from .engine import costs as step_costs
from .engine import policy
from .engine.backend import Context
from .engine.drafters import (CostlyDrafter, Drafter, ModelDrafter, NgramDrafter, NoDrafter, PredictionDrafter,
                              SuffixDrafter)
from .engine.drafters.spec import (PUBLISHED_KINDS, SPEC, DraftPlan, DrafterSpec, Weights, check_mode, draft_limit,
                                   longest_draft, needed)
from .engine.suffix import SuffixCache
from .errors import UsageError
from .events import Done, Event, Token


def speculating(draft: str | None, spec: str = "auto") -> tuple[DrafterKind, str | None]:
    """The CLI's --draft and --spec (and load()'s draft and spec) as the kind to draft with and the draft
    model to load, if any. draft: a draft model, "ngram", "mtp" or None; spec: auto, fixed or off."""
    if spec not in SPEC_CHOICES:
        raise UsageError(f"--spec must be one of {', '.join(SPEC_CHOICES)}, got {spec!r}")
    if spec == "off":
        return DrafterKind.PLAIN, None
    if draft in (*PUBLISHED_KINDS, registry.ASSISTANT):  # one published beside the target
        return DrafterKind.MTP if draft == registry.ASSISTANT else DrafterKind(draft), None
    draft_model = None if draft in (None, DrafterKind.NGRAM) else draft
    if spec == "fixed":
        return (DrafterKind.DRAFT if draft_model else DrafterKind.NGRAM), draft_model
    return DrafterKind.AUTO, draft_model


class Drafters:
    """The drafters of a loaded session and the mode they draft in (chat's /draft and bench switch it).

    The first sequence drafts with the session's own drafters; every other sequence with twins of its own
    (each drafter keeps the state of its generation, a costly one on the sequence's part of its context).
    Auto's costs are measured at its first use (or read from an earlier run on this machine) and kept at
    close where the machine was quiet meanwhile."""

    def __init__(self, plan: DraftPlan, speculation: Speculation, sequences: list[Context],
                 costly: dict[DrafterSpec, CostlyDrafter], settings: dict):
        """costly: the drafters the plan's costly specs made; settings: what decides how llama.cpp computes,
        and so auto's costs."""
        self.speculation, self.sequences, self._settings = speculation, sequences, settings
        self.specs = {spec.kind: spec for spec in costly}
        self.costly = {drafter.kind: drafter for drafter in costly.values()}
        # the drafters hold alternatives for trees where the target has room for them (a draft model its
        # runner-ups, greedy); fixed drafting grows them into trees where asked by --draft-branches, auto
        # where they pay
        room = sequences[0].branch_room
        alternatives = room - 1 if room > 1 else 0
        branching = speculation.branches is not None and alternatives > 0
        self._alternatives, self._branching = alternatives, branching
        self.ngram = NgramDrafter(speculation.ngram_min, speculation.ngram_max, alternatives, branching)
        for drafter in self.costly.values():
            self._hold_alternatives(drafter)
        # earlier generations, for auto to draft from: this target's only, in this process's memory only
        self.suffix = SuffixDrafter(SuffixCache(), alternatives) if speculation.suffix_cache else None
        self._memories: dict[str, SuffixCache] = {}  # bench's: each mode's own suffix cache, by name
        self._auto: policy.AutoDrafter | None = None
        self._twins: dict[tuple[int, DrafterKind], Drafter] = {}
        self._costly_twins: dict[int, dict[DrafterKind, CostlyDrafter]] = {}
        self.default_mode = plan.mode
        self.use(plan.mode)

    def use(self, mode: DrafterKind) -> None:
        """Generate with this kind of drafting from now on."""
        self.drafter = self._own_drafter(self.check(mode))
        self.mode = DrafterKind(mode)

    def check(self, mode: DrafterKind) -> DrafterKind:
        """The mode, where this session can draft in it; UsageError naming what it lacks else."""
        mode = check_mode(mode)
        if mode not in (DrafterKind.PLAIN, DrafterKind.NGRAM, DrafterKind.AUTO) and mode not in self.costly:
            raise UsageError(needed(mode))
        return mode

    def _own_drafter(self, mode: DrafterKind) -> Drafter:
        if mode == DrafterKind.AUTO:
            return self.auto()
        if mode == DrafterKind.NGRAM:
            return self.ngram
        return NoDrafter() if mode == DrafterKind.PLAIN else self.costly[mode]

    def auto(self) -> policy.AutoDrafter:
        """The first sequence's auto drafter, its costs measured (or read) at the first call."""
        if self._auto is None:
            target = self.sequences[0]
            batch = min(longest_draft(self.speculation) + 1, target.max_rows)
            contexts = {kind: drafter.context for kind, drafter in self.costly.items()}
            self._costs_key = {
                "machine": hardware.identity(), "settings": self._settings,
                "target": [calibration.file_identity(target.model.path), target.n_batch, batch],
                "drafts": {kind: [calibration.file_identity(context.model.path), context.n_batch]
                           for kind, context in contexts.items()},
            }
            self._others = running.OtherWork()  # costs are kept if the machine was quiet while they were measured

            def measured() -> step_costs.Costs:
                found = step_costs.calibrate(target, contexts, batch)
                # kept at once, not only at close: serve's session lives for days, and a machine busy at any
                # moment of them left its next start measuring again
                if calibration.quiet(self._others, self._settings["threads"], unknown=False):
                    calibration.keep(self._costs_key, found)
                return found

            costs = calibration.costs(self._costs_key, measured)
            self._auto = policy.AutoDrafter(self.ngram, list(self.costly.values()), costs, self._suffix_of_a_sequence(),
                                            alongside=lambda: (target.others, target.alongside),
                                            branches=max(1, target.branch_room))
        return self._auto

    def _hold_alternatives(self, drafter: CostlyDrafter) -> None:
        if isinstance(drafter, ModelDrafter):
            drafter.alternatives, drafter.branching = self._alternatives, self._branching

    def _suffix_of_a_sequence(self) -> SuffixDrafter | None:
        """The suffix drafter a sequence's auto drafts with: the session's own where it has one sequence;
        else one of the sequence's, given the session's cache of the moment at each generation (remember_as
        may choose another for the next request while this one runs)."""
        if self.suffix is None or len(self.sequences) == 1:
            return self.suffix
        return SuffixDrafter(None, self._alternatives)

    def of(self, sequence: int, prediction: list[int] | None = None, mode: DrafterKind | None = None,
           speculation: Speculation | None = None) -> Drafter:
        """What a generation on this sequence drafts with in this mode (default: the current one): with the
        prediction first, where one is given and the mode drafts (up to speculation's length, default the
        session's)."""
        mode = self.mode if mode is None else self.check(mode)
        if sequence != 0:
            drafter = self._twin(sequence, mode)
        else:
            drafter = self.drafter if mode == self.mode else self._own_drafter(mode)
        if isinstance(drafter, policy.AutoDrafter) and drafter.suffix is not None:
            drafter.suffix.cache = self.suffix_cache
        if prediction and mode != DrafterKind.PLAIN:
            drafter = PredictionDrafter(prediction, drafter, draft_limit(speculation or self.speculation, mode),
                                        self._alternatives if self._branching else 0)
        return drafter

    def _twin(self, sequence: int, mode: DrafterKind) -> Drafter:
        key = (sequence, mode)
        if key not in self._twins:
            view, costly = self.sequences[sequence], self._costly_of(sequence)
            self._twins[key] = (
                policy.AutoDrafter(self.ngram.for_sequence(), list(costly.values()), self.auto().costs,
                                   self._suffix_of_a_sequence(), alongside=lambda: (view.others, view.alongside),
                                   branches=max(1, view.branch_room))
                if mode == DrafterKind.AUTO else
                self.ngram.for_sequence() if mode == DrafterKind.NGRAM else
                costly[mode] if mode in costly else NoDrafter())
        return self._twins[key]

    def _costly_of(self, sequence: int) -> dict[DrafterKind, CostlyDrafter]:
        """The costly drafters of a sequence but the first (its own, kept for every mode), by kind."""
        if sequence not in self._costly_twins:
            self._costly_twins[sequence] = {kind: drafter.for_sequence(self.sequences[sequence], sequence)
                                            for kind, drafter in self.costly.items()}
            for drafter in self._costly_twins[sequence].values():
                self._hold_alternatives(drafter)
        return self._costly_twins[sequence]

    @property
    def limit(self) -> int:
        """Most tokens drafted a step in the current mode."""
        return draft_limit(self.speculation, self.mode)

    def costs(self) -> dict | None:
        """What the auto policy measured of this machine, once it has run."""
        return self._auto.costs.as_dict() if self._auto else None

    def forget(self) -> None:
        """Start the auto policy's learning about acceptance afresh, and forget earlier generations; the
        costs it measured stay, being the machine's."""
        for auto in [self._auto, *self._twins.values()]:
            if isinstance(auto, policy.AutoDrafter):
                auto.forget()
        if self.suffix is not None:
            self._memories.clear()
            self.suffix.cache = SuffixCache()

    def remember_as(self, name: str | None) -> None:
        """Keep generations in, and draft from, a suffix cache of this name's own from now on (None: in none)."""
        if self.suffix is not None:
            self.suffix.cache = None if name is None else self._memories.setdefault(name, SuffixCache())

    @property
    def suffix_cache(self) -> SuffixCache | None:
        return self.suffix.cache if self.suffix else None

    @property
    def remembered(self) -> tuple[int, int] | None:
        """The tokens its suffix caches hold (the one in use and the named ones) and the bytes they take."""
        if self.suffix is None:
            return None
        caches = {id(cache): cache for cache in [self.suffix.cache, *self._memories.values()] if cache}
        return sum(cache.tokens for cache in caches.values()), sum(cache.nbytes for cache in caches.values())

    def remembering(self, events: Iterator[Event], prompt: list[int]) -> Iterator[Event]:
        """The events, and the generation added to the suffix cache in use once it ends, with as much of its
        prompt before it as a match reaches back (so its first tokens can be drafted too)."""
        cache = self.suffix_cache
        if cache is None:
            return events
        return _remembered(events, prompt, cache)

    def reset(self, sequence: int | None = None) -> None:
        """Empty the costly drafters' caches: all of them, or one sequence's."""
        twins = self._costly_twins.values() if sequence is None else [self._costly_twins.get(sequence, {})]
        for costly in twins:
            for drafter in costly.values():
                drafter.context.truncate(0)
        if not sequence:
            for drafter in self.costly.values():
                drafter.context.truncate(0)

    def contexts_of(self, sequence: int) -> list[Context]:
        """The contexts a sequence's costly drafters draft on."""
        costly = self.costly if sequence == 0 else self._costly_of(sequence)
        return [drafter.context for drafter in costly.values()]

    @property
    def contexts(self) -> list[Context]:
        """The costly drafters' own contexts."""
        return [drafter.context for drafter in self.costly.values()]

    @property
    def with_files(self) -> bool:
        """Whether a drafter drafts from a file of its own (a draft model, a sidecar)."""
        return any(spec.weights in (Weights.FILE, Weights.MTP_FILE) for spec in self.specs.values())

    def describe(self) -> str:
        """What drafts in the current mode, for the panel and summary line."""
        named = {kind: spec.describe(self.costly[kind].context.model.path.name) for kind, spec in self.specs.items()}
        if self.mode == DrafterKind.AUTO:
            return "auto: " + _either([SPEC["ngram"].label, *named.values()])
        return named.get(self.mode) or SPEC[self.mode].label

    def close(self, threads: int) -> None:
        """Keep what real steps corrected of auto's costs, for the next load, where the machine was quiet."""
        if self._auto is not None and calibration.quiet(self._others, threads):
            calibration.keep(self._costs_key, self._auto.costs)


def _remembered(events: Iterator[Event], prompt: list[int], cache: SuffixCache) -> Iterator[Event]:
    output = []
    with closing(events):
        for event in events:
            if isinstance(event, Token):
                output.append(event.id)
            elif isinstance(event, Done):
                try:
                    cache.add(prompt[-cache.depth :] + output)
                except BaseException:  # Ctrl-C half-way leaves its arrays out of step with each other
                    cache.clear()
                    raise
            yield event


def _either(names: list[str]) -> str:
    """The names that are not empty, as "a, b or c"."""
    names = [name for name in names if name]
    return " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


class Steering:
    """A part of Session: its drafting steered (the mode, the longest draft, what auto learns and the generations
    it remembers), by its drafters (drafting: Drafters) and within its target's batch (target)."""

    @property
    def speculation(self) -> Speculation:
        """How it drafts (bench steers each mode's speculation by assigning it)."""
        return self.drafting.speculation

    @speculation.setter
    def speculation(self, speculation: Speculation) -> None:
        self.drafting.speculation = speculation

    @property
    def mode(self) -> DrafterKind:
        """The kind of drafting it generates with now."""
        return self.drafting.mode

    @property
    def default_mode(self) -> DrafterKind:
        """The kind of drafting it was opened with."""
        return self.drafting.default_mode

    def use(self, mode: DrafterKind) -> None:
        """Generate with this kind of drafting from now on (bench compares them; chat's /draft switches)."""
        self.drafting.use(mode)

    def costs(self) -> dict | None:
        """What the auto policy measured of this machine (verification by batch size, drafting), once
        it has run; for reports."""
        return self.drafting.costs()

    def set_draft_max(self, draft_max: int | None) -> None:
        """Draft up to this many tokens a step in every mode (None: each kind's own default)."""
        self.speculation = self._with_draft_max(draft_max)

    @property
    def most_draft(self) -> int:
        """The longest draft a step can verify (its batch, less the target's own token)."""
        return self.target.max_rows - 1

    def _with_draft_max(self, draft_max: int | None) -> Speculation:
        if draft_max is not None and draft_max > self.most_draft:
            raise UsageError(f"draft length {draft_max} exceeds this session's batch of {self.most_draft}")
        draft_min = self.speculation.draft_min
        return replace(self.speculation, draft_max=draft_max,
                       draft_min=draft_min if draft_max is None else min(draft_min, draft_max))

    @property
    def draft_limit(self) -> int:
        """Most tokens drafted a step in the current mode."""
        return self.drafting.limit

    def forget(self) -> None:
        """Start the auto policy's learning about acceptance afresh, and forget earlier generations
        (a benchmark's fresh session); the costs it measured stay, being the machine's."""
        self.drafting.forget()

    def remember_as(self, name: str | None) -> None:
        """Keep generations in, and draft from, a suffix cache of this name's own from now on (None: in
        none, as with --no-suffix-cache): bench gives each mode its own, so that none drafts what
        another generated from the same prompt."""
        self.drafting.remember_as(name)

    @property
    def suffix_cache(self) -> SuffixCache | None:
        """Where this session keeps its generations to draft from (None: --no-suffix-cache)."""
        return self.drafting.suffix_cache

    @property
    def can_speculate(self) -> bool:
        return self.default_mode != DrafterKind.PLAIN

    @property
    def remembered(self) -> tuple[int, int] | None:
        """The tokens its suffix caches hold (all of them: the one in use and the named ones) and the
        bytes they take, if this session keeps any."""
        return self.drafting.remembered
