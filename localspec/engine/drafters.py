"""Drafters propose tokens; the target decides. Each has one job and its own state.

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

from collections.abc import Generator, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Protocol, runtime_checkable

import numpy as np

from ..config import DrafterKind, Sampling
from ..events import Step
from . import backend
from .backend import Chain, Context, Model
from .library import llama
from .grammar import Grammar
from .sampling import Dist, chain_for, softmax
from .suffix import SuffixCache
from .turns import Turn, decoded_alone, timed


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
        return next(least for least in cls if run >= least)

    def shorter(self) -> "RunClass | None":
        order = list(RunClass)
        return order[order.index(self) + 1] if self is not order[-1] else None

    def __str__(self) -> str:
        return {16: "run 16+", 8: "run 8-15", 4: "run 4-7", 0: "run 2-3"}[self.value]


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
        return Draft()


MIN_OFFER = 4  # tokens any n-gram match may offer (best of 3, 4 and 8 in a replay of recorded generations)
RUN_LIMIT = 32  # how far back a match is followed when judging the evidence behind it


class NgramDrafter:
    """Prompt lookup: if the last n tokens occurred before, propose what followed them.

    An index from each n-gram to the position after its latest occurrence, and to
    how often each token followed it, is updated as tokens arrive, so a proposal
    costs the same at any context length. Each proposal names its Evidence: how far
    the match runs back and whether the n-gram's earlier occurrences agree on what follows it.
    """

    kind = DrafterKind.NGRAM

    def __init__(self, n_min: int, n_max: int):
        self.sizes = range(n_max, n_min - 1, -1)  # longest match first

    def begin(self, prompt, sampling, rng) -> None:
        self.latest: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}
        self.followers: dict[int, dict[tuple[int, ...], dict[int, int]]] = {n: {} for n in self.sizes}
        self.indexed = 0  # n-grams ending before this position are in the index

    def propose(self, history, k) -> Draft:
        # Index only n-grams that have a token after them; the current suffix stays out.
        for end in range(max(self.indexed, 1), len(history)):
            for n in self.sizes:
                if end >= n:
                    gram = tuple(history[end - n : end])
                    self.latest[n][gram] = end
                    counts = self.followers[n].setdefault(gram, {})
                    counts[history[end]] = counts.get(history[end], 0) + 1
        self.indexed = len(history)
        for n in self.sizes:
            gram = tuple(history[-n:])
            follows = self.latest[n].get(gram)
            if follows is not None:
                run = self._run(history, follows, n)
                # Offer as many tokens as the match already runs back (at least MIN_OFFER): a long
                # draft after a short, chance match mostly wastes a big verification batch.
                offer = min(k, max(run, MIN_OFFER))
                evidence = Evidence(RunClass.of(run), _agreement(self.followers[n][gram], history[follows]))
                return Draft(list(history[follows : follows + offer]), source=self.kind, evidence=evidence, run=run)
        return Draft(source=self.kind)

    @staticmethod
    def _run(history, follows: int, n: int) -> int:
        """How many tokens before `follows` equal the last ones of history (at least n, at most RUN_LIMIT)."""
        matched = n
        while matched < RUN_LIMIT and matched < follows and history[follows - 1 - matched] == history[-1 - matched]:
            matched += 1
        return matched


def _agreement(followers: dict[int, int], proposed: int) -> Agreement:
    seen = sum(followers.values())
    if seen == 1:
        return Agreement.SEEN_ONCE
    return Agreement.AGREE if followers.get(proposed, 0) == seen else Agreement.DIFFER


# A greedy draft keeps the 10 likeliest tokens and judges p_min among them, as llama.cpp's own
# speculative drafting does.
GREEDY_DRAFT = Chain(top_k=10)


def next_draft_token(q: Dist, p_min: float, sampling: Sampling, rng: np.random.Generator) -> int | None:
    """The token a draft goes on with, from the drafter's distribution q: its likeliest when greedy, else
    a sample; None once the drafter is unsure (its likeliest token below p_min)."""
    likeliest = int(np.argmax(q.probs))
    if q.probs[likeliest] < p_min:
        return None
    return int(q.ids[likeliest]) if sampling.greedy else q.sample(rng)


class ForwardDrafter:
    """What ModelDrafter and MtpDrafter share: a context of their own whose logits, transformed like the
    target's, give each draft token (greedy when the target is greedy, else sampled; stopping once the
    likeliest token is below p_min), and a catch-up on what was decided, timed, before each draft. Where
    the context is a sequence of one that several share (Context.sequence), each of its decodes is a Turn,
    decoded side by side with the other sequences' drafts."""

    kind: DrafterKind

    def __init__(self, context: Context, p_min: float):
        self.context = context
        self.p_min = p_min

    def prepare(self, sampling: Sampling, rng: np.random.Generator) -> None:
        """Start a generation without reading anything: the first draft reads all its cache lacks,
        as its catch-up (the auto policy reads the prompt into a costly drafter only if it chooses it)."""
        self.sampling = sampling
        self.rng = rng
        self.context.sample_with(GREEDY_DRAFT if sampling.greedy else chain_for(sampling))

    def propose(self, history, k) -> Draft:
        return decoded_alone(self.proposing(history, k))

    def proposing(self, history: list[int], k: int) -> Generator[Turn, None, Draft]:
        if k == 0:
            return Draft(source=self.kind)
        _, caught_up = yield from timed(self._ready(history))
        tokens: list[int] = []
        dists: list[Dist] = []
        with closing(self._drafting(history, k)) as drafting:
            for item in drafting:
                if isinstance(item, Turn):
                    yield item
                    continue
                tokens.append(item[0])
                dists.append(item[1])
                if len(tokens) == k:
                    break
        return Draft(tokens, None if self.sampling.greedy else dists, source=self.kind, catch_up_seconds=caught_up)

    def _next(self, row: int = -1) -> tuple[int | None, Dist]:
        """The next draft token (None: unsure) from a row of the context's last logits, and its distribution q."""
        q = softmax(*self.context.candidates(row))
        return next_draft_token(q, self.p_min, self.sampling, self.rng), q

    def _decoded(self, tokens: list[int], logits: str, hidden: np.ndarray | None = None,
                 embedded: bool = False) -> Generator[Turn, None, None]:
        """Decode tokens after the context's, as Context.decode does (with the hidden state each is read
        with, or in place of, as it says): at once, or, on a shared context, as turns, a catch-up in
        pieces of a prompt piece at most."""
        if self.context.n_seq == 1:
            self.context.decode(tokens, logits=logits, hidden=hidden, embedded=embedded)
            return
        piece = self.context.prompt_piece if logits != "all" else len(tokens)
        for offset in range(0, len(tokens), piece):
            part = tokens[offset : offset + piece]
            last = logits == "last" and offset + len(part) == len(tokens)
            yield Turn(self.context, part, "all" if logits == "all" else "last" if last else "none", drafts=True,
                       hidden=None if hidden is None else hidden[offset : offset + len(part)], embedded=embedded)

    def _ready(self, history: list[int]) -> Generator[Turn, None, None]:
        """Catch up on history, so the next decode drafts after it."""
        raise NotImplementedError

    def _drafting(self, history: list[int], k: int) -> Iterator[tuple[int, Dist] | Turn]:
        """Draft up to k tokens and their q (with the turns their decodes need), until unsure; stopped when
        enough are drafted."""
        raise NotImplementedError


