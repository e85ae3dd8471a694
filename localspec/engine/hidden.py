"""The hidden states a sequence keeps for the drafters that read them (an MTP block, EAGLE-3 and DFlash
drafters): the inputs of some of the target's layers after each position it decoded, side by side. One
store a sequence, filled the same way whether the sequence decoded alone or beside others."""

import numpy as np

from .library import layer_inputs, nextn
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
