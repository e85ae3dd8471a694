"""Drafters propose tokens; the target decides. Each has one job and its own state.

`history` is every token committed so far (prompt and output); its last token
has not been decoded by the target yet. A Draft carries the proposal and, when
the proposal was sampled, the distribution q each token was drawn from;
without it the proposal was deterministic and q is one-hot.
"""

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..config import Sampling
from ..events import Step
from . import backend
from .backend import Context
from .sampling import Dist, top_probability, transform


@dataclass(frozen=True)
class Draft:
    tokens: list[int] = field(default_factory=list)
    dists: list[Dist] | None = None
    source: str = "none"  # the drafter that made it


class Drafter(Protocol):
    name: str

    def begin(self, prompt: list[int], sampling: Sampling, rng: np.random.Generator) -> None:
        """Start a new generation for this prompt."""

    def propose(self, history: list[int], k: int) -> Draft:
        """Up to k tokens that may follow history."""

    def observe(self, step: Step) -> None:
        """How the last proposal fared: drafters that learn use it."""


class NoDrafter:
    """Plain decoding: the target alone, one token per step."""

    name = "none"

    def begin(self, prompt, sampling, rng) -> None:
        pass

    def propose(self, history, k) -> Draft:
        return Draft()

    def observe(self, step) -> None:
        pass


MIN_OFFER = 4  # tokens any n-gram match may offer (best of 3, 4 and 8 in a replay of recorded generations)


class NgramDrafter:
    """Prompt lookup: if the last n tokens occurred before, propose what followed them.

    An index from each n-gram to the position after its latest occurrence is
    updated as tokens arrive, so a proposal costs the same at any context length.
    """

    name = "ngram"

    def __init__(self, n_min: int, n_max: int):
        self.sizes = range(n_max, n_min - 1, -1)  # longest match first

    def begin(self, prompt, sampling, rng) -> None:
        self.index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}
        self.indexed = 0  # n-grams ending before this position are in the index

    def propose(self, history, k) -> Draft:
        # Index only n-grams that have a token after them; the current suffix stays out.
        for end in range(max(self.indexed, 1), len(history)):
            for n in self.sizes:
                if end >= n:
                    self.index[n][tuple(history[end - n : end])] = end
        self.indexed = len(history)
        for n in self.sizes:
            follows = self.index[n].get(tuple(history[-n:]))
            if follows is not None:
                return Draft(list(history[follows : follows + min(k, self._trust(history, follows, n, k))]),
                             source=self.name)
        return Draft(source=self.name)

    def _trust(self, history, follows: int, n: int, k: int) -> int:
        """How many tokens to offer: as many as the match already runs back (at least MIN_OFFER).

        A long run of repeated text tends to go on repeating; a short match is often chance, and a
        long draft after it mostly wastes a big verification batch."""
        matched = n
        while matched < k and matched < follows and history[follows - 1 - matched] == history[-1 - matched]:
            matched += 1
        return max(matched, MIN_OFFER)

    def observe(self, step) -> None:
        pass


class ModelDrafter:
    """A small model with the target's vocabulary, run on its own llama.cpp context.

    Greedy when the target is greedy, otherwise sampled from the draft's own
    distribution transformed like the target's. Stops early when its most likely
    token has probability below p_min. target_vocab bounds the ids it may
    propose: llama.cpp accepts vocabularies that differ by a few tokens at the end.
    """

    name = "draft"

    def __init__(self, context: Context, p_min: float, target_vocab: int):
        self.context = context
        self.p_min = p_min
        self.target_vocab = target_vocab

    def begin(self, prompt, sampling, rng) -> None:
        self.sampling = sampling
        self.rng = rng
        self.context.prefill(prompt[:-1])
        self.agreed = len(prompt) - 1  # the cache's first `agreed` tokens are known to match history

    def propose(self, history, k) -> Draft:
        if k == 0:
            return Draft(source=self.name)
        self.catch_up(history)
        tokens: list[int] = []
        dists: list[Dist] = []
        logits = self.context.logits(-1)
        while True:
            if self.sampling.greedy:
                if top_probability(logits) < self.p_min:
                    break
                token = int(np.argmax(logits))
            else:
                q = transform(logits, self.sampling)
                if q.probs[0] < self.p_min:
                    break
                token = q.sample(self.rng)
            if token >= self.target_vocab:
                break
            tokens.append(token)
            if not self.sampling.greedy:
                dists.append(q)
            if len(tokens) == k:
                break
            self.context.decode([token], logits="last")
            logits = self.context.logits(-1)
        return Draft(tokens, None if self.sampling.greedy else dists, source=self.name)

    def observe(self, step) -> None:
        pass

    def catch_up(self, history: list[int]) -> None:
        """Drop drafted tokens the target rejected and feed what the draft has not seen.

        Everything before `agreed` was committed earlier, so only the few tokens
        after it need comparing; the last history token's logits start the next draft.
        """
        self.context.prefill(history, logits="last", agreed=self.agreed)
        self.agreed = len(history)
        if backend.CHECK_CACHES:
            self.context.check_holds(history)
