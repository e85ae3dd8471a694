"""llama.cpp's sampler chain: what a context keeps of an output row (Chain), and the rows a context's
chain turns into choices (ChainRows), so that Python never walks a full vocabulary row: on the backend,
inside the decode graph, only each row's surviving candidates come back (the path for GPUs and Apple
Silicon); on the host the chain runs in C over a candidate array that numpy fills in two vectorised copies.
"""

import ctypes
from dataclasses import dataclass

import numpy as np

from ..errors import EngineError
from .library import llama


@dataclass(frozen=True)
class Chain:
    """What llama.cpp's sampler chain keeps of an output row, in its default order (llama-cli's): the logits
    within top_n_sigma standard deviations of the row's highest (0: all; the others set to -inf, not dropped),
    the top_k highest (0: all), locally typical sampling, top-p and min-p on the raw logits, then temperature
    (dynamic where dynatemp_range is set: from temperature - range to temperature + range, by the row's entropy
    raised to dynatemp_exponent). argmax: only the most likely token."""

    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    temperature: float = 1.0
    argmax: bool = False
    typical_p: float = 1.0
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    top_n_sigma: float = 0.0

    @property
    def host_only(self) -> bool:
        """Whether llama.cpp's samplers of this chain run on the host alone (not in the decode graph)."""
        return self.typical_p < 1 or self.dynatemp_range > 0 or self.top_n_sigma > 0

    def native(self):
        """A new llama_sampler chain; the caller frees it."""
        chain = llama.llama_sampler_chain_init(llama.llama_sampler_chain_default_params())
        if self.argmax:
            llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_greedy())
            return chain
        if self.top_n_sigma > 0:
            llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_top_n_sigma(self.top_n_sigma))
        if self.top_k > 0:
            llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_top_k(self.top_k))
        if self.typical_p < 1:
            llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_typical(self.typical_p, 0))
        if self.top_p < 1:
            llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_top_p(self.top_p, 0))
        if self.min_p > 0:
            llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_min_p(self.min_p, 0))
        if self.dynatemp_range > 0:
            llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_temp_ext(
                self.temperature, self.dynatemp_range, self.dynatemp_exponent))
        else:
            llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_temp(self.temperature))
        return chain


def top_k_superset(row: np.ndarray, k: int) -> np.ndarray | None:
    """Ids of some of a row's entries, among them its k highest and every entry tied with the k-th,
    found without sorting the row. The row is dealt into groups and each group's maximum taken: the
    k-th highest maximum is reached by at least k entries, so nothing below it is among the k highest,
    and only groups whose maximum reaches it are looked into (about k groups). None where the row is
    too short for that to save anything (or k is 0: no top-k)."""
    groups = min(TOP_K_GROUPS, len(row) // 2)
    if k <= 0 or groups < 4 * k:
        return None
    width = len(row) // groups
    grid = row[: groups * width].reshape(width, groups)  # group g holds entries g, g + groups, g + 2 groups, ...
    maxima = grid.max(axis=0)
    threshold = np.partition(maxima, groups - k)[groups - k]
    reaching = np.flatnonzero(maxima >= threshold)
    rows, columns = np.nonzero(grid[:, reaching] >= threshold)
    ids = rows * groups + reaching[columns]
    tail = row[groups * width :]  # the entries left over from dealing, looked into one by one
    return np.concatenate([ids, groups * width + np.flatnonzero(tail >= threshold)]) if tail.size else ids


DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: to llama.cpp's samplers, "seed me at random"; seeds stay below it
TOP_K_GROUPS = 2048  # at 152k, groups of 74: each pass is over 2,048 maxima or a few thousand entries
TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])  # struct llama_token_data


