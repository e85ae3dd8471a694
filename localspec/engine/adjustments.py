"""llama.cpp's logit bias (ignore_eos's ban of the end-of-generation tokens among it), its repetition,
frequency and presence penalties and its DRY, applied to a context's logit rows in place before its sampler
chain reads them, in llama.cpp's order: the bias, the penalties, DRY.

A bias is the same on every row; a penalty and DRY depend only on the tokens before a position, so a
verification row is penalised for the committed tokens and the drafted ones before it, exactly as plain
decoding would have penalised that row had it got there one token at a time: the rejection rule then compares
the target's own changed distribution with the draft's, and the output stays the target's.
"""

from collections.abc import Sequence

import numpy as np

from ..config import Sampling
from .model import Model
from .tree import DraftTree


# a DRY penalty's exponent at most, so that dry_base ** it stays a float: llama.cpp's log of FLT_MAX
FLOAT_MAX_LOG = np.float32(88.7228391)


class Adjustments:
    """The bias, penalties and DRY of one Sampling for one model's rows; made only where one changes anything
    (Sampling.adjusted). eog: the model's end-of-generation tokens, banned by ignore_eos; breakers: DRY's
    sequence breakers in the model's vocabulary (Model.dry_breakers)."""

    def __init__(self, sampling: Sampling, eog: Sequence[int] = (),
                 breakers: dict[int, tuple[tuple[int, ...], ...]] | None = None):
        # a token named twice is biased twice, as llama.cpp's sampler adds each pair
        biased = [*sampling.logit_bias, *((token, -np.inf) for token in (eog if sampling.ignore_eos else ()))]
        self.biased = np.array([token for token, _ in biased], dtype=np.int64)
        self.bias = np.array([bias for _, bias in biased], dtype=np.float32)
        self.penalized = sampling.penalized
        self.repeat = sampling.repeat_penalty
        self.frequency = sampling.frequency_penalty
        self.presence = sampling.presence_penalty
        self.last_n = sampling.repeat_last_n  # > 0, or -1: every token before
        self.dry = _Dry(sampling, breakers or {}) if sampling.dry else None

    @classmethod
    def of(cls, sampling: Sampling, model: Model | None = None) -> "Adjustments | None":
        """Those of a generation on model (whose end-of-generation tokens ignore_eos bans), where any."""
        if not sampling.adjusted:
            return None
        return cls(sampling, model.eog_tokens if sampling.ignore_eos and model is not None else (),
                   model.dry_breakers(sampling.dry_sequence_breakers) if sampling.dry and model is not None else None)

    def apply(self, logits: np.ndarray, history: Sequence[int], drafted: Sequence[int] = ()) -> None:
        """Change a row in place: biased, then penalised and DRY'd for the tokens before its position (history,
        then drafted)."""
        self._apply(logits, self._past(history), drafted)

    def _past(self, history: Sequence[int]) -> np.ndarray:
        """The committed tokens any window reaches (the whole history where one reaches all of it), as an array:
        made once a verification, not once a row."""
        reach = [self.last_n] * self.penalized + ([self.dry.last_n] if self.dry else [])
        if -1 in reach:
            return np.asarray(history, dtype=np.int64)
        return np.asarray(history[max(0, len(history) - max(reach, default=0)):], dtype=np.int64)

    def _apply(self, logits: np.ndarray, past: np.ndarray, drafted: Sequence[int]) -> None:
        if self.biased.size:
            inside = self.biased < len(logits)  # a draft's vocabulary may be shorter
            np.add.at(logits, self.biased[inside], self.bias[inside])
        if self.penalized or self.dry:
            before = np.concatenate([past, np.asarray(drafted, dtype=np.int64)]) if len(drafted) else past
            if self.penalized:
                self._penalise(logits, before)
            if self.dry:
                self.dry.apply(logits, before)

    def _penalise(self, logits: np.ndarray, before: np.ndarray) -> None:
        window = before if self.last_n < 0 else before[-self.last_n:]
        if not window.size:
            return
        ids, counts = np.unique(window, return_counts=True)
        ids, counts = ids[ids < len(logits)], counts[ids < len(logits)]  # a draft's vocabulary may be shorter
        seen = logits[ids]
        seen = np.where(seen <= 0, seen * self.repeat, seen / self.repeat)
        logits[ids] = seen - counts * self.frequency - self.presence

    def apply_rows(self, rows, history: Sequence[int], drafted: Sequence[int]) -> None:
        """Change a verification's rows in place: row i follows history and the first i drafted tokens.
        rows(i): row i's logits, writable."""
        self.apply_tree(rows, history, DraftTree.chain(drafted))

    def apply_tree(self, rows, history: Sequence[int], tree: DraftTree) -> None:
        """As apply_rows, for a draft tree's verification: node i's row follows history and its path."""
        past = self._past(history)
        for row, before in enumerate(tree.prefixes()):
            self._apply(rows(row), past, before)


