"""Taking a context's cache back (truncate), and what makes that safe: a recurrent state's snapshots and
checkpoints, and the cache's record mended after a change that Ctrl-C cut short (_settle); and a sequence's
cache handed out and taken back whole (state, set_state)."""

import ctypes

from ..errors import EngineError
from .library import llama

PARTIAL_STATE = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: a sequence's recurrent state, not its KV cache


class Rollback:
    """A part of Context, which holds llama.cpp's context (_ctx), its memory (_memory), its sequence (seq),
    the tokens it holds, the hidden states kept for them, whether it is recurrent, and how far back the last
    decode's snapshots reach (rollback, _last_decoded, _rolled_back), a checkpoint (_checkpoint) and a change
    under way (_changing)."""

    def truncate(self, n_keep: int) -> None:
        """Forget every position from n_keep on."""
        if not self._forget_from(n_keep):
            raise EngineError(f"llama.cpp could not roll the KV cache back to {n_keep} tokens"
                              + (" (a recurrent state takes back only the end of its last decode)"
                                 if self.recurrent else ""))

    def _forget_from(self, n_keep: int) -> bool:
        """Drop positions n_keep.. if llama.cpp can; False, with nothing changed, where it cannot.

        A recurrent state holds no positions. llama.cpp takes tokens back out of it from snapshots of
        the last decode only, once, and answers true even where those snapshots do not reach (leaving a
        wrong state), so what they reach is checked here; further back, a checkpoint() is restored and
        the tokens after it decoded again."""
        self._settle()
        drop = len(self.tokens) - n_keep
        if drop <= 0:
            return True
        if self.recurrent and n_keep > 0:
            if drop <= self.rollback and drop < self._last_decoded and not self._rolled_back:
                self._rolled_back = True
            elif self._checkpoint is not None and self._checkpoint[0] <= n_keep:
                return self._restore(n_keep)
            else:
                return False
        self._changing = (n_keep, ())
        if not llama.llama_memory_seq_rm(self._memory, self.seq, n_keep, -1):
            self._changing = None
            return False
        self._forget_recorded(n_keep)
        self._changing = None
        return True

    def _forget_recorded(self, n_keep: int) -> None:
        self.hidden.forget(range(n_keep, len(self.tokens)))  # only what is dropped: this runs every step
        del self.tokens[n_keep:]
        if self._checkpoint is not None and self._checkpoint[0] > n_keep:
            self._checkpoint = None  # it was saved after tokens that are gone now

    def _settle(self) -> None:
        """After a change of the cache that was interrupted (Ctrl-C) before `tokens` was told: make
        `tokens` say what llama.cpp holds. A decode's tokens that reached the cache are kept (their
        hidden states, if kept, are lost: an MTP draft reads zeros there); a recurrent state, whose
        snapshots may no longer match, is emptied, and the next prefill reads everything again."""
        if self._changing is None:
            return
        start, chunk = self._changing
        self._changing = None
        held = llama.llama_memory_seq_pos_max(self._memory, self.seq) + 1
        if chunk is None:  # cells moved about (_reuse_chunks): what stands where is not known
            llama.llama_memory_seq_rm(self._memory, self.seq, 0, -1)
            self._forget_recorded(0)
        elif self.recurrent:
            llama.llama_memory_seq_rm(self._memory, self.seq, 0, -1)
            self._checkpoint = None
            self._forget_recorded(0)
        elif held < len(self.tokens):
            self._forget_recorded(held)
        elif held > len(self.tokens):
            reached = chunk[len(self.tokens) - start : held - start] if start <= len(self.tokens) else ()
            self.tokens.extend(reached)
            if held > len(self.tokens) and not llama.llama_memory_seq_rm(self._memory, self.seq, len(self.tokens), -1):
                raise EngineError(f"llama.cpp could not roll the KV cache back to {len(self.tokens)} tokens")

    def _reuse_chunks(self, tokens, keep: int, most: int) -> int:
        """llama-server's --cache-reuse: past the `keep` tokens the cache begins `tokens` with, each run of at least
        cache_reuse tokens it holds further on (the text below an edit, the turns after one dropped) shifted into
        place rather than read again, at most `most` in all; returns how many of `tokens` it then holds. Not for a
        recurrent state or hidden states kept by position, nor for cells another sequence shares (a shift moves
        them for both)."""
        if (not self.cache_reuse or keep >= min(most, len(self.tokens)) or self.recurrent or self.hidden.layers
                or self.reads_hidden or not llama.llama_memory_can_shift(self._memory)):
            return keep
        held, placed = self.tokens, list(self.tokens[:keep])
        at = max(keep, self._shared)  # (the held token the next run may start at)
        moves = []
        while at < len(held) and len(placed) < most:
            run = 0
            while at + run < len(held) and len(placed) + run < most and held[at + run] == tokens[len(placed) + run]:
                run += 1
            if run >= self.cache_reuse:
                moves.append((len(placed), at, run))
                placed += held[at : at + run]
                at += run
            else:
                at += 1
        if not moves:
            return keep
        self._changing = (0, None)
        for to, start, run in moves:
            llama.llama_memory_seq_rm(self._memory, self.seq, to, start)
            llama.llama_memory_seq_add(self._memory, self.seq, start, start + run, to - start)
        llama.llama_memory_seq_rm(self._memory, self.seq, len(placed), -1)
        self.tokens = placed
        self._changing = None
        return len(placed)

    def checkpoint(self) -> None:
        """Save a recurrent state as it is now, so the cache can later come back to any position from
        here on, however many decodes later (a draft model drafts one token a decode)."""
        size = llama.llama_state_seq_get_size_ext(self._ctx, self.seq, PARTIAL_STATE)
        saved = (ctypes.c_uint8 * size)()
        if llama.llama_state_seq_get_data_ext(self._ctx, saved, size, self.seq, PARTIAL_STATE) != size:
            raise EngineError(f"llama.cpp could not save the recurrent state of {self.model.path.name}")
        self._checkpoint = (len(self.tokens), saved)

    def _restore(self, n_keep: int) -> bool:
        position, saved = self._checkpoint
        again = self.tokens[position:n_keep]
        self._changing = (position, ())
        if not llama.llama_state_seq_set_data_ext(self._ctx, saved, len(saved), self.seq, PARTIAL_STATE):
            self._changing = None
            return False
        # the recurrent state is back at `position`; the attention layers' KV cache drops what follows
        if not llama.llama_memory_seq_rm(self._memory, self.seq, position, -1):
            raise EngineError(f"llama.cpp could not roll the KV cache back to {position} tokens")
        del self.tokens[position:]
        self._changing = None
        if again:
            self.decode(again, logits="none")
        return True

    def state(self) -> ctypes.Array | None:
        """The sequence's cache as llama.cpp hands it out (llama_state_seq_get_data), or None where it would not."""
        self._settle()
        size = llama.llama_state_seq_get_size(self._ctx, self.seq)
        saved = (ctypes.c_uint8 * size)()
        return saved if llama.llama_state_seq_get_data(self._ctx, saved, size, self.seq) == size else None

    def set_state(self, saved: bytearray, tokens: list[int]) -> bool:
        """Hold `tokens`, whose cache `saved` is as state() hands it out, in place of what the sequence held; False
        where llama.cpp would not read it into this context (another model's, another layout, cut short), the
        sequence then empty. (Not llama_state_seq_load_file: a file cut short aborts the process there.)"""
        self._settle()
        self.truncate(0)
        self._changing = (0, ())
        read = llama.llama_state_seq_set_data(self._ctx, (ctypes.c_uint8 * len(saved)).from_buffer(saved),
                                              len(saved), self.seq)
        self._changing = None
        if not read or llama.llama_memory_seq_pos_max(self._memory, self.seq) != len(tokens) - 1:
            llama.llama_memory_seq_rm(self._memory, self.seq, -1, -1)  # (whatever part of it was read)
            return False
        self.tokens = list(tokens)
        self._last_decoded, self._rolled_back = 0, False
        return True
