"""llama.cpp's own samplers run over a row through its C API: the references the engine's host-side
adjustments (engine/adjustments.py) are held to."""

import ctypes

import llama_cpp
import numpy as np

from localspec.config import Sampling


def dry_row(model, sampling: Sampling, before: list[int], row: np.ndarray) -> np.ndarray:
    """The row after llama.cpp's DRY sampler, made with the sampling's settings in model's vocabulary, has
    accepted the tokens before it (as llama-server's sampler accepts the prompt's and the generated tokens).
    This llama.cpp's sampler reads a window of dry_penalty_last_n > 0 tokens; llama-server turns -1 into the
    context's length first, as this does into the tokens'."""
    breakers = [breaker.encode() for breaker in sampling.dry_sequence_breakers]
    texts = (ctypes.c_char_p * max(1, len(breakers)))(*breakers)
    last_n = sampling.dry_penalty_last_n if sampling.dry_penalty_last_n >= 0 else max(1, len(before))
    sampler = llama_cpp.llama_sampler_init_dry(model.vocab, sampling.dry_multiplier, sampling.dry_base,
                                               sampling.dry_allowed_length, last_n, texts, len(breakers))
    try:
        for token in before:
            llama_cpp.llama_sampler_accept(sampler, token)
        data = (llama_cpp.llama_token_data * len(row))()
        for token, logit in enumerate(row.tolist()):
            data[token].id, data[token].logit = token, logit
        candidates = llama_cpp.llama_token_data_array(data=data, size=len(row), selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(candidates))
        out = np.empty(len(row), dtype=np.float32)
        for i in range(candidates.size):
            out[data[i].id] = data[i].logit
        return out
    finally:
        llama_cpp.llama_sampler_free(sampler)


def chain_survivors(sampling: Sampling, row: np.ndarray, xtc_probability: float = 1.0) -> dict[int, float]:
    """The candidates llama.cpp's chain of top-n-sigma, top-k, typical, top-p, min-p, XTC and temperature (dynamic where asked;
    common/sampling.cpp's order) keeps of a row, with their probabilities (the chain leaves p stale: the survivors'
    logits are softmaxed here). At an xtc_probability of 1, XTC's coin always falls: the removal itself is
    compared; at 0 it never does."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    if sampling.top_n_sigma > 0:
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_n_sigma(sampling.top_n_sigma))
    temperature = (llama_cpp.llama_sampler_init_temp_ext(sampling.temperature, sampling.dynatemp_range,
                                                         sampling.dynatemp_exponent)
                   if sampling.dynatemp_range > 0 else llama_cpp.llama_sampler_init_temp(sampling.temperature))
    for sampler in (llama_cpp.llama_sampler_init_top_k(sampling.top_k),
                    llama_cpp.llama_sampler_init_typical(sampling.typical_p, 0),
                    llama_cpp.llama_sampler_init_top_p(sampling.top_p, 1),
                    llama_cpp.llama_sampler_init_min_p(sampling.min_p, 1),
                    llama_cpp.llama_sampler_init_xtc(xtc_probability, sampling.xtc_threshold, 0, 0),
                    temperature):
        llama_cpp.llama_sampler_chain_add(chain, sampler)
    try:
        data = (llama_cpp.llama_token_data * len(row))()
        for token, logit in enumerate(row.tolist()):
            data[token].id, data[token].logit = token, logit
        candidates = llama_cpp.llama_token_data_array(data=data, size=len(row), selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(chain, ctypes.byref(candidates))
        survivors = [(candidates.data[i].id, candidates.data[i].logit) for i in range(candidates.size)]
    finally:
        llama_cpp.llama_sampler_free(chain)
    logits = np.array([logit for _, logit in survivors], dtype=np.float64)
    weights = np.exp(logits - logits.max())
    return dict(zip((token for token, _ in survivors), (weights / weights.sum()).tolist()))


def mirostat_walk(sampling: Sampling, n_vocab: int, rows: list[np.ndarray], seed: int
                  ) -> list[tuple[dict[int, float], int]]:
    """llama.cpp's own mirostat (1 or 2, as the sampling says) run over rows one after another, as over a
    generation's: each row's candidates it keeps with their probabilities, and the token it chose (which moves
    its mu for the next row)."""
    if sampling.mirostat == 1:
        sampler = llama_cpp.llama_sampler_init_mirostat(n_vocab, seed, sampling.mirostat_tau, sampling.mirostat_eta,
                                                        100)
    else:
        sampler = llama_cpp.llama_sampler_init_mirostat_v2(seed, sampling.mirostat_tau, sampling.mirostat_eta)
    walked = []
    try:
        for row in rows:
            data = (llama_cpp.llama_token_data * len(row))()
            for token, logit in enumerate(row.tolist()):
                data[token].id, data[token].logit = token, logit
            candidates = llama_cpp.llama_token_data_array(data=data, size=len(row), selected=-1, sorted=False)
            llama_cpp.llama_sampler_apply(sampler, ctypes.byref(candidates))
            kept = {data[i].id: data[i].p for i in range(candidates.size)}
            walked.append((kept, data[candidates.selected].id))
    finally:
        llama_cpp.llama_sampler_free(sampler)
    return walked