class ModelDrafter(ForwardDrafter):
    """A small model with the target's vocabulary, run on its own llama.cpp context.

    target_vocab bounds the ids it may propose: llama.cpp accepts vocabularies that
    differ by a few tokens at the end.
    """

    kind = DrafterKind.DRAFT

    def __init__(self, context: Context, p_min: float, target_vocab: int):
        super().__init__(context, p_min)
        self.target_vocab = target_vocab

    def begin(self, prompt, sampling, rng) -> None:
        """Start a generation and read the prompt now, while the target reads it (on a shared context,
        at the first draft, beside the other sequences' drafts)."""
        self.prepare(sampling, rng)
        if self.context.n_seq == 1:
            decoded_alone(self.catch_up(prompt))

    def prepare(self, sampling: Sampling, rng: np.random.Generator) -> None:
        super().prepare(sampling, rng)
        self.agreed = 0  # the cache's first `agreed` tokens are known to match history

    def behind(self, history: list[int]) -> int:
        """Tokens the next draft would first have to read (at most; some may still match the cache)."""
        return len(history) - self.agreed

    def catch_up(self, history: list[int]) -> Generator[Turn, None, None]:
        """Drop drafted tokens the target rejected and feed what the draft has not seen.

        Everything before `agreed` was committed earlier, so only the few tokens
        after it need comparing; the last history token's logits start the next draft.
        """
        keep = self.context.keep_common(history, self.agreed, len(history) - 1)
        yield from self._decoded(history[keep:], "last")
        self.agreed = len(history)
        if backend.CHECK_CACHES:
            self.context.check_holds(history)

    def _ready(self, history: list[int]) -> Generator[Turn, None, None]:
        yield from self.catch_up(history)
        if self.context.recurrent:
            # drafting decodes a token at a time, further back than a recurrent state's snapshots reach
            self.context.checkpoint()

    def _drafting(self, history: list[int], k: int) -> Iterator[tuple[int, Dist] | Turn]:
        while True:
            token, q = self._next()
            if token is None or token >= self.target_vocab:
                return
            yield token, q
            yield from self._decoded([token], "last")