class ChainRows:
    """The output rows of a context's decodes, through its sampler chain: a part of Context, which
    holds llama.cpp's context (_ctx), its model, its sequence (seq), the batch rows its rows start and
    end at (_row_base, _row_last) and its room for draft trees (branch_room sequence ids from
    _first_branch), and calls _start_rows once it has them."""

    def _start_rows(self, backend_sampling: bool | None) -> None:
        self._n_vocab = self.model.n_vocab
        self._row = ctypes.c_float * self.model.n_vocab  # one logit row; a view is made over it in place
        self.backend_sampling = backend_sampling
        self.chain: Chain | None = None
        self.on_backend = False  # where the current chain runs
        self._host = False  # whether it was asked to run on the host
        self._native_chain = None
        # the same chain, one for each draft tree branch's sequence id (Context.branch_room) where the chain
        # runs on the backend: a tree's rows are sampled there too, each by the sampler of its first sequence
        self._branch_chains: list = []
        self._dist = None  # draw()'s sampler, seeded anew for each generation
        self._candidates: np.ndarray | None = None  # the host chain's candidate array, made once
        self._all_ids: np.ndarray | None = None  # what its ids are reset to before each row
        # a backend-sampled row's candidates, copied here (made once)
        self._sampled_logits: np.ndarray | None = None
        self._sampled_ids: np.ndarray | None = None

    def sample_with(self, chain: Chain, host: bool = False) -> None:
        """Use this chain for the rows of the decodes that follow (a new generation: draw() reseeds).
        host: keep full rows on the host (a grammar masks them there), wherever the chain would run."""
        self._free_dist()
        if chain == self.chain and host == self._host:
            return
        self._free_chain()
        native = chain.native()
        on_backend = not host and not chain.host_only and (
            self.backend_sampling or (self.backend_sampling is None and chain.argmax))
        if on_backend and not llama.llama_set_sampler(self._ctx, self.seq, native):
            if self.backend_sampling:  # asked for by name
                llama.llama_sampler_free(native)
                raise EngineError(f"llama.cpp cannot sample on the backend for {self.model.path.name}"
                                  " (a tensor-split model?); try --no-backend-sampling")
            on_backend = False
        self.chain, self._native_chain, self.on_backend, self._host = chain, native, on_backend, host
        for seq in range(self._first_branch, self._first_branch + self.branch_room) if on_backend else ():
            branch = chain.native()
            if not llama.llama_set_sampler(self._ctx, seq, branch):
                llama.llama_sampler_free(branch)
                break  # (a tree then is verified where its rows are read on the host: reads_trees)
            self._branch_chains.append(branch)

    @property
    def reads_trees(self) -> bool:
        """Whether a draft tree's rows can be read: on the host, or sampled by its branches' own samplers."""
        return not self.on_backend or len(self._branch_chains) == self.branch_room > 0

    def token(self, row: int) -> int:
        """The row's most likely token (the chain must be an argmax chain)."""
        if self.on_backend:
            return llama.llama_get_sampled_token_ith(self._ctx, self._row_base + row)
        return int(np.argmax(self.logits(row)))

    def candidates(self, row: int, only: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The ids the chain keeps of a row and their logits (temperature applied), as new arrays.
        only: the ids the chain may keep (those a grammar admits; the chain then runs on the host)."""
        if self.on_backend:
            row += self._row_base
            count = llama.llama_get_sampled_logits_count_ith(self._ctx, row)
            if self._sampled_logits is None:
                self._sampled_logits = np.empty(self._n_vocab, np.float32)
                self._sampled_ids = np.empty(self._n_vocab, np.int32)
            # copied into arrays made once: np.ctypeslib.as_array makes a ctypes type a call (~2 us each)
            logits = self._sampled_logits[:count]
            ctypes.memmove(self._sampled_logits.ctypes.data, llama.llama_get_sampled_logits_ith(self._ctx, row),
                           4 * count)
            if llama.llama_get_sampled_candidates_count_ith(self._ctx, row):
                ids = self._sampled_ids[:count]
                ctypes.memmove(self._sampled_ids.ctypes.data, llama.llama_get_sampled_candidates_ith(self._ctx, row),
                               4 * count)
            else:  # without top-k the chain keeps the whole vocabulary, in vocabulary order
                ids = np.arange(count, dtype=np.int32)
            kept = np.isfinite(logits)  # top-p and min-p mask what they drop with -inf
            return ids[kept], logits[kept]
        rows, array = self._apply_chain(row, only)
        kept = rows[: array.size]
        return kept["id"].copy(), kept["logit"].copy()

    def draw(self, row: int, rng: np.random.Generator, only: np.ndarray | None = None) -> int:
        """A token drawn from what the chain keeps of a row, by llama.cpp's dist sampler on the host (seeded
        from rng at a generation's first draw): where no draft token competes (a plain step, a bonus
        token) nothing needs the distribution itself, and C draws without numpy's per-call costs."""
        if self._dist is None:
            self._dist = llama.llama_sampler_init_dist(int(rng.integers(DEFAULT_SEED)))
        rows, array = self._apply_chain(row, only)
        llama.llama_sampler_apply(self._dist, ctypes.byref(array))
        return int(rows["id"][array.selected])

    def _apply_chain(self, row: int, only: np.ndarray | None = None) -> tuple[np.ndarray, "llama.llama_token_data_array"]:
        """The host chain run over a row (or over the ids `only` of it): the candidate array, whose first
        `size` entries survived."""
        if self._candidates is None:
            self._candidates = np.empty(self._n_vocab, TOKEN_DATA)
            self._all_ids = np.arange(self._n_vocab, dtype=np.int32)
        logits = self.logits(row)
        ids = only
        if ids is None and not self.chain.top_n_sigma > 0:  # (top-n-sigma measures the whole row's spread)
            ids = top_k_superset(logits, self.chain.top_k)
        if ids is None:
            rows = self._candidates
            rows["id"] = self._all_ids  # the chain reorders the array in place
            rows["logit"] = logits
        else:  # the chain's top-k keeps the same tokens of these as of the whole row
            rows = self._candidates[: len(ids)]
            rows["id"] = ids
            rows["logit"] = logits[ids]
        array = llama.llama_token_data_array(rows.ctypes.data_as(llama.llama_token_data_p), len(rows), -1, False)
        llama.llama_sampler_apply(self._native_chain, ctypes.byref(array))
        return rows, array

    def logits(self, row: int) -> np.ndarray:
        """Logits of a row of the last decoded batch (-1: its last row) as a view, not a copy."""
        if self.on_backend:
            raise EngineError("full logit rows are not kept while sampling on the backend")
        pointer = llama.llama_get_logits_ith(self._ctx, self._batch_row(row))
        if not pointer:
            raise EngineError(f"no logits for row {row} of the last batch")
        # np.ctypeslib.as_array builds a new ctypes array type on every call (~50 us a row); a view
        # over the fixed row type at the row's address costs a few microseconds.
        return np.frombuffer(self._row.from_address(ctypes.addressof(pointer.contents)), dtype=np.float32)

    def _batch_row(self, row: int) -> int:
        """The batch index of a row of this sequence's in the last batch (negative: from its last)."""
        return self._row_last + 1 + row if row < 0 else self._row_base + row

    def _free_dist(self) -> None:
        if self._dist is not None:
            llama.llama_sampler_free(self._dist)
            self._dist = None

    def _free_chain(self) -> None:
        for seq, branch in enumerate(self._branch_chains, start=self._first_branch):
            llama.llama_set_sampler(self._ctx, seq, None)
            llama.llama_sampler_free(branch)
        self._branch_chains = []
        if self._native_chain is not None:
            if self.on_backend:
                llama.llama_set_sampler(self._ctx, self.seq, None)
            llama.llama_sampler_free(self._native_chain)
            self.chain = self._native_chain = None
            self.on_backend = False
