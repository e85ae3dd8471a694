"""llama.cpp's sampler chain, as a value: what a context keeps of an output row."""

from dataclasses import dataclass

import numpy as np

from .library import llama


@dataclass(frozen=True)
class Chain:
    """What llama.cpp's sampler chain keeps of an output row, in its default order (llama-cli's):
    the top_k highest logits (0: all), top-p and min-p on the raw logits, then temperature.
    argmax: only the most likely token."""

    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    temperature: float = 1.0
    argmax: bool = False

    def native(self):
        """A new llama_sampler chain; the caller frees it."""
        chain = llama.llama_sampler_chain_init(llama.llama_sampler_chain_default_params())
        if self.argmax:
            llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_greedy())
            return chain
        if self.top_k > 0:
            llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_top_k(self.top_k))
        if self.top_p < 1:
            llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_top_p(self.top_p, 0))
        if self.min_p > 0:
            llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_min_p(self.min_p, 0))
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