def hidden_rows(target: Context, positions: range) -> np.ndarray:
    """The hidden states the target keeps after each of these positions; zeros before the first, or where
    the target no longer keeps them (a drafter drafts less well from there; the output stays the target's)."""
    width = target.hidden_width
    rows = [target.hidden_row(p) if p >= 0 else None for p in positions]
    return np.stack([row if row is not None else np.zeros(width, np.float32) for row in rows]).reshape(-1, width)


class MtpDrafter(ForwardDrafter):
    """The target's own multi-token-prediction (MTP) block drafts for it (self-speculation).

    The MTP block reads a token together with the target's hidden state after the token before it,
    and predicts the token after. Its context holds an entry for each position the target has
    decoded (token and hidden state, which the target keeps for it); a draft adds entries for the
    token the target has not decoded yet and then for each drafted token with the block's own hidden
    state, and is taken back out before the target verifies.
    """

    kind = DrafterKind.MTP
    skips = 0  # leading tokens of the history that have no entry (no hidden state comes before them)

    def __init__(self, target: Context, context: Context, p_min: float):
        super().__init__(context, p_min)
        self.target = target

    def begin(self, prompt, sampling, rng) -> None:
        """Nothing is read now: the first draft catches up on what the target has decoded."""
        self.prepare(sampling, rng)

    def behind(self, history: list[int]) -> int:
        """Entries the next draft would first have to add (at most; some may still be in the cache)."""
        return max(0, len(history) - 1 - self.skips - len(self.context.tokens))

    def catch_up(self, decoded: list[int]) -> Generator[Turn, None, None]:
        """Give the context an entry for each position the target has decoded: token p with the target's
        hidden state after token p - 1, at position p - skips."""
        held = decoded[self.skips :]
        keep = self.context.keep_common(held)
        if keep < len(held):
            yield from self._decoded(held[keep:], "none", self._states(range(keep + self.skips - 1, len(decoded) - 1)))
        self.target.release_hidden(len(decoded) - 1)  # the next draft starts from the last of them
        if backend.CHECK_CACHES:
            self.context.check_holds(held)

    def _ready(self, history: list[int]) -> Generator[Turn, None, None]:
        yield from self.catch_up(history[:-1])  # the positions the target holds

    def _drafting(self, history: list[int], k: int) -> Iterator[tuple[int, Dist] | Turn]:
        decoded = len(history) - 1
        token, hidden = history[-1], self._states(range(decoded - 1, decoded))[0]
        try:
            while True:
                yield from self._read(token, hidden, decoded)
                token, q = self._next()
                if token is None:
                    return
                yield token, q
                hidden = self.context.output_hidden(-1)
        finally:
            self.context.truncate(decoded - self.skips)  # the draft's entries come back out before the target verifies

    def _read(self, token: int, hidden: np.ndarray, decoded: int) -> Generator[Turn, None, None]:
        """Decode a token of the draft, with the hidden state that goes with it, after the cache's entries."""
        yield from self._decoded([token], "last", hidden[None, :])

    def _states(self, positions: range) -> np.ndarray:
        """What the context reads with each token: the target's hidden state after each of these positions."""
        return hidden_rows(self.target, positions)


