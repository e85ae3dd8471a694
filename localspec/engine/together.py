"""Several generations on the sequences of one context, one llama_decode a step (continuous batching).

Each generation is the engine's event iterator (speculative.generate) on a sequence of its own
(Context.sequence). Where it needs rows decoded (a piece of its prompt, a draft model's token, a
verification) it yields a Turn (engine/turns.py) instead of decoding. step() advances every generation
to its next turn, handing out the events on the way; decodes the drafters' turns together (one batch
per shared context: a draft model's sequences draft side by side), advancing those generations again,
until every generation waits on its target; then decodes all those turns in one batch (more only where
they outgrow the context's batch) and leaves the generations to read their rows when next advanced.
A generation may join (add) or leave (drop) between any two steps.
"""

from collections.abc import Hashable, Iterator
from contextlib import closing

from ..errors import EngineError
from .turns import Turn, decode

ENDED = "ended"  # what step() hands out for a generation that has ended: nothing more will come


class Together:
    def __init__(self):
        self._running: dict[Hashable, Iterator] = {}

    def __len__(self) -> int:
        return len(self._running)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._running

    def add(self, key: Hashable, events: Iterator) -> None:
        """Run this generation from the next step on."""
        self._running[key] = events

    def drop(self, key: Hashable) -> None:
        """Stop a generation (its client left): its iterator is closed, and its sequence left to whoever
        takes it next (a prefill keeps what it can of the cache and drops the rest)."""
        events = self._running.pop(key, None)
        if events is not None:
            events.close()

    def step(self) -> Iterator[tuple[Hashable, object]]:
        """(key, item) for each event of each generation up to its next turn, for each generation that
        ended (ENDED) or failed (the exception, after which it is gone); then the turns are decoded,
        drafters' first. A generation dropped while its events are handed out hands out no more."""
        waiting: list[tuple[Hashable, Turn]] = []
        for key in list(self._running):
            yield from self._advance(key, waiting)
        while drafting := [(key, turn) for key, turn in waiting if turn.drafts]:
            waiting = [(key, turn) for key, turn in waiting if not turn.drafts]
            yield from self._decode(drafting)
            for key, _ in drafting:
                if key in self._running:
                    yield from self._advance(key, waiting)
        yield from self._decode(waiting)

    def _advance(self, key: Hashable, waiting: list[tuple[Hashable, Turn]]) -> Iterator[tuple[Hashable, object]]:
        """Hand out a generation's events up to its next turn, which joins those waiting."""
        events = self._running[key]
        try:
            for item in events:
                if isinstance(item, Turn):
                    waiting.append((key, item))
                    return
                yield key, item
                if key not in self._running:
                    return
            if self._running.pop(key, None) is not None:
                yield key, ENDED
        except Exception as error:  # this generation's alone: the others go on
            self._running.pop(key, None)
            yield key, error

    def _decode(self, turns: list[tuple[Hashable, Turn]]) -> Iterator[tuple[Hashable, object]]:
        """Decode the turns of the generations still running (one dropped meanwhile wants nothing)."""
        for group in _batches([(key, turn) for key, turn in turns if key in self._running]):
            try:
                decode([turn for _, turn in group])
            except EngineError as error:  # every sequence in it is as before the decode: each fails alone
                for key, _ in group:
                    self.drop(key)
                    yield key, error


def alone(events: Iterator) -> Iterator:
    """The events of a generation on one of several sequences, with its turns decoded by themselves (a
    caller that runs one generation at a time: run, chat, bench, the library's front door)."""
    with closing(events):
        for item in events:
            if isinstance(item, Turn):
                decode([item])
            else:
                yield item


def _batches(turns: list[tuple[Hashable, Turn]]) -> Iterator[list[tuple[Hashable, Turn]]]:
    """The turns in groups of one shared context whose rows fit one batch of it (a bigger one aborts
    llama.cpp)."""
    by_context: dict[tuple[int, bool, bool], list[tuple[Hashable, Turn]]] = {}
    for key, turn in turns:
        # An MTP block's context hands back its hidden states right only where every row of a batch is
        # an output row: its catch-ups (no output) go in batches of their own. A batch reads tokens or
        # embeddings (a DFlash drafter's catch-up), not both.
        unread = turn.context.reads_hidden and turn.logits == "none"
        by_context.setdefault((id(turn.context.root), unread, turn.embedded), []).append((key, turn))
    for same in by_context.values():
        group, rows = [], 0
        for key, turn in same:
            if group and rows + turn.rows > turn.context.n_batch:
                yield group
                group, rows = [], 0
            group.append((key, turn))
            rows += turn.rows
        if group:
            yield group
