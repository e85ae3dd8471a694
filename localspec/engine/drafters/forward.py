"""Drafters that run a forward pass on a context of their own: a draft model, the target's MTP block
(its own or one published beside it, Gemma 4's assistant among them), EAGLE-3 and DFlash drafters."""

from collections.abc import Generator, Iterator
from contextlib import closing
from dataclasses import replace
from time import perf_counter

import numpy as np

from ...config import DrafterKind, Sampling
from .. import backend
from ..backend import Context
from ..chain import Chain
from ..hidden import LAST_HIDDEN
from ..model import Model
from ..adjustments import Adjustments
from ..library import llama
from ..sampling import Dist, chain_for, softmax
from ..tree import Alternative, DraftTree
from ..turns import Turn, decoded_alone, timed
from .base import Draft


# A greedy draft keeps the 10 likeliest tokens and judges p_min among them, as llama.cpp's own
# speculative drafting does.
GREEDY_DRAFT = Chain(top_k=10)
# A sampled draft draws a sibling where two draws from q differ at least this often: where q is peaked a
# second draw mostly repeats the first, a row verified for nothing. (At one half, the 0.5B Qwen draft at
# T = 0.7 drew none in 64 tokens of code; at a fifth, 7 trees in 20 steps, one sibling kept.)
DRAWN_SIBLING_SPREAD = 0.2


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
    # How its own context is made: of the model's MTP block (llama.cpp's MTP context type), and beside the
    # target's context (reading the target's cache or hidden states as they are made).
    mtp_context = False
    beside_target = False

    # Greedy, a draft holds beside each token it drafts its runner-ups (the likeliest others of its q), up
    # to this many for a draft, for auto to grow a tree of where they pay (EAGLE-2's top-k expansion, one
    # level deep: no decode more); sampled, as many siblings drawn from q (drawn_siblings); branching: the
    # drafter's draft is such a tree itself (fixed drafting)
    alternatives = 0
    branching = False
    # a tree's runner-ups drafted on as far as the chain goes (_drafted_on), where the drafter can
    drafts_branches_on = False

    def __init__(self, context: Context, p_min: float):
        self.context = context
        self.p_min = p_min

    @property
    def branches(self) -> int:
        """The most branches its drafts' trees have."""
        return self.alternatives + 1 if self.branching else 1

    @classmethod
    def made(cls, target: Context, context: Context, p_min: float) -> "ForwardDrafter":
        """The drafter drafting for target on a context of its own."""
        return cls(target, context, p_min)

    def for_sequence(self, target: Context, seq: int) -> "ForwardDrafter":
        """This drafter's twin for another sequence (target: that sequence's), on the sequence's own part
        of this drafter's context: each keeps the state of its own generation."""
        return self.made(target, self.context.sequence(seq), self.p_min)

    @staticmethod
    def layers_read(target: Model, drafter: Model) -> tuple[int, ...]:
        """The target layers whose hidden states it drafts from, as the target's context keeps them."""
        return ()

    def prepare(self, sampling: Sampling, rng: np.random.Generator) -> None:
        """Start a generation without reading anything: the first draft reads all its cache lacks,
        as its catch-up (the auto policy reads the prompt into a costly drafter only where one would pay)."""
        self.sampling = sampling
        self.rng = rng
        self.adjustments = Adjustments.of(sampling, self.context.model)
        self.context.sample_with(GREEDY_DRAFT if sampling.greedy else chain_for(sampling),
                                 host=self.adjustments is not None)

    def propose(self, history, k) -> Draft:
        return decoded_alone(self.proposing(history, k))

    def proposing(self, history: list[int], k: int) -> Generator[Turn, None, Draft]:
        if k == 0:
            return Draft.nothing(self.kind)
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
        if not self.sampling.greedy:
            others = drawn_siblings(dists, self.alternatives, self.rng) if self.alternatives else ()
            tree = DraftTree.forked(tokens, others, dists) if self.branching and others else None
            return Draft(tokens, dists, source=self.kind, catch_up_seconds=caught_up, alternatives=others, tree=tree)
        others = runner_ups(tokens, dists, self.alternatives) if self.alternatives else ()
        if self.branching and others and self.drafts_branches_on:
            others = yield from self._drafted_on(history, tokens, others)
        tree = DraftTree.forked(tokens, others) if self.branching and others else None
        return Draft(tokens, source=self.kind, catch_up_seconds=caught_up, alternatives=others, tree=tree)

    def _next(self, row: int = -1) -> tuple[int | None, Dist]:
        """The next draft token (None: unsure) from a row of the context's last logits, and its distribution q."""
        q = self._q(row)
        return next_draft_token(q, self.p_min, self.sampling, self.rng), q

    def _q(self, row: int = -1) -> Dist:
        """The drafter's distribution at a row of the context's last logits, as its sampler chain keeps it."""
        return softmax(*self.context.candidates(row))

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

    @classmethod
    def made(cls, target: Context, context: Context, p_min: float) -> "ModelDrafter":
        return cls(context, p_min, target.model.n_vocab)

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
        started = perf_counter()
        yield from self._decoded(history[keep:], "last")
        self.context.remember(len(history) - keep, perf_counter() - started)
        self.agreed = len(history)
        if backend.CHECK_CACHES:
            self.context.check_holds(history)

    def _ready(self, history: list[int]) -> Generator[Turn, None, None]:
        yield from self.catch_up(history)
        if self.context.recurrent:
            # drafting decodes a token at a time, further back than a recurrent state's snapshots reach
            self.context.checkpoint()

    drafts_branches_on = True

    def _drafting(self, history: list[int], k: int, drafted: list[int] | None = None
                  ) -> Iterator[tuple[int, Dist] | Turn]:
        """(drafted: the tokens already drafted after history, the last of them decoded.)"""
        drafted = list(drafted or ())
        while True:
            if self.adjustments:  # changed as the target's row will be: the draft's tokens are drawn nearer p
                self.adjustments.apply(self.context.logits(-1), history, drafted)
            token, q = self._next()
            if token is None or token >= self.target_vocab:
                return
            drafted.append(token)
            yield token, q
            yield from self._decoded([token], "last")

    def _drafted_on(self, history: list[int], tokens: list[int], others: tuple[Alternative, ...]
                    ) -> Generator[Turn, None, tuple[Alternative, ...]]:
        """Each runner-up of a greedy draft drafted on greedily as far as the chain went (EAGLE-2's branches
        below the first level; a fixed tree's, whose user asked for them): the cache taken back to the fork,
        the runner-up decoded there and its continuation drafted after it, a decode a token. The next draft's
        catch-up reads again what the chain had there."""
        grown = []
        for other in others:
            branch, deepest = list(other.tokens), len(tokens) - other.fork
            if len(branch) < deepest:
                self.context.truncate(len(history) + other.fork)
                yield from self._decoded(branch, "last")
                with closing(self._drafting(history, deepest, tokens[: other.fork] + branch)) as drafting:
                    for item in drafting:
                        if isinstance(item, Turn):
                            yield item
                            continue
                        branch.append(item[0])
                        if len(branch) == deepest:
                            break
            grown.append(replace(other, tokens=tuple(branch)))
        return tuple(grown)


