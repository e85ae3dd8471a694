"""Embeddings: a context that reads each input whole and pools it into one vector."""

from collections.abc import Sequence

import numpy as np

from ..config import POOLINGS
from ..errors import EngineError, InputError
from .library import llama
from .model import Model


def normalized(vector: np.ndarray, norm: int = 2) -> np.ndarray:
    """A vector scaled as llama.cpp's common_embd_normalize scales one (llama-server's embd_normalize): -1 not at all,
    0 so that its largest magnitude is 32760 (int16's range), 2 to unit length (the default), p to unit p-norm."""
    if norm == -1:
        total = 1.0
    elif norm == 0:
        total = np.abs(vector).max(initial=0.0) / 32760.0
    else:  # (over the largest magnitude first: a p of 1000 overflowed to inf, and every vector read as zeros)
        largest = np.abs(vector).max(initial=0.0)
        total = largest * np.sum((np.abs(vector) / largest) ** norm) ** (1.0 / norm) if largest > 0 else 0.0
    return vector / total if total > 0 else np.zeros_like(vector)


class Embedder:
    """A context of a model that reads each input whole and hands back one vector for it (embeddings),
    pooled as the model's metadata says; a model that names no pooling (a generative one) is pooled by
    the mean over its tokens (normalized() then scales it). A reranker (rank pooling) hands back its classifier's
    outputs instead, as llama.cpp computes them: the first is the score."""

    def __init__(self, model: Model, n_ctx: int, threads: int, pooling: str | None = None):
        """pooling: one of POOLINGS over the model's own (None: its own)."""
        self.model = model
        params = llama.llama_context_default_params()
        params.embeddings = True
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = n_ctx  # an input is read in one piece: pooling sees all of it
        params.n_threads = params.n_threads_batch = threads
        params.pooling_type = llama.LLAMA_POOLING_TYPE_UNSPECIFIED if pooling is None else POOLINGS[pooling]
        self._ctx = llama.llama_init_from_model(model.handle, params)
        if self._ctx and llama.llama_pooling_type(self._ctx) == llama.LLAMA_POOLING_TYPE_NONE:
            llama.llama_free(self._ctx)
            params.pooling_type = llama.LLAMA_POOLING_TYPE_MEAN
            self._ctx = llama.llama_init_from_model(model.handle, params)
        if not self._ctx:
            raise EngineError(f"llama.cpp could not create an embedding context of {n_ctx} tokens for"
                              f" {model.path.name} (out of memory? try a smaller --ctx-size)")
        self.ranks = llama.llama_pooling_type(self._ctx) == POOLINGS["rank"]
        # what llama.cpp hands out a sequence: read exactly that many floats, never n_embd by assumption (a
        # reranker's n_cls_out scores read as n_embd floats were ~2,300 bytes of the process heap)
        self.width = (llama.llama_model_n_cls_out(model.handle) if self.ranks
                      else llama.llama_model_n_embd_out(model.handle))
        self.n_ctx = llama.llama_n_ctx(self._ctx)
        self._batch = llama.llama_batch_init(self.n_ctx, 0, 1)

    @property
    def handle(self):
        """llama.cpp's context (for LoRA adapters and control vectors)."""
        return self._ctx

    def embed(self, tokens: Sequence[int]) -> np.ndarray:
        if not tokens:
            raise InputError("an input to embed is empty")
        if len(tokens) > self.n_ctx:
            raise InputError(f"an input to embed is {len(tokens)} tokens but the context holds {self.n_ctx};"
                             " raise --ctx-size or shorten it")
        llama.llama_memory_clear(llama.llama_get_memory(self._ctx), True)
        batch = self._batch
        for i, token in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, i, 1, True
            batch.seq_id[i][0] = 0
        batch.n_tokens = len(tokens)
        status = llama.llama_decode(self._ctx, batch)
        if status != 0:
            raise EngineError(f"llama_decode failed with status {status} while embedding")
        pointer = llama.llama_get_embeddings_seq(self._ctx, 0)
        if not pointer:
            raise EngineError(f"{self.model.path.name} gives no pooled embedding")
        return np.ctypeslib.as_array(pointer, shape=(self.width,)).astype(np.float64)

    def close(self) -> None:
        if self._ctx:
            llama.llama_batch_free(self._batch)
            llama.llama_free(self._ctx)
            self._ctx = None
