"""Drafts from earlier requests: a memory-bounded index over the tokens of finished generations.

The cross-request draft source of SuffixDecoding (Oliaro et al., 2025, "SuffixDecoding: Extreme
Speculative Decoding for Emerging AI Applications"; vLLM's `suffix` speculative method). Batch items,
chat turns and agent requests repeat each other's text, so the continuation of the current context is
often in an earlier generation, not in this one. Given the context's last tokens, `SuffixCache.propose`
finds their longest match among earlier generations and grows a draft greedily along the continuation
that followed most often, scored as a suffix tree's frequencies score it (a child's count over its
node's count), while the product of those frequencies stays above a threshold and the draft is no
longer than alpha x the match length (SuffixDecoding's max_spec_factor) and a hard cap.

The index is a "prefix array": one entry per position that follows a token, keyed by the tokens before
it, newest first (t[p-1], t[p-2], ... up to `depth`), 3 big-endian bytes a token, as one fixed-width
numpy byte string. Sorted by key, the positions whose preceding tokens equal the context's tail form a
contiguous range. The key sharing the most leading tokens with the tail lies next to where the tail's
own key would be inserted, so a lookup is three `searchsorted` calls a tier: one finds the match length,
two its range. Keys end where their generation starts (zero bytes, which no token encodes), so no match
runs across two generations.

Adding a generation must not re-sort everything (about 250 ms at 1M entries), so entries live in two
sorted tiers: a large sealed one and a small recent one. A finished generation is merged into the
recent tier (its own entries sorted, then inserted at `searchsorted` positions: a copy of the small
tier); when the recent tier outgrows RECENT_ENTRIES it is merged into the sealed one the same way.
Every recent entry is newer than every sealed one, which keeps "the most recent occurrences" cheap to
find and the results independent of how entries are split between the tiers.

Isolation (one cache per target model, per API key in serve) is the owner's; an empty cache holds no
arrays worth counting. Nothing is written to disk.
"""

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .tree import Alternative

TOKEN_BYTES = 3  # ids up to 2**24 - 2 (vocabularies reach 262,144); id + 1 is stored so 0 means "none"
MAX_TOKEN_ID = 2 ** (8 * TOKEN_BYTES) - 2
END = -1  # stored after each generation in the text: never drafted, and ends a continuation

# Recent-tier size at which it is merged into the sealed tier. Each add copies the recent tier and each
# merge copies the sealed one, so the amortized cost per add is about a*R + b*S*n/R for n-token adds:
# least near R = sqrt(n*S), about 20k entries for 500-token generations at 1M cached tokens.
RECENT_ENTRIES = 16_384


@dataclass(frozen=True)
class SuffixDraft:
    """A proposal from earlier generations and what it rests on.

    `probabilities[i]` is how often draft token i followed, among the sampled earlier occurrences that
    agree with the draft up to it (a suffix tree's child count over node count); `match` is how many of
    the context's last tokens matched; `support` is how many earlier occurrences of that match there are.
    """

    tokens: list[int]
    probabilities: list[float]
    match: int = 0
    support: int = 0
    alternatives: tuple[Alternative, ...] = ()  # other continuations at the draft's branch points

    @property
    def reach(self) -> list[float]:
        """The estimated chance that the draft holds through each position (products of the frequencies)."""
        return np.cumprod(self.probabilities).tolist()


NO_DRAFT = SuffixDraft([], [])


