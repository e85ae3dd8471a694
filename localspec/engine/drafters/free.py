"""Drafters that cost no forward pass: n-gram lookup in the text so far, and earlier generations
(the suffix cache)."""

from ...config import DrafterKind
from ..suffix import SuffixCache
from ..tree import Alternative, DraftTree
from .base import Agreement, Draft, Evidence, RunClass


MIN_OFFER = 4  # tokens any n-gram match may offer (best of 3, 4 and 8 in a replay of recorded generations)
RUN_LIMIT = 32  # how far back a match is followed when judging the evidence behind it


class NgramDrafter:
    """Prompt lookup: if the last n tokens occurred before, propose what followed them.

    An index from each n-gram to the position after its latest occurrence, and to
    how often each token followed it, is updated as tokens arrive, so a proposal
    costs the same at any context length. Each proposal names its Evidence: how far
    the match runs back and whether the n-gram's earlier occurrences agree on what follows it.
    A prompt that goes on from the text indexed last (a chat's next turn, an agent's next request
    on the same sequence) keeps the index: only its new tokens are indexed.
    """

    kind = DrafterKind.NGRAM

    def __init__(self, n_min: int, n_max: int, alternatives: int = 0, branching: bool = False):
        """alternatives: how many other continuations of the n-gram (by what followed its other occurrences)
        a proposal holds beside the one it bets on; branching: propose them as a draft tree (a fixed
        n-gram drafter's; auto weighs them itself)."""
        self.sizes = range(n_max, n_min - 1, -1)  # longest match first
        self.alternatives, self.branching = alternatives, branching
        self._forget()

    @property
    def branches(self) -> int:
        """The most branches its drafts' trees have."""
        return self.alternatives + 1 if self.branching else 1

    def for_sequence(self) -> "NgramDrafter":
        """A twin for another sequence, indexing its own text."""
        return NgramDrafter(self.sizes[-1], self.sizes[0], self.alternatives, self.branching)

    def begin(self, prompt, sampling, rng) -> None:
        # (Indexing an agent's 32,000 tokens took 170 ms at every request; comparing them takes 0.25 ms.)
        if list(prompt[: self.indexed]) != self.text:
            self._forget()

    def _forget(self) -> None:
        self.latest: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}
        # n -> n-gram -> each token that followed it -> how often and where it last did, packed (_followed)
        self.followers: dict[int, dict[tuple[int, ...], dict[int, int]]] = {n: {} for n in self.sizes}
        self.indexed = 0  # n-grams ending before this position are in the index
        self.text: list[int] = []  # the `indexed` tokens indexed (a copy: the history they came from goes on)

    def propose(self, history, k) -> Draft:
        # Index only n-grams that have a token after them; the current suffix stays out.
        for end in range(max(self.indexed, 1), len(history)):
            for n in self.sizes:
                if end >= n:
                    gram = tuple(history[end - n : end])
                    self.latest[n][gram] = end
                    counts = self.followers[n].setdefault(gram, {})
                    counts[history[end]] = _followed(_count(counts.get(history[end], 0)) + 1, end)
        self.text += history[self.indexed :]
        self.indexed = len(history)
        for n in self.sizes:
            gram = tuple(history[-n:])
            follows = self.latest[n].get(gram)
            if follows is not None:
                run = self._run(history, follows, n)
                evidence = Evidence(RunClass.of(run), _agreement(self.followers[n][gram], history[follows]))
                tokens = self._offer(history, follows, n, k, run)
                alternatives = self._others(history, history[follows], n, k) if self.alternatives else ()
                tree = DraftTree.forked(tokens, alternatives) if self.branching and alternatives else None
                return Draft(tokens, source=self.kind, evidence=evidence, run=run, alternatives=alternatives,
                             tree=tree)
        return Draft.nothing(self.kind)

    def _offer(self, history, follows: int, n: int, k: int, run: int | None = None) -> list[int]:
        # Offer as many tokens as the match already runs back (at least MIN_OFFER): a long
        # draft after a short, chance match mostly wastes a big verification batch.
        run = self._run(history, follows, n) if run is None else run
        return list(history[follows : follows + min(k, max(run, MIN_OFFER))])

    def _others(self, history, bet: int, n: int, k: int) -> tuple[Alternative, ...]:
        """Other continuations of the text's tail, each from where its first token last followed: the matched
        n-gram's other followers, the most frequent first (among equals the latest), then those of ever
        shorter n-grams of the tail (a long match is specific: "sat. The cat" went on one way, "The cat"
        several), until `alternatives` are found."""
        found: dict[int, Alternative] = {}
        for size in self.sizes[self.sizes.index(n):]:
            followers = self.followers[size].get(tuple(history[-size:]), {})
            seen = sum(map(_count, followers.values()))
            for followed, token in sorted(((followed, token) for token, followed in followers.items()), reverse=True):
                count, end = _count(followed), followed & POSITION
                if len(found) == self.alternatives:
                    return tuple(found.values())
                if token != bet and token not in found:
                    found[token] = Alternative(0, len(found) + 2, tuple(self._offer(history, end, size, k)),
                                               count / seen)
        return tuple(found.values())

    @staticmethod
    def _run(history, follows: int, n: int) -> int:
        """How many tokens before `follows` equal the last ones of history (at least n, at most RUN_LIMIT)."""
        matched = n
        while matched < RUN_LIMIT and matched < follows and history[follows - 1 - matched] == history[-1 - matched]:
            matched += 1
        return matched


