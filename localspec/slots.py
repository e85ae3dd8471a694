"""A Session's sequences (llama-server's slots): the one a prompt generates on, held while a generation runs on it,
saved to a file, read back, erased, emptied."""

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from .engine import prompt_cache
from .errors import EngineError, InputError, UsageError
from .scheduler import Scheduler


class Slots:
    """A part of Session, which holds the target's sequences (sequences), its drafters (drafting), the client whose
    prompts each sequence's cache holds (_filled_by) and the generations running, by sequence (_generating,
    changed under _holding)."""

    def sequence_for(self, prompt: list[int], busy, client: str | None = None) -> int:
        """The sequence a prompt should generate on, of those not busy: the one whose cache holds most of
        it (a conversation resent with one more turn); on a tie the first, for which a draft model drafts.
        client: whose prompt it is (serve's API key): a cache another client filled is emptied first and
        shares nothing, and prompts are read back from disk, and kept there, among the client's own alone, so
        that what it reuses (cached_tokens, the prompt's time) tells no client how much of another's prompt
        it guessed."""
        free = [seq for seq in range(len(self.sequences)) if seq not in busy]

        def shared(seq: int) -> int:
            return self.sequences[seq].shares(prompt) if self._filled_by.get(seq, client) == client else 0

        if not free:
            raise UsageError(f"every sequence of this session is generating ({len(self.sequences)}: load(...,"
                             " parallel=N) sets how many): start this one once one ends (Scheduler.full says so)")
        chosen = max(free, key=lambda seq: (shared(seq), -seq))
        if self._filled_by.get(chosen, client) != client:
            self.reset(chosen)
        self._filled_by[chosen] = client
        for context in [self.sequences[chosen], *self.drafting.contexts_of(chosen)]:
            if context.prompt_cache is not None:  # (read back from, and kept in, the client's own)
                context.prompt_cache = context.prompt_cache.of(client)
        # A busy sequence that holds more of the prompt (the same prompt's other choices, n > 1, or another
        # request of the same client's sent at once) lends its cells: the prompt is read once.
        lent, donor = max(((shared(seq), seq) for seq in busy if seq in range(len(self.sequences))), default=(0, None))
        if lent > self.sequences[chosen].shares(prompt):
            self.sequences[chosen].adopt(self.sequences[donor], lent)
        return chosen

    def save(self, sequence: int, path: str | os.PathLike, client: str | None = None) -> tuple[int, int]:
        """llama-server's slot save: what a sequence's cache holds, and its tokens, written to a file of llama.cpp's
        sequence-state format (the file llama-server writes); (tokens, bytes). client: who asks (serve's API key),
        who may save only a cache its own prompts filled."""
        context, path = self._sequence(sequence), _path(path)
        if self._filled_by.get(sequence, client) != client:
            raise UsageError(f"slot {sequence} holds another API key's prompts")
        state = context.state()
        if state is None:
            raise EngineError(f"llama.cpp could not hand out the cache of sequence {sequence}")
        prompt_cache.write(path, context.tokens, state)
        return len(context.tokens), path.stat().st_size

    def restore(self, sequence: int, path: str | os.PathLike, client: str | None = None) -> tuple[int, int]:
        """llama-server's slot restore: a sequence's cache read back from such a file, as client's (serve's API
        key); (tokens, bytes). InputError where the file is none this sequence can hold, the sequence then empty."""
        context, path = self._sequence(sequence), _path(path)
        if not context.can_remember:
            raise UsageError(f"{self.target_model.path.name}'s drafter reads the target's hidden states, which a"
                             " saved cache does not hold")
        found = prompt_cache.read(path)
        if found is None:
            raise InputError(f"{path.name} is not a file of llama.cpp's sequence state")
        tokens, saved = found
        if len(tokens) >= context.n_ctx:
            raise InputError(f"{path.name} holds {len(tokens)} tokens; a slot holds {context.n_ctx}")
        if not all(0 <= token < self.target_model.n_vocab for token in tokens):
            raise InputError(f"{path.name} holds tokens outside {self.target_model.path.name}'s vocabulary")
        self.reset(sequence)
        self._filled_by[sequence] = client
        if not context.set_state(saved, tokens):
            raise InputError(f"llama.cpp could not read {path.name} into this model's cache (another model's, or"
                             " no room left beside the other slots)")
        return len(tokens), path.stat().st_size

    def _sequence(self, sequence: int):
        """A sequence's context by its number (a UsageError naming the ones there are, for a library call's)."""
        if isinstance(sequence, bool) or not isinstance(sequence, int) or not 0 <= sequence < len(self.sequences):
            raise UsageError(f"no sequence {sequence!r}: this session has {len(self.sequences)} (0 to"
                             f" {len(self.sequences) - 1}; --parallel sets how many)")
        return self.sequences[sequence]

    def erase(self, sequence: int) -> int:
        """llama-server's slot erase: a sequence's cache emptied; the tokens it held."""
        held = len(self._sequence(sequence).tokens)
        self.reset(sequence)
        return held

    def reset(self, sequence: int | None = None) -> None:
        """Empty the KV caches, so the next prompt is read anew, or read back from the prompt cache on disk (after a
        failure, a slot erased; bench turns that cache off): all of them, or one sequence's (the drafters' of it
        too)."""
        for view in self.sequences if sequence is None else [self.sequences[sequence]]:
            view.truncate(0)
        self.drafting.reset(sequence)

    def _hold(self, sequence: int, scheduler: Scheduler | None) -> Callable[[], None]:
        """The sequence taken for a generation, and what gives it back; UsageError where a generation runs on it
        already (two streams interleaved on one sequence mixed their answers), one runs in another thread
        (llama.cpp's contexts are not shared across threads: it crashed), or a scheduler's generations and others
        would run between each other's steps (a scheduler's read their rows a step after they are decoded: another
        decode between wrote over them)."""
        thread = threading.current_thread()
        with self._holding:
            # (a thread that has ended generates nothing: a service stopped mid-answer left its generation unclosed)
            for held in [seq for seq, (holder, _) in self._generating.items() if not holder.is_alive()]:
                del self._generating[held]
            holders = self._generating.values()
            if any(holder is not thread for holder, _ in holders):
                raise UsageError("this session is generating in another thread: a session is used by one thread at"
                                 " a time (load() one for each thread, or run several requests at once through"
                                 " Session.scheduler())")
            if any(owner is not scheduler for _, owner in holders):
                raise UsageError("this session's Scheduler is generating: add this request to it (Scheduler.add), or"
                                 " wait until it ends" if scheduler is None else
                                 "another generation of this session is not finished (a stream, or another"
                                 " Scheduler's): finish or close() it before this Scheduler adds requests")
            if sequence in self._generating:
                raise UsageError("this session is generating another answer (a stream not yet finished: finish it"
                                 " or close() it first); load(..., parallel=N) holds N at once, through"
                                 " Session.scheduler()")
            hold = self._generating[sequence] = thread, scheduler

        def release() -> None:  # (only its own hold: one let go for its ended thread may be another's by now)
            if self._generating.get(sequence) is hold:
                del self._generating[sequence]

        return release


class Releasing:
    """A generation's events that give its sequence back once they end, fail or are closed (or dropped unfinished:
    a generator never started runs no `finally`)."""

    def __init__(self, events: Iterator, release: Callable[[], None]):
        self.events, self.release = events, release

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.events)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        release, self.release = self.release, None
        if release is not None:
            try:
                self.events.close()
            finally:
                release()

    __del__ = close


def _path(given) -> Path:
    """A file a library call names, as a path (a text or a path; else a UsageError)."""
    if not isinstance(given, str | os.PathLike):
        raise UsageError(f"a file is named by a path or a text, got {type(given).__name__}")
    return Path(given)