class _Tier:
    """Entries sorted by (key, position): `keys` the packed preceding tokens, `at` the global position
    of the token each entry predicts."""

    def __init__(self, width: int):
        self.keys = np.empty(0, dtype=f"S{width}")
        self.at = np.empty(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.at)

    def merge(self, keys: np.ndarray, at: np.ndarray) -> None:
        """Insert entries sorted by (key, position) and all newer than this tier's own."""
        # side="right": an equal key's newer entry goes after the older ones, keeping (key, position) order.
        where = self.keys.searchsorted(keys, side="right")
        self.keys = np.insert(self.keys, where, keys)
        self.at = np.insert(self.at, where, at)

    def keep_from(self, first: int) -> None:
        """Drop the entries of positions before `first` (a filter keeps the order)."""
        kept = self.at >= first
        self.keys = self.keys[kept]
        self.at = self.at[kept]

    def deepest(self, tail: bytes) -> tuple[int, int, int]:
        """The most leading tokens of `tail` (packed like a key) that keys start with, and the range
        (lo, hi) of those keys; (0, 0, 0) when no key starts with its first token."""
        if not len(self.keys):
            return 0, 0, 0
        # The key sharing the longest prefix with the tail is next to where the tail would be inserted.
        width = self.keys.itemsize
        where = int(self.keys.searchsorted(tail.ljust(width, b"\x00")))
        shared = max(self._shared(tail, self.keys[near]) for near in (where - 1, where) if 0 <= near < len(self.keys))
        depth = shared // TOKEN_BYTES
        if not depth:
            return 0, 0, 0
        prefix = tail[: TOKEN_BYTES * depth]
        rest = width - len(prefix)
        # Bounds as wide as the keys: a narrower needle would make numpy widen the whole array.
        lo = int(self.keys.searchsorted(prefix + b"\x00" * rest, "left"))
        hi = int(self.keys.searchsorted(prefix + b"\xff" * rest, "right"))
        return depth, lo, hi

    @staticmethod
    def _shared(tail: bytes, key: bytes) -> int:
        """How many leading bytes of tail the key shares (numpy hands keys back without trailing zeros)."""
        key = key[: len(tail)].ljust(len(tail), b"\x00")
        differ = int.from_bytes(tail, "big") ^ int.from_bytes(key, "big")
        return len(tail) - (differ.bit_length() + 7) // 8


