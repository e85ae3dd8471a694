"""llama.cpp's logit bias (ignore_eos's ban of the end-of-generation tokens among it) and its repetition,
frequency and presence penalties, applied to a context's logit rows in place before its sampler chain reads
them, in llama.cpp's order: the bias, then the penalties.

A bias is the same on every row; a penalty depends only on the tokens before a position, so a verification
row is penalised for the committed tokens and the drafted ones before it, exactly as plain decoding would have
penalised that row had it got there one token at a time: the rejection rule then compares the target's own
changed distribution with the draft's, and the output stays the target's.
"""

from collections.abc import Sequence

import numpy as np

from ..config import Sampling
from .model import Model
from .tree import DraftTree


class Adjustments:
    """The bias and penalties of one Sampling for one model's rows; made only where one changes anything
    (Sampling.adjusted). eog: the model's end-of-generation tokens, banned by ignore_eos."""

    def __init__(self, sampling: Sampling, eog: Sequence[int] = ()):
        # a token named twice is biased twice, as llama.cpp's sampler adds each pair
        biased = [*sampling.logit_bias, *((token, -np.inf) for token in (eog if sampling.ignore_eos else ()))]
        self.biased = np.array([token for token, _ in biased], dtype=np.int64)
        self.bias = np.array([bias for _, bias in biased], dtype=np.float32)
        self.penalized = sampling.penalized
        self.repeat = sampling.repeat_penalty
        self.frequency = sampling.frequency_penalty
        self.presence = sampling.presence_penalty
        self.last_n = sampling.repeat_last_n  # > 0, or -1: every token before

    @classmethod
    def of(cls, sampling: Sampling, model: Model | None = None) -> "Adjustments | None":
        """Those of a generation on model (whose end-of-generation tokens ignore_eos bans), where any."""
        if not sampling.adjusted:
            return None
        return cls(sampling, model.eog_tokens if sampling.ignore_eos and model is not None else ())

    def apply(self, logits: np.ndarray, history: Sequence[int], drafted: Sequence[int] = ()) -> None:
        """Change a row in place: biased, then penalised for the tokens before its position (history, then
        drafted)."""
        if self.biased.size:
            inside = self.biased < len(logits)  # a draft's vocabulary may be shorter
            np.add.at(logits, self.biased[inside], self.bias[inside])
        if self.penalized:
            self._penalise(logits, history, drafted)

    def _penalise(self, logits: np.ndarray, history: Sequence[int], drafted: Sequence[int]) -> None:
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
        """Change a verification's rows in place: row i follows history and the first i drafted tokens.
        rows(i): row i's logits, writable."""
        self.apply_tree(rows, history, DraftTree.chain(drafted))

    def apply_tree(self, rows, history: Sequence[int], tree: DraftTree) -> None:
        """As apply_rows, for a draft tree's verification: node i's row follows history and its path."""
        for row, before in enumerate(tree.prefixes()):
            self.apply(rows(row), history, before)