def _agreement(followers: dict[int, int], proposed: int) -> Agreement:
    seen = sum(map(_count, followers.values()))
    if seen == 1:
        return Agreement.SEEN_ONCE
    return Agreement.AGREE if _count(followers[proposed]) == seen else Agreement.DIFFER


# How often a token followed an n-gram and where it last did, in one int (its count above POSITION's bits, so that
# the ints sort as (count, position) pairs would): an index of a long context then holds no objects the garbage
# collector walks (a list a pair made each collection of a 32,000-token index take tens of milliseconds).
POSITION = (1 << 32) - 1


def _followed(count: int, position: int) -> int:
    return count << 32 | position


def _count(followed: int) -> int:
    return followed >> 32


class SuffixDrafter:
    """Earlier generations in this process draft (SuffixDecoding, Oliaro et al. 2025): the longest tail
    of the text found in a SuffixCache, continued as most often before. Its proposals name Evidence as
    n-gram lookup's do (how far the match runs back; whether the earlier continuations agree), so auto
    keeps beliefs of its own for them, learned from the text for free."""

    kind = DrafterKind.SUFFIX

    def __init__(self, cache: SuffixCache | None, alternatives: int = 0):
        """alternatives: how many of the other continuations at the draft's branch points a proposal holds,
        for auto to grow a tree of (the suffix cache drafts within auto only)."""
        self.cache = cache  # None: drafting from nothing for a while (bench's auto-no-suffix)
        self.alternatives = alternatives

    def begin(self, prompt, sampling, rng) -> None:
        pass

    def propose(self, history, k) -> Draft:
        if self.cache is None:
            return Draft.nothing(self.kind)
        found = self.cache.propose(history, k, self.alternatives, shortest=SUFFIX_MIN_MATCH)
        if not found.tokens:
            return Draft.nothing(self.kind)
        agreement = (Agreement.SEEN_ONCE if found.support == 1
                     else Agreement.AGREE if found.probabilities[0] == 1.0 else Agreement.DIFFER)
        return Draft(list(found.tokens), source=self.kind, evidence=Evidence(RunClass.of(found.match), agreement),
                     run=found.match, alternatives=found.alternatives)


SUFFIX_MIN_MATCH = 2  # a one-token match among a million earlier tokens is chance, as n-gram lookup's ngram_min