class SuffixCache:
    """Earlier generations' tokens, at most `max_tokens` of them (the oldest generations dropped first),
    and the drafts they propose for a context.

    depth: the longest match looked for (tokens). alpha, max_draft: a draft is at most alpha x the match
    length and at most max_draft tokens. min_probability: the draft stops before the product of its
    frequencies falls below this. sample: the most recent occurrences of the match whose continuations
    are counted (the support counts them all).

    Not thread-safe: its one owner (a session, serve's worker thread) adds and proposes.
    """

    def __init__(
        self,
        max_tokens: int = 1_000_000,
        depth: int = 12,
        alpha: float = 2.0,
        max_draft: int = 32,
        min_probability: float = 0.1,
        sample: int = 32,
    ):
        if max_tokens < 1 or depth < 1 or sample < 1:
            raise ValueError("max_tokens, depth and sample must be positive")
        self.max_tokens = max_tokens
        self.depth = depth
        self.alpha = alpha
        self.max_draft = max_draft
        self.min_probability = min_probability
        self.sample = sample
        self.width = depth * TOKEN_BYTES
        self.offsets = np.arange(max_draft)
        self.clear()

    def clear(self) -> None:
        """Forget every generation (also what mends a cache whose add was interrupted half-way)."""
        self.sealed = _Tier(self.width)
        self.recent = _Tier(self.width)
        # The text of the cached generations, each followed by END; text[i] is global position base + i.
        self.text = np.empty(0, dtype=np.int32)
        self.used = 0
        self.base = 0
        self.generations: deque[tuple[int, int]] = deque()  # (global start, length), oldest first
        self.tokens = 0  # cached tokens, END markers not counted

    @property
    def nbytes(self) -> int:
        """Memory held by the index and its text, in bytes."""
        tiers = (self.sealed, self.recent)
        return self.text.nbytes + sum(tier.keys.nbytes + tier.at.nbytes for tier in tiers) + 16 * len(self.generations)

    def add(self, tokens: Sequence[int]) -> None:
        """Index one finished generation (its tokens in order)."""
        self._index([tokens], into=self.recent)
        if len(self.recent) > RECENT_ENTRIES:
            self._seal()
        self._evict()

    def extend(self, generations: Iterable[Sequence[int]]) -> None:
        """Index many finished generations at once, oldest first, with one sort (a warm start)."""
        self._seal()
        self._index(generations, into=self.sealed)
        self._evict()

    def propose(self, context: Sequence[int], limit: int | None = None, alternatives: int = 0,
                shortest: int = 1) -> SuffixDraft:
        """A draft to follow `context` (at most `limit` tokens), from the earlier generations that
        continue its longest matching tail; NO_DRAFT when nothing matches. alternatives: how many of the
        other continuations at the draft's branch points to hold beside it, likeliest first (for a tree).
        shortest: a match of fewer tokens drafts nothing (and costs no walk: most tails of a text match
        a token or so of a large cache by chance)."""
        longest = min(self.depth, len(context))
        if not self.tokens or not longest:
            return NO_DRAFT
        tail = b"".join((int(token) + 1).to_bytes(TOKEN_BYTES, "big") for token in reversed(context[-longest:]))
        found = [(tier, *tier.deepest(tail)) for tier in (self.recent, self.sealed)]  # newer tier first
        match = max(depth for _, depth, _, _ in found)
        if not match:
            return NO_DRAFT
        ranges = [(tier, lo, hi) for tier, depth, lo, hi in found if depth == match]
        support = sum(hi - lo for _, lo, hi in ranges)
        length = min(int(self.alpha * match), self.max_draft, self.max_draft if limit is None else limit)
        if length < 1 or match < shortest:
            return SuffixDraft([], [], match, support)
        positions = self._most_recent(ranges, full_depth=match == self.depth)
        # Continuations read past END into the next generation; the walk never goes past END.
        reads = np.minimum(positions[:, None] - self.base + self.offsets[:length], self.used - 1)
        found: list[Alternative] | None = [] if alternatives else None
        tokens, probabilities = self._walk(self.text[reads], found, alternatives)
        return SuffixDraft(tokens, probabilities, match, support, tuple(found or ()))

    def _most_recent(self, ranges: list[tuple[_Tier, int, int]], full_depth: bool) -> np.ndarray:
        """Global positions of the `sample` most recent entries in the ranges, newest first. Recent-tier
        entries are all newer than sealed ones; at full depth a range's keys are equal, so it is sorted by
        position and its newest are its last; a shallower range needs a selection over it."""
        chosen = []
        wanted = self.sample
        for tier, lo, hi in ranges:
            if not wanted:
                break
            at = tier.at[lo:hi]
            if len(at) > wanted:
                at = at[-wanted:] if full_depth else at[np.argpartition(at, len(at) - wanted)[-wanted:]]
            chosen.append(np.sort(at)[::-1])
            wanted -= len(at)
        return np.concatenate(chosen)

    def _walk(self, rows: np.ndarray, alternatives: list[Alternative] | None = None,
              most: int = 0) -> tuple[list[int], list[float]]:
        """Grow the draft along the most frequent continuation of the rows (the sampled occurrences'
        continuations, newest first), one branch point at a time. alternatives: where given, up to `most`
        of the other continuations at the draft's branch points are added to it, likeliest first."""
        tokens: list[int] = []
        probabilities: list[float] = []
        reach = 1.0
        column, length = 0, rows.shape[1]
        while column < length:
            # Where every remaining row agrees with the newest, each token's frequency is 1.
            differs = (rows[:, column:] != rows[0, column:]).any(axis=0)
            branch = column + int(differs.argmax()) if differs.any() else length
            shared = rows[0, column:branch].tolist()
            ended = END in shared  # then every remaining occurrence ended there
            shared = shared[: shared.index(END)] if ended else shared
            tokens += shared
            probabilities += [1.0] * len(shared)
            if ended or branch == length:
                break
            counts: dict[int, int] = {}
            for token in rows[:, branch].tolist():  # a few dozen rows: cheaper than np.unique
                counts[token] = counts.get(token, 0) + 1
            counts.pop(END, None)
            # Most frequent; among equals the one seen most recently (the rows are newest first, and
            # max keeps the first of equals in the dict's order of first sight).
            best = max(counts, key=counts.__getitem__)
            probability = counts[best] / len(rows)
            reach *= probability
            if reach < self.min_probability:
                break
            if alternatives is not None:
                self._alternatives(rows, branch, counts, best, len(tokens), alternatives, most)
            tokens.append(best)
            probabilities.append(probability)
            rows = rows[rows[:, branch] == best]
            column = branch + 1
        return tokens, probabilities

    def _alternatives(self, rows: np.ndarray, branch: int, counts: dict[int, int], best: int, fork: int,
                      into: list[Alternative], most: int) -> None:
        """The continuations other than best at a branch point, each followed as the draft is, kept among
        the `most` likeliest alternatives (by their frequency there)."""
        others = sorted((token for token in counts if token != best), key=counts.__getitem__, reverse=True)
        for rank, token in enumerate(others, start=2):
            share = counts[token] / len(rows)
            if len(into) == most and share <= into[-1].share:
                break
            taken = rows[rows[:, branch] == token][:, branch + 1:]
            after = self._walk(taken)[0] if taken.shape[1] else []
            into.append(Alternative(fork, rank, (token, *after), share))
            into.sort(key=lambda alternative: -alternative.share)
            del into[most:]

    def _index(self, generations: Iterable[Sequence[int]], into: _Tier) -> None:
        """Append generations to the text and merge their entries, sorted by (key, position), into a tier."""
        keys, at = [], []
        for generation in generations:
            tokens = np.asarray(generation, dtype=np.int64)
            if not len(tokens):
                continue
            if tokens.min() < 0 or tokens.max() > MAX_TOKEN_ID:
                raise ValueError(f"token ids must lie in 0..{MAX_TOKEN_ID}")
            if len(tokens) > self.max_tokens:  # only its end fits
                tokens = tokens[-self.max_tokens :]
            start = self._append(tokens)
            keys.append(self._keys(tokens))
            at.append(np.arange(start + 1, start + len(tokens) + 1, dtype=np.int64))
        if not keys:
            return
        keys, at = np.concatenate(keys), np.concatenate(at)
        order = np.argsort(keys, kind="stable")  # stable: equal keys stay in position order
        into.merge(keys[order], at[order])

    def _keys(self, tokens: np.ndarray) -> np.ndarray:
        """The key of each position after a token of one generation: the tokens before it, newest first,
        as big-endian bytes, zero past the generation's start."""
        encoded = (tokens + 1)[:, None] >> (8 * np.arange(TOKEN_BYTES - 1, -1, -1)) & 0xFF
        padded = np.zeros((len(tokens) + self.depth, TOKEN_BYTES), dtype=np.uint8)
        padded[self.depth - 1 : self.depth - 1 + len(tokens)] = encoded
        keys = np.empty((len(tokens), self.width), dtype=np.uint8)
        for back in range(self.depth):  # entry i's token `back` places before it is tokens[i - back]
            start = self.depth - 1 - back
            keys[:, back * TOKEN_BYTES : (back + 1) * TOKEN_BYTES] = padded[start : start + len(tokens)]
        return keys.view(f"S{self.width}").ravel()

    def _append(self, tokens: np.ndarray) -> int:
        """Append a generation and its END to the text; its global start position."""
        needed = self.used + len(tokens) + 1
        if needed > len(self.text):
            grown = np.empty(max(needed, 2 * len(self.text)), dtype=np.int32)
            grown[: self.used] = self.text[: self.used]
            self.text = grown
        start = self.base + self.used
        self.text[self.used : self.used + len(tokens)] = tokens
        self.text[self.used + len(tokens)] = END
        self.used = needed
        self.generations.append((start, len(tokens)))
        self.tokens += len(tokens)
        return start

    def _seal(self) -> None:
        if len(self.recent):
            self.sealed.merge(self.recent.keys, self.recent.at)
            self.recent = _Tier(self.width)

    def _evict(self) -> None:
        """Past max_tokens, drop the oldest generations down to 15/16 of it: the filter and the copy of
        the text cost O(cached tokens), paid once per 1/16 of the cap rather than on every add."""
        if self.tokens <= self.max_tokens:
            return
        keep = self.max_tokens - self.max_tokens // 16
        while self.tokens > keep and len(self.generations) > 1:
            _, length = self.generations.popleft()
            self.tokens -= length
        first = self.generations[0][0]
        for tier in (self.sealed, self.recent):
            tier.keep_from(first)
        self.text = self.text[first - self.base : self.used].copy()
        self.used -= first - self.base
        self.base = first