class AssistantDrafter(MtpDrafter):
    """Gemma 4's assistant (a small model published beside its target, which llama.cpp runs as its MTP
    drafter) drafts as an MTP block does, but keeps no cache of its own: it reads the target's, so
    every step of a draft is read at the position of the token the target has not decoded yet, and what
    it drafted before passes on through its hidden state alone."""

    def behind(self, history: list[int]) -> int:
        return 0

    def catch_up(self, decoded: list[int]) -> Generator[Turn, None, None]:
        self.target.release_hidden(len(decoded) - 1)  # the next draft starts from the last of them
        yield from ()

    def _read(self, token: int, hidden: np.ndarray, decoded: int) -> Generator[Turn, None, None]:
        self.context.decode_at(decoded, token, hidden)  # the target's next position, every step
        yield from ()


DFLASH_BLOCK = 16  # positions a DFlash drafter reads a draft in, where its file does not say (llama.cpp's default)


class DFlashDrafter(ForwardDrafter):
    """A DFlash drafter (a small block-diffusion model trained beside its target) drafts a whole block in
    one forward pass. Its cache holds, at each position the target has decoded, the target's hidden
    states there (the inputs of a few of its layers) in place of a token; it reads the last token
    followed by mask tokens, without a causal mask, and predicts a token at every masked position at
    once. Each drafted token depends on no other, so its q is its own row's, as the rejection rule needs.
    The block comes back out before the target verifies."""

    kind = DrafterKind.DFLASH

    def __init__(self, target: Context, context: Context, p_min: float):
        super().__init__(context, p_min)
        self.target = target
        self.mask = llama.llama_vocab_mask(context.model.vocab)
        self.block = int(context.model.meta("dflash.block_size") or DFLASH_BLOCK)  # llama.cpp's default

    def begin(self, prompt, sampling, rng) -> None:
        """Nothing is read now: the first draft catches up on what the target has decoded."""
        self.prepare(sampling, rng)

    def behind(self, history: list[int]) -> int:
        return max(0, len(history) - 1 - len(self.context.tokens))

    def catch_up(self, decoded: list[int]) -> Generator[Turn, None, None]:
        """Give the cache the target's hidden states at each position the target has decoded (zeros where
        it no longer keeps them: the drafter drafts less well from there, the output stays the target's)."""
        keep = self.context.keep_common(decoded)
        if keep < len(decoded):
            rows = hidden_rows(self.target, range(keep, len(decoded)))
            yield from self._decoded(decoded[keep:], "none", rows, embedded=True)
        self.target.release_hidden(len(decoded))
        if backend.CHECK_CACHES:
            self.context.check_holds(decoded)

    def _ready(self, history: list[int]) -> Generator[Turn, None, None]:
        yield from self.catch_up(history[:-1])  # the positions the target holds

    def _drafting(self, history: list[int], k: int) -> Iterator[tuple[int, Dist] | Turn]:
        decoded = len(history) - 1
        n = min(k, self.block - 1)
        try:
            yield from self._decoded([history[-1]] + [self.mask] * n, "all")
            for row in range(1, n + 1):
                token, q = self._next(row)
                if token is None:
                    return
                yield token, q
        finally:
            self.context.truncate(decoded)


class Eagle3Drafter(MtpDrafter):
    """An EAGLE-3 drafter (a one-layer model trained beside its target, run with the target's token
    embeddings and output layer unless it has its own) drafts from the inputs of three of the target's
    layers, as llama.cpp's draft-eagle3 does.

    Its encoder fuses those three hidden states after position p into one of its own width, which goes
    with token p + 1 at position p: the first token has no entry. Otherwise it drafts as an MTP block:
    each drafted token goes with the drafter's own hidden state before it.
    """

    kind = DrafterKind.EAGLE3
    skips = 1

    def _states(self, positions: range) -> np.ndarray:
        return self.context.encode(super()._states(positions))

    @staticmethod
    def layers_read(target: Model, drafter: Model) -> tuple[int, ...]:
        """The target layers whose inputs the drafter reads, as the target's context keeps them."""
        return tuple(backend.LAST_HIDDEN if layer >= target.n_layer else layer for layer in drafter.target_layers)


PREDICTION_MIN_MATCH = 4  # output tokens that must match the prediction before it drafts again after a departure
EDIT_MATCH, EDIT_REACH = 2, 16  # fewer suffice within this many tokens past where the output left it
EDIT_SPAN = 8  # the longest edit (tokens replaced, tokens instead) learned and made in the rest of a prediction


