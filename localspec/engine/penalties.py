"""llama.cpp's repetition, frequency and presence penalties, applied to a context's logit rows in place
before its sampler chain reads them.

A penalty depends only on the tokens before a position, so a verification row is penalised for the
committed tokens and the drafted ones before it, exactly as plain decoding would have penalised that row
had it got there one token at a time: the rejection rule then compares the target's own penalised
distribution with the draft's, and the output stays the target's.
"""

from collections.abc import Sequence

import numpy as np

from ..config import Sampling
from .tree import DraftTree


class Penalties:
    """The penalties of one Sampling; made only where one changes anything (Sampling.penalized)."""

    def __init__(self, sampling: Sampling):
        self.repeat = sampling.repeat_penalty
        self.frequency = sampling.frequency_penalty
        self.presence = sampling.presence_penalty
        self.last_n = sampling.repeat_last_n  # > 0, or -1: every token before

    @classmethod
    def of(cls, sampling: Sampling) -> "Penalties | None":
        return cls(sampling) if sampling.penalized else None

    def apply(self, logits: np.ndarray, history: Sequence[int], drafted: Sequence[int] = ()) -> None:
        """Penalise a row in place for the tokens before its position: history, then drafted."""
        if self.last_n < 0:
            window = [*history, *drafted]
        else:
            window = [*history[-self.last_n:], *drafted][-self.last_n:]
        if not window:
            return
        ids, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
        ids, counts = ids[ids < len(logits)], counts[ids < len(logits)]  # a draft's vocabulary may be shorter
        seen = logits[ids]
        seen = np.where(seen <= 0, seen * self.repeat, seen / self.repeat)
        logits[ids] = seen - counts * self.frequency - self.presence

    def apply_rows(self, rows, history: Sequence[int], drafted: Sequence[int]) -> None:
        """Penalise a verification's rows in place: row i follows history and the first i drafted tokens.
        rows(i): row i's logits, writable."""
        self.apply_tree(rows, history, DraftTree.chain(drafted))

    def apply_tree(self, rows, history: Sequence[int], tree: DraftTree) -> None:
        """As apply_rows, for a draft tree's verification: node i's row follows history and its path."""
        for row, before in enumerate(tree.prefixes()):
            self.apply(rows(row), history, before)