class _Dry:
    """llama.cpp's DRY sampler over a row, given every token before its position: each earlier occurrence of a
    run the window ends with (counted no further back than the last sequence breaker) marks the token that
    followed it, which would extend the repeat; a token's longest mark, where dry_allowed_length or more, costs it
    dry_multiplier * dry_base ** (mark - dry_allowed_length) of its logit. A single-token breaker is never
    penalised. The arithmetic is llama.cpp's (float32 settings, a double power, a float32 penalty)."""

    def __init__(self, sampling: Sampling, breakers: dict[int, tuple[tuple[int, ...], ...]]):
        self.multiplier = np.float64(np.float32(sampling.dry_multiplier))
        self.base = np.float64(np.float32(sampling.dry_base))
        self.allowed = sampling.dry_allowed_length
        self.last_n = sampling.dry_penalty_last_n  # > 0, or -1: every token before
        self.breakers = breakers
        self.heads = _marks(breakers)
        self.alone = _marks([head for head, tails in breakers.items() if () in tails])
        base = np.float32(sampling.dry_base)
        self.most_exponent = int(FLOAT_MAX_LOG / np.log(base)) if base > np.float32(1.000001) else 0

    def apply(self, logits: np.ndarray, before: np.ndarray) -> None:
        window = before if self.last_n < 0 else before[-self.last_n:]
        n = len(window)
        if n <= self.allowed:
            return
        limit = self._repeat_limit(window)
        if limit < self.allowed:
            return
        # repeats[i]: how many tokens ending at i repeat the window's end (at most limit)
        repeats = np.zeros(n - 1, dtype=np.int64)
        at, length = np.flatnonzero(window[:-1] == window[-1]), 0
        while at.size and length < limit:
            length += 1
            repeats[at] = length
            at = at[at >= length]
            at = at[window[at - length] == window[n - 1 - length]]
        marked = repeats >= self.allowed
        ids, inverse = np.unique(window[1:][marked], return_inverse=True)
        longest = np.zeros(len(ids), dtype=np.int64)
        np.maximum.at(longest, inverse, repeats[marked])
        keep = (ids < len(logits)) & ~_marked(self.alone, ids)  # (a draft's vocabulary may be shorter)
        exponent = longest[keep] - self.allowed
        if self.most_exponent > 0:
            exponent = np.minimum(exponent, self.most_exponent)
        logits[ids[keep]] -= (self.multiplier * self.base ** exponent).astype(np.float32)

    def _repeat_limit(self, window: np.ndarray) -> int:
        """How far back a repeat may reach: to the nearest sequence breaker (a head and its whole tail, the
        longest tail that matches), or the whole window where there is none."""
        n = len(window)
        for at in np.flatnonzero(_marked(self.heads, window))[::-1].tolist():
            behind = n - 1 - at  # tokens after the head
            tails = [tail for tail in self.breakers[int(window[at])]
                     if len(tail) <= behind and tuple(window[at + 1 : at + 1 + len(tail)].tolist()) == tail]
            if tails:
                return behind - max(map(len, tails))
        return n


def _marks(tokens) -> np.ndarray:
    """A lookup by token id: np.isin over thousands of tokens, once a row, cost more than the rest of DRY."""
    marks = np.zeros(max(tokens, default=-1) + 1, dtype=bool)
    marks[list(tokens)] = True
    return marks


def _marked(marks: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Whether each token is marked (one past the lookup's end is not)."""
    if not len(marks):
        return np.zeros(len(tokens), dtype=bool)
    return marks[np.minimum(tokens, len(marks) - 1)] & (tokens < len(marks))