def runner_ups(tokens: list[int], dists: list[Dist], most: int) -> tuple[Alternative, ...]:
    """The likeliest tokens, other than the one drafted, at each position of a greedy draft: the `most`
    likeliest of them all, each a one-token alternative at its position."""
    found = []
    for fork, (token, q) in enumerate(zip(tokens, dists)):
        order = np.argsort(q.probs)[::-1][: most + 1]
        others = [(float(q.probs[i]), int(q.ids[i])) for i in order if int(q.ids[i]) != token][:most]
        found += [Alternative(fork, rank, (other,), share) for rank, (share, other) in enumerate(others, start=2)]
    return tuple(sorted(found, key=lambda alternative: -alternative.share)[:most])


def drawn_siblings(dists: list[Dist], most: int, rng: np.random.Generator) -> tuple[Alternative, ...]:
    """Beside a sampled draft's tokens, one more independent draw from q at each of the first `most` positions
    where q is spread (a second draw differs from the first at least DRAWN_SIBLING_SPREAD of the time):
    SpecInfer's multi-draft siblings, verified by multi-draft rejection sampling (engine/tree.py). Where a
    sibling goes depends on that position's q and those before it alone, never on what was drawn there or
    after: a node's children are then independent draws from its q, as that verification needs."""
    found = []
    for fork, q in enumerate(dists):
        if len(found) == most:
            break
        spread = 1.0 - float(np.sum(q.probs.astype(np.float64) ** 2))  # the chance two draws differ
        if spread >= DRAWN_SIBLING_SPREAD:
            found.append(Alternative(fork, 2, (q.sample(rng),), spread))
    return tuple(found)


def hidden_rows(target: Context, positions: range) -> np.ndarray:
    """The hidden states the target keeps after each of these positions; zeros before the first, or where
    the target no longer keeps them (a drafter drafts less well from there; the output stays the target's)."""
    width = target.hidden.width
    rows = [target.hidden.row(p) if p >= 0 else None for p in positions]
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
    mtp_context = True
    skips = 0  # leading tokens of the history that have no entry (no hidden state comes before them)

    def __init__(self, target: Context, context: Context, p_min: float):
        super().__init__(context, p_min)
        self.target = target

    @staticmethod
    def layers_read(target: Model, drafter: Model) -> tuple[int, ...]:
        return (LAST_HIDDEN,)

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
        self.target.hidden.release(len(decoded) - 1)  # the next draft starts from the last of them
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

    beside_target = True

    def behind(self, history: list[int]) -> int:
        return 0

    def catch_up(self, decoded: list[int]) -> Generator[Turn, None, None]:
        self.target.hidden.release(len(decoded) - 1)  # the next draft starts from the last of them
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

    kind = DrafterKind("dflash")
    beside_target = True

    def __init__(self, target: Context, context: Context, p_min: float):
        super().__init__(context, p_min)
        self.target = target
        self.mask = llama.llama_vocab_mask(context.model.vocab)
        self.block = int(context.model.meta("dflash.block_size") or DFLASH_BLOCK)  # llama.cpp's default

    @staticmethod
    def layers_read(target: Model, drafter: Model) -> tuple[int, ...]:
        return drafter.target_layers

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
        self.target.hidden.release(len(decoded))
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

    kind = DrafterKind("eagle3")
    mtp_context = False
    beside_target = True
    skips = 1

    def _states(self, positions: range) -> np.ndarray:
        return self.context.encode(super()._states(positions))

    @staticmethod
    def layers_read(target: Model, drafter: Model) -> tuple[int, ...]:
        return tuple(LAST_HIDDEN if layer >= target.n_layer else layer for layer in drafter.target_layers)
