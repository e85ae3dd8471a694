"""The hidden states a sequence keeps for the drafters that read them (an MTP block, EAGLE-3 and DFlash
drafters): the inputs of some of the target's layers after each position it decoded, side by side. One
store a sequence, filled the same way whether the sequence decoded alone or beside others."""

import numpy as np

from ..errors import EngineError
from .library import layer_inputs, llama, nextn
from .model import Model

LAST_HIDDEN = -1  # a layer to keep: the last hidden state, not a layer's input


class HiddenStates:
    """layers: the layers whose inputs are kept (LAST_HIDDEN: the last hidden state), in this order."""

    def __init__(self, model: Model, layers: tuple[int, ...]):
        self.model, self.layers = model, layers
        self._rows: dict[int, np.ndarray] = {}  # position -> its row

    def switch(self, ctx, keep: bool) -> None:
        """Have llama.cpp hand out (or stop handing out) the layers' inputs of a context's decodes."""
        for layer in self.layers:
            if layer != LAST_HIDDEN:
                layer_inputs().set_layer_input(ctx, layer, keep)
            else:  # all rows, not only those with logits
                nextn().llama_set_embeddings_nextn(ctx, keep, False)

    def read(self, ctx, rows: int) -> np.ndarray:
        """The kept layers' inputs for each row of a context's last decode, side by side (a copy)."""
        parts = [np.ctypeslib.as_array(layer_inputs().layer_input(ctx, layer), shape=(rows, self.model.layer_width))
                 if layer != LAST_HIDDEN else
                 np.ctypeslib.as_array(nextn().llama_get_embeddings_nextn(ctx), shape=(rows, self.model.n_embd))
                 for layer in self.layers]
        return np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0].copy()

    def keep(self, start: int, rows: np.ndarray) -> None:
        """Keep these rows as the positions from start on."""
        self._rows.update(zip(range(start, start + len(rows)), rows))

    @property
    def width(self) -> int:
        """The width of a row."""
        return sum(self.model.layer_width if layer != LAST_HIDDEN else self.model.n_embd for layer in self.layers)

    def row(self, position: int) -> np.ndarray | None:
        """The kept row after the token at this position, if still kept."""
        return self._rows.get(position)

    def release(self, before: int) -> None:
        """Stop keeping the rows of positions before this one."""
        for position in [p for p in self._rows if p < before]:
            del self._rows[position]

    def forget(self, positions: range) -> None:
        """The cache no longer holds these positions."""
        for position in positions:
            self._rows.pop(position, None)


class HiddenDecoding:
    """A part of Context: decoding beside hidden states, as the drafters that read the target's do (an MTP block, an
    EAGLE-3 drafter, Gemma 4's assistant) and reading back their own; and letting go of those the target keeps."""

    def stop_keeping_hidden(self) -> None:
        """No MTP block or EAGLE-3 drafter will draft after all: keep no hidden states, in any sequence."""
        self.hidden.switch(self._ctx, False)
        for sequence in [self, *self._views]:
            sequence.hidden = HiddenStates(self.model, ())

    def decode_at(self, position: int, token: int, hidden: np.ndarray) -> None:
        """Decode one token, with the hidden state that goes with it, at a position of the cache this
        context reads and keep nothing: Gemma 4's assistant has no cache of its own but its target's
        (beside), which it reads up to the position (the target's next) and never changes."""
        batch = self._batch
        batch.token[0], batch.pos[0], batch.logits[0], batch.n_tokens = token, position, True, 1
        batch.n_seq_id[0], batch.seq_id[0][0] = 1, self.seq
        status = self._run(llama.llama_decode, hidden[None, :])
        if status != 0:
            raise EngineError(f"llama_decode failed with status {status} at position {position}")

    def encode(self, rows: np.ndarray) -> np.ndarray:
        """An encoder graph's output for each row of input (an EAGLE-3 drafter's fusion of the target's
        hidden states into its own width); the KV cache is left as it is."""
        out = []
        batch = self._batch
        for offset in range(0, len(rows), self.n_batch):  # (an encoder reads a batch in one ubatch)
            chunk = rows[offset : offset + self.n_batch]
            for i in range(len(chunk)):  # positions are not read, but must follow the cache's as a decode's would
                batch.pos[i], batch.logits[i] = len(self.tokens) + i, True
                batch.n_seq_id[i], batch.seq_id[i][0] = 1, self.seq
            batch.n_tokens = len(chunk)
            status = self._run(llama.llama_encode, chunk, tokens=False)
            if status != 0:
                raise EngineError(f"llama_encode failed with status {status}")
            out.append(np.ctypeslib.as_array(nextn().llama_get_embeddings_nextn(self._ctx),
                                             shape=(len(chunk), self.model.n_embd)).copy())
        return np.concatenate(out) if out else np.zeros((0, self.model.n_embd), np.float32)

    def output_hidden(self, row: int) -> np.ndarray:
        """An MTP or EAGLE-3 context's own hidden state at an output row of its last decode (-1: its last):
        what its next token reads."""
        pointer = nextn().llama_get_embeddings_nextn_ith(self._ctx, self._batch_row(row))
        return np.ctypeslib.as_array(pointer, shape=(self.model.n_embd,)).copy()