class PredictionDrafter:
    """The text the user expects (OpenAI's Predicted Outputs: typically the file being edited) drafts
    wherever the output follows it; elsewhere the generation's own drafter (`then`) drafts.

    It follows the output through the prediction token by token. Where the output departs from it (an
    edit), it waits until the output's last tokens are found in the prediction again, preferring the
    first place after where it left (edits keep the file's order). A draft offers as many tokens as the
    output has followed the prediction without a break (at least MIN_OFFER): a long draft right after a
    departure would mostly be rejected, and a rejected long draft costs a big verification batch.
    Its drafts are deterministic (q one-hot), so under sampling each token is kept with p(x): lossless.
    """

    kind = DrafterKind.PREDICTION

    def __init__(self, prediction: list[int], then: Drafter, then_limit: int):
        self.then, self.then_limit = then, then_limit
        self._expect(list(prediction))
        self.edits: dict[tuple[int, ...], tuple[int, ...]] = {}  # each short edit seen once: what replaced what

    def _expect(self, prediction: list[int]) -> None:
        self.prediction = prediction
        self.index: dict[tuple[int, ...], list[int]] = {}  # each n-gram of the prediction -> the positions after it
        n = PREDICTION_MIN_MATCH
        for end in range(n, len(prediction)):
            self.index.setdefault(tuple(prediction[end - n : end]), []).append(end)

    def begin(self, prompt, sampling, rng) -> None:
        self.then.begin(prompt, sampling, rng)
        self.at: int | None = 0  # where in the prediction the next output token is expected; None: departed
        self.followed = 0  # output tokens that have followed the prediction since the last departure
        self.left = 0  # where in the prediction the output last departed
        self.departed = 0  # where in history it did
        self.compared = len(prompt)  # history positions already held against the prediction

    def propose(self, history, k) -> Draft:
        return decoded_alone(self.proposing(history, k))

    def proposing(self, history: list[int], k: int) -> Generator[Turn, None, Draft]:
        self._follow(history)
        if self.at is not None and self.at < len(self.prediction):
            offer = min(k, max(self.followed, MIN_OFFER))
            return Draft(self.prediction[self.at : self.at + offer], source=self.kind, run=self.followed)
        return (yield from proposal(self.then, history, min(k, self.then_limit)))

    def observe(self, step: Step) -> None:
        # the generation's own drafter learns from its own steps only: a prediction's steps say nothing of it
        if step.drafter != self.kind and isinstance(self.then, Learner):
            self.then.observe(step)

    def _follow(self, history: list[int]) -> None:
        for position in range(self.compared, len(history)):
            if self.at is not None and self.at < len(self.prediction) and self.prediction[self.at] == history[position]:
                self.at += 1
                self.followed += 1
            elif self.at is not None:
                self.left, self.departed, self.at, self.followed = self.at, position, None, 0
        self.compared = len(history)
        if self.at is None:
            self._find_again(history)

    def _find_again(self, history: list[int]) -> None:
        # An edit usually replaces a few tokens and goes on with the text after them (a renamed
        # variable): the answer's last two tokens found just past where it left need no more proof.
        tail = history[-EDIT_MATCH:]
        nearby = self.prediction[self.left : self.left + EDIT_REACH + EDIT_MATCH]
        for start in range(len(nearby) - EDIT_MATCH + 1):
            if nearby[start : start + EDIT_MATCH] == tail:
                self.at, self.followed = self.left + start + EDIT_MATCH, EDIT_MATCH
                self._learn(self.prediction[self.left : self.left + start], history[self.departed : -EDIT_MATCH])
                return
        places = self.index.get(tuple(history[-PREDICTION_MIN_MATCH:]))
        if places:
            self.at = next((place for place in places if place >= self.left), places[0])
            self.followed = PREDICTION_MIN_MATCH

    def _learn(self, replaced: list[int], by: list[int]) -> None:
        """The same short edit seen a second time (a renamed variable) is made in the rest of the
        prediction, so drafts carry it; once could be a one-off change of a common token."""
        if not 0 < len(replaced) <= EDIT_SPAN or not 0 < len(by) <= EDIT_SPAN:
            return
        key, value = tuple(replaced), list(by)
        if self.edits.get(key) != tuple(value):
            self.edits[key] = tuple(value)
            return
        rest, edited, i = self.prediction[self.at :], [], 0
        while i < len(rest):
            if tuple(rest[i : i + len(key)]) == key:
                edited += value
                i += len(key)
            else:
                edited.append(rest[i])
                i += 1
        self._expect(self.prediction[: self.at] + edited)


