"""Rows a generation on a sequence of a shared context (Context.sequence) wants decoded: a Turn.

Where several sequences share a context, a generation does not decode by itself: it yields a Turn and
is resumed once whoever runs the sequences (engine/together.py) has decoded every waiting turn in one
batch. A step's work (a draft, a catch-up) is then a generator of turns that returns its result;
`timed` says what such work cost it, and `decoded_alone` runs it with each turn decoded by itself.
"""

from collections.abc import Generator
from contextlib import closing
from dataclasses import dataclass
from time import perf_counter
from typing import TypeVar

import numpy as np

from .backend import Context, Part, decode_together
from .tree import DraftTree

T = TypeVar("T")


@dataclass
class Turn:
    """Not an event: rows of a sequence to decode. Whoever decodes it sets the seconds it took."""

    context: Context
    tokens: list[int]
    logits: str = "all"  # as Context.decode: "all" (a verification, a draft), "last" (a catch-up), "none"
    # a drafter's: decoded before the step's verifications, which wait for the drafts it makes
    drafts: bool = False
    hidden: np.ndarray | None = None  # an MTP context's: the hidden state each token is read with
    embedded: bool = False  # the hidden rows are read in place of the tokens (Context.decode's embedded)
    tree: DraftTree | None = None  # a draft tree verified after the token (the only one then)
    seconds: float = 0.0

    @property
    def rows(self) -> int:
        return len(self.tokens) + (len(self.tree) if self.tree is not None else 0)


def decode(turns: list[Turn]) -> None:
    """Decode turns of one shared context in one batch (they must fit it, and all be embedded or none),
    each learning the seconds."""
    seconds = decode_together([Part(turn.context, turn.tokens, turn.logits, turn.hidden, turn.tree) for turn in turns],
                              embedded=turns[0].embedded)
    for turn in turns:
        turn.seconds = seconds


def timed(work: Generator[Turn, None, T]) -> Generator[Turn, None, tuple[T, float]]:
    """The work's turns, handed on, then its result and the seconds it cost: its own time and its turns'
    decodes, not the time it waited while the other sequences went on."""
    with closing(work):
        seconds, since = 0.0, perf_counter()
        try:
            while True:
                turn = next(work)
                seconds += perf_counter() - since
                yield turn
                since = perf_counter() - turn.seconds
        except StopIteration as done:
            return done.value, seconds + perf_counter() - since


def decoded_alone(work: Generator[Turn, None, T]) -> T:
    """The work's result, each of its turns decoded by itself (nobody else is decoding)."""
    with closing(work):
        try:
            while True:
                decode([next(work)])
        except StopIteration as done:
            return done.value
