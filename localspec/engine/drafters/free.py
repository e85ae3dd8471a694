"""Drafters that cost no forward pass: n-gram lookup in the text so far, and earlier generations
(the suffix cache)."""

from collections import Counter

import numpy as np

from ...config import DrafterKind
from ..suffix import SuffixCache
from ..tree import Alternative, DraftTree
from .base import Agreement, Draft, Evidence, RunClass


MIN_OFFER = 4  # tokens any n-gram match may offer (best of 3, 4 and 8 in a replay of recorded generations)
RUN_LIMIT = 32  # how far back a match is followed when judging the evidence behind it


class NgramDrafter:
    """Prompt lookup: if the last n tokens occurred before, propose what followed them.

    The text is searched at each proposal, not indexed: an array copy of it, to which each step adds its tokens,
    is compared with its last tokens, and the few places that match are narrowed to the longer n-grams. A new
    prompt costs its copy (0.6-1.1 ms at 32,000 tokens) where an index of its n-grams cost 2.5-4 ms at 2,000 tokens
    and 108-116 ms at 32,000, at the first proposal of every new prompt (a retrieval question, a new client of a
    server). A proposal costs more than an index's: 13-15 us in 32,000 random tokens (an index's 6), 24 us in a
    retrieval prompt's 2,700 tokens (19), its alternatives counted, so an index would pay only for an answer of many
    hundred tokens after a new long prompt. Each proposal names its Evidence: how far the match runs
    back and whether the n-gram's earlier occurrences agree on what follows it.
    """

    kind = DrafterKind.NGRAM

    def __init__(self, n_min: int, n_max: int, alternatives: int = 0, branching: bool = False):
        """alternatives: how many other continuations of the n-gram (by what followed its other occurrences)
        a proposal holds beside the one it bets on; branching: propose them as a draft tree (a fixed
        n-gram drafter's; auto weighs them itself)."""
        self.sizes = range(n_max, n_min - 1, -1)  # longest match first
        self.alternatives, self.branching = alternatives, branching
        self._text = np.empty(0, dtype=np.int32)  # the history's first `_held` tokens, room to grow after them
        self._held = 0

    @property
    def branches(self) -> int:
        """The most branches its drafts' trees have."""
        return self.alternatives + 1 if self.branching else 1

    def for_sequence(self) -> "NgramDrafter":
        """A twin for another sequence, searching its own text."""
        return NgramDrafter(self.sizes[-1], self.sizes[0], self.alternatives, self.branching)

    def begin(self, prompt, sampling, rng) -> None:
        self._held = 0  # (the prompt is copied at the first proposal)

    def propose(self, history, k) -> Draft:
        found = self._occurrences(history, self._copy(history))
        for n in self.sizes:
            if n in found:
                follows = found[n][-1]  # the latest occurrence
                run = self._run(history, follows, n)
                evidence = Evidence(RunClass.of(run), _agreement([history[end] for end in found[n]], history[follows]))
                tokens = self._offer(history, follows, n, k, run)
                alternatives = self._others(history, found, history[follows], n, k) if self.alternatives else ()
                tree = DraftTree.forked(tokens, alternatives) if self.branching and alternatives else None
                return Draft(tokens, source=self.kind, evidence=evidence, run=run, alternatives=alternatives,
                             tree=tree)
        return Draft.nothing(self.kind)

    def _copy(self, history) -> np.ndarray:
        """The history as an array: the tokens it gained since the last proposal copied in (a generation's history
        only grows)."""
        if len(history) > len(self._text):
            grown = np.empty(2 * len(history), dtype=np.int32)
            grown[: self._held] = self._text[: self._held]
            self._text = grown
        if len(history) > self._held:
            self._text[self._held : len(history)] = history[self._held :]
        self._held = len(history)
        return self._text[: self._held]

    def _occurrences(self, history, text: np.ndarray) -> dict[int, list[int]]:
        """For each n-gram size with any: where each earlier occurrence of the text's last n tokens ends, in order
        (only those a token follows: never the text's own end). The shortest n-gram's are found by comparing the
        whole text (its array) a token at a time; a longer one's are among a shorter one's, few, so each size's
        are narrowed from the last in Python."""
        last, shortest, found = len(text), self.sizes[-1], {}
        if last <= shortest:
            return found
        matches = text[shortest - 1 : last - 1] == text[last - 1]  # ends e, shortest <= e < last
        for back in range(2, shortest + 1):
            matches &= text[shortest - back : last - back] == text[last - back]
        ends = (np.flatnonzero(matches) + shortest).tolist()
        for n in range(shortest, min(self.sizes[0], last) + 1):
            if n > shortest:
                token = history[last - n]
                ends = [end for end in ends if end >= n and history[end - n] == token]
            if not ends:
                break
            found[n] = ends
        return found

    def _offer(self, history, follows: int, n: int, k: int, run: int | None = None) -> list[int]:
        # Offer as many tokens as the match already runs back (at least MIN_OFFER): a long
        # draft after a short, chance match mostly wastes a big verification batch.
        run = self._run(history, follows, n) if run is None else run
        return list(history[follows : follows + min(k, max(run, MIN_OFFER))])

    def _others(self, history, found: dict[int, list[int]], bet: int, n: int, k: int) -> tuple[Alternative, ...]:
        """Other continuations of the text's tail, each from where its first token last followed: the matched
        n-gram's other followers, the most frequent first (among equals the latest), then those of ever
        shorter n-grams of the tail (a long match is specific: "sat. The cat" went on one way, "The cat"
        several), until `alternatives` are found."""
        others: dict[int, Alternative] = {}
        for size in self.sizes[self.sizes.index(n):]:
            ends = found[size]
            unlike = [end for end in ends if history[end] != bet]
            if not unlike:  # (a loop's n-gram, every earlier occurrence gone on as the bet: a quarter of its lookup)
                continue
            followers = [history[end] for end in unlike]
            counts, latest = Counter(followers), dict(zip(followers, unlike))  # (the later end wins)
            for token in sorted(counts, key=lambda token: (counts[token], latest[token]), reverse=True):
                if len(others) == self.alternatives:
                    return tuple(others.values())
                if token not in others:
                    others[token] = Alternative(0, len(others) + 2, tuple(self._offer(history, latest[token], size, k)),
                                                counts[token] / len(ends))
        return tuple(others.values())

    @staticmethod
    def _run(history, follows: int, n: int) -> int:
        """How many tokens before `follows` equal the last ones of history (at least n, at most RUN_LIMIT)."""
        matched = n
        while matched < RUN_LIMIT and matched < follows and history[follows - 1 - matched] == history[-1 - matched]:
            matched += 1
        return matched


def _agreement(followers: list[int], proposed: int) -> Agreement:
    if len(followers) == 1:
        return Agreement.SEEN_ONCE
    return Agreement.AGREE if all(follower == proposed for follower in followers) else Agreement.DIFFER


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