class SuffixDrafter:
    """Earlier generations in this process draft (SuffixDecoding, Oliaro et al. 2025): the longest tail
    of the text found in a SuffixCache, continued as most often before. Its proposals name Evidence as
    n-gram lookup's do (how far the match runs back; whether the earlier continuations agree), so auto
    keeps beliefs of its own for them, learned from the text for free."""

    kind = DrafterKind.SUFFIX

    def __init__(self, cache: SuffixCache | None):
        self.cache = cache  # None: drafting from nothing for a while (bench's auto-no-suffix)

    def begin(self, prompt, sampling, rng) -> None:
        pass

    def propose(self, history, k) -> Draft:
        if self.cache is None:
            return Draft(source=self.kind)
        found = self.cache.propose(history, k)
        if found.match < SUFFIX_MIN_MATCH or not found.tokens:
            return Draft(source=self.kind)
        agreement = (Agreement.SEEN_ONCE if found.support == 1
                     else Agreement.AGREE if found.probabilities[0] == 1.0 else Agreement.DIFFER)
        return Draft(list(found.tokens), source=self.kind, evidence=Evidence(RunClass.of(found.match), agreement),
                     run=found.match)


SUFFIX_MIN_MATCH = 2  # a one-token match among a million earlier tokens is chance, as n-gram lookup's ngram_min


FORCED_CHARACTERS_PER_TOKEN = 8  # how far a forced text is looked for, per token that may be drafted
# A forced text's last token is drafted only if no character the grammar admits after it would merge
# into it (`"` before `:`, where the target writes `":`); past this many admitted characters, assume one would.
MERGES_CHECKED = 8


class ForcedDrafter:
    """Jump-forward decoding, kept lossless: where the grammar admits one text alone (a JSON schema's
    key and its closing quote, an enum's only value left), that text, tokenized, is the draft; elsewhere
    the generation's own drafter (`then`) drafts.

    SGLang appends such text without the target; with a BPE vocabulary that is not the target's output,
    which may spell the same text with other tokens (`"sum` + `mary`), so here the target verifies it
    like any other draft: nearly always accepted, and the output stays the target's own. Its drafts are
    deterministic (q one-hot), so under sampling each token is kept with the masked p(x)."""

    kind = DrafterKind.FORCED

    def __init__(self, grammar: Grammar, model: Model, then: Drafter):
        self.grammar, self.model, self.then = grammar, model, then

    def begin(self, prompt, sampling, rng) -> None:
        self.then.begin(prompt, sampling, rng)

    def propose(self, history, k) -> Draft:
        return decoded_alone(self.proposing(history, k))

    def proposing(self, history: list[int], k: int) -> Generator[Turn, None, Draft]:
        forced = self._forced(k)
        drafted = yield from proposal(self.then, history, k)
        # The generation's own drafter may see further (a suffix-cache match runs on past a key into the
        # punctuation after it): its draft stands wherever it spells the forced text and goes on.
        spelled = self.model.spell_of
        if forced and not (len(drafted.tokens) > len(forced) and spelled(drafted.tokens).startswith(spelled(forced))):
            return Draft(forced, source=self.kind)
        return drafted

    def _forced(self, k: int) -> list[int]:
        """Up to k tokens of the text the grammar forces from here."""
        if k == 0:
            return []
        text, after = self.grammar.forced_text(self.model.character_tokens, self.model.end_tokens,
                                               FORCED_CHARACTERS_PER_TOKEN * k)
        tokens = self.model.spell(text) if text else []
        if tokens and not self._ends_cleanly(text, tokens, after):
            tokens.pop()
        return tokens[:k]

    def _ends_cleanly(self, text: str, tokens: list[int], after: str) -> bool:
        """Whether the text's last token stays one whatever admitted character follows it."""
        return len(after) <= MERGES_CHECKED and all(self.model.spell(text + c)[: len(tokens)] == tokens for c in after)

    def observe(self, step: Step) -> None:
        # the generation's own drafter learns from its own steps only
        if step.drafter != self.kind and isinstance(self.then, Learner):
            self.then.observe(step)
