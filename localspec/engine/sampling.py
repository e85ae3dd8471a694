"""Turning logits into token choices, and the rejection rule that keeps speculation lossless.

A distribution is kept sparse (the candidates that survive top-k/top-p/min-p with
their probabilities), so work does not grow with the vocabulary. llama.cpp's own
sampler chain picks the candidates (chain.Chain; on the backend or in C on the
host); Python sees only the survivors. Target and draft go through the same chain,
and the draft token is drawn from exactly the q we compute, which is what makes
min(1, p/q) acceptance reproduce the target's distribution.
"""

import math
from dataclasses import dataclass

import numpy as np

from ..config import Sampling
from ..events import Candidate, Logprobs
from .chain import Chain


LIST_SEARCH = 64  # candidates up to which Dist.at searches a list (40: 1.1 us against numpy's 2.8)


@dataclass(frozen=True)
class Dist:
    ids: np.ndarray  # candidate token ids
    probs: np.ndarray  # their probabilities, summing to 1

    def prob(self, token: int) -> float:
        at = self.at(token)
        return float(self.probs[at]) if at is not None else 0.0

    def at(self, token: int) -> int | None:
        """Where the token is among the candidates. The rejection rule asks a few times a row, mostly of a
        top-k's few dozen candidates, where a list's search costs a third of numpy's (past ~100, more)."""
        if len(self.ids) > LIST_SEARCH:
            hit = np.flatnonzero(self.ids == token)
            return int(hit[0]) if hit.size else None
        try:
            return self.ids.tolist().index(token)
        except ValueError:
            return None

    def probs_of(self, tokens: np.ndarray) -> np.ndarray:
        order = np.argsort(self.ids)
        sorted_ids = self.ids[order]
        at = np.minimum(np.searchsorted(sorted_ids, tokens), len(sorted_ids) - 1)
        return np.where(sorted_ids[at] == tokens, self.probs[order][at], 0.0)

    def sample(self, rng: np.random.Generator) -> int:
        cumulative = np.cumsum(self.probs)
        at = np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right")
        return int(self.ids[min(at, len(self.ids) - 1)])


def one_hot(token: int) -> Dist:
    return Dist(np.array([token]), np.array([1.0]))


def chain_for(s: Sampling) -> Chain:
    """The chain whose survivors the target samples from (greedy: its argmax; mirostat: every token, at the
    temperature)."""
    if s.greedy:
        return Chain(argmax=True)
    if s.mirostat:
        return Chain(temperature=s.temperature)
    return Chain(s.top_k, s.top_p, s.min_p, s.temperature, typical_p=s.typical_p, dynatemp_range=s.dynatemp_range,
                 dynatemp_exponent=s.dynatemp_exponent, top_n_sigma=max(s.top_n_sigma, 0.0))


def softmax(ids: np.ndarray, logits: np.ndarray) -> Dist:
    """The distribution over candidates with these (temperature-scaled) logits."""
    weights = np.exp(logits.astype(np.float64) - logits.max())
    return Dist(ids, weights / weights.sum())


def transform(logits: np.ndarray, s: Sampling) -> Dist:
    """What llama.cpp's chain keeps of a full row, in numpy: top-k, top-p, min-p on the raw logits,
    then temperature. The reference the tests hold the native chains to."""
    if 0 < s.top_k < logits.shape[0]:
        ids = np.argpartition(logits, -s.top_k)[-s.top_k :]
    else:
        ids = np.arange(logits.shape[0])
    kept = logits[ids].astype(np.float64)
    peak = kept.max()
    # top-p measures mass against every top-k survivor, so take the normaliser before min-p prunes.
    normaliser = np.exp(kept - peak).sum()
    if s.min_p > 0:
        survives = kept >= peak + np.log(s.min_p)
        ids, kept = ids[survives], kept[survives]
    order = np.argsort(-kept, kind="stable")
    ids, kept = ids[order], kept[order]
    if s.top_p < 1:
        mass = np.cumsum(np.exp(kept - peak)) / normaliser
        smallest_enough = np.searchsorted(mass, s.top_p) + 1
        ids, kept = ids[:smallest_enough], kept[:smallest_enough]
    weights = np.exp((kept - peak) / s.temperature)
    return Dist(ids, weights / weights.sum())


def excluded(p: Dist, s: Sampling, rng: np.random.Generator) -> Dist:
    """p after llama.cpp's XTC, which comes after min-p and before temperature: with probability
    s.xtc_probability, the candidates at least s.xtc_threshold likely at temperature 1 are left out but the least
    likely of them, where two or more are. Each row that sets a token draws its own chance, as llama.cpp's sampler
    draws one a token, so a token chosen by the rejection rule from this p follows XTC's distribution."""
    if not s.xtc or len(p.ids) < 2 or rng.random() >= s.xtc_probability:
        return p
    at_one = p.probs ** s.temperature  # (p's candidates at temperature 1, unnormalised: temperature only rescales)
    at_one /= at_one.sum()
    likely = np.flatnonzero(at_one >= s.xtc_threshold)
    if len(likely) < 2:
        return p
    kept = np.ones(len(p.ids), dtype=bool)
    kept[likely[np.argsort(at_one[likely], kind="stable")[1:]]] = False  # all but the least likely of them
    return Dist(p.ids[kept], p.probs[kept] / p.probs[kept].sum())


MIROSTAT_M = 100  # how many of the likeliest tokens mirostat 1 estimates the Zipf exponent from (llama.cpp's)


def mirostat_kept(p: Dist, version: int, mu: float, n_vocab: int) -> Dist:
    """What llama.cpp's mirostat keeps of p (every token at the temperature) at the threshold mu, renormalised.
    Mirostat 2: the tokens whose surprise (-log2 p) is at most mu, or the likeliest alone. Mirostat 1: the k
    likeliest, k from mu and the Zipf exponent s that the MIROSTAT_M likeliest tokens' probabilities estimate;
    where k is no number or beyond a C int, one token, as llama.cpp's conversion comes out on x86."""
    if version == 2:
        kept = np.flatnonzero(p.probs >= 2.0 ** -mu)  # (-log2 p <= mu, without a logarithm a token)
        if not kept.size:
            kept = np.array([np.argmax(p.probs)])
    else:
        m = min(MIROSTAT_M, len(p.probs))
        likeliest = np.argpartition(p.probs, len(p.probs) - m)[-m:]
        likeliest = likeliest[np.argsort(-p.probs[likeliest], kind="stable")]
        top = p.probs[likeliest].astype(np.float32)
        with np.errstate(all="ignore"):  # in float32, as llama.cpp (2 ** mu is inf past mu 128); 0 / 0 is nan
            t = np.log(np.arange(2, m + 1, dtype=np.float32) / np.arange(1, m, dtype=np.float32))
            s = np.sum(t * np.log(top[:-1] / top[1:])) / np.sum(t * t)
            epsilon = s - np.float32(1)
            k = float(np.power(epsilon * np.power(np.float32(2), np.float32(mu))
                               / (np.float32(1) - np.power(np.float32(n_vocab), -epsilon)), np.float32(1) / s))
        k = int(k) if math.isfinite(k) and k < 2 ** 31 else 1
        k = min(max(k, 1), len(p.probs))
        kept = likeliest[:k] if k <= m else np.argpartition(p.probs, len(p.probs) - k)[-k:]
    return Dist(p.ids[kept], p.probs[kept] / p.probs[kept].sum())


def mirostat_moved(mu: float, p_token: float, tau: float, eta: float) -> float:
    """mu after a token as likely as p_token (in the cut it was chosen from) was chosen: moved by eta times how
    far its surprise missed tau. In float32, as llama.cpp keeps it: mirostat 1's cut hangs on 2 ** mu raised to
    1 / s, so a mu rounded otherwise would part from llama.cpp's within a few hundred tokens."""
    f32 = np.float32
    return float(f32(mu) - f32(eta) * (-np.log2(f32(p_token)) - f32(tau)))


class Mirostat:
    """llama.cpp's mirostat along one generation: each row cut at the threshold mu (mirostat_kept), which each
    token chosen moves (mirostat_moved). A verification's rows are cut in turn, each at the mu the tokens before
    it leave (kept, then chose, row by row), so what it keeps is what plain decoding would have."""

    def __init__(self, s: Sampling, n_vocab: int):
        self.version, self.tau, self.eta, self.n_vocab = s.mirostat, s.mirostat_tau, s.mirostat_eta, n_vocab
        self.mu = mirostat_start(s)
        self._cut: Dist | None = None

    @classmethod
    def of(cls, s: Sampling, n_vocab: int) -> "Mirostat | None":
        """The generation's mirostat, if it has one (greedy decoding takes the likeliest token whatever mu is)."""
        return cls(s, n_vocab) if s.mirostat and not s.greedy else None

    def kept(self, p: Dist) -> Dist:
        """p cut at the current mu: the distribution the next token is chosen from."""
        self._cut = mirostat_kept(p, self.version, self.mu, self.n_vocab)
        return self._cut

    def chose(self, token: int) -> None:
        """Move mu by the surprise of the token chosen from the last row cut."""
        self.mu = mirostat_moved(self.mu, self._cut.prob(token), self.tau, self.eta)


def mirostat_start(s: Sampling) -> float:
    """mu before the first token: twice the surprise aimed at."""
    return float(np.float32(2) * np.float32(s.mirostat_tau))


def accept(token: int, p: Dist, q: Dist, rng: np.random.Generator) -> bool:
    """Keep a draft token x ~ q with probability min(1, p(x) / q(x))."""
    q_x = q.prob(token)
    return q_x > 0 and rng.random() * q_x < p.prob(token)


def residual(p: Dist, q: Dist) -> Dist:
    """norm(max(0, p - q)): what to sample from after a rejection."""
    if len(q.ids) == 1:  # a deterministic draft's q: p without its token
        excess, at = p.probs.copy(), p.at(int(q.ids[0]))
        if at is not None:
            excess[at] = 0.0
    else:
        excess = np.maximum(p.probs - q.probs_of(p.ids), 0.0)
    total = excess.sum()
    # A rejection implies p(x) < q(x) somewhere, so mass is left; rounding can still empty it.
    return Dist(p.ids, excess / total) if total > 0 else p


def sampled_logprobs(p: Dist, token: int, top: int, piece) -> Logprobs:
    """The log probabilities in p, the distribution a token was chosen from, of token and of p's `top` likeliest
    candidates, likeliest first (those of probability 0 left out, as -inf has no JSON)."""
    likeliest = [i for i in np.argsort(-p.probs, kind="stable")[:top] if p.probs[i] > 0]
    return Logprobs(Candidate(token, piece(token), math.log(p.prob(token))),
                    tuple(Candidate(int(p.ids[i]), piece(int(p.ids[i])), math.log(p.probs[i])) for i in likeliest))


def logprobs_of(row: np.ndarray, token: int, top: int, piece) -> Logprobs:
    """A row's log probabilities (its softmax over the whole vocabulary) of token and of its `top` likeliest
    tokens, likeliest first; piece(id): the bytes a token stands for."""
    peak = float(row.max())
    normaliser = peak + float(np.log(np.exp(row - peak, dtype=np.float64).sum()))
    likeliest = np.argpartition(row, -top)[-top:] if top else np.empty(0, np.int64)
    likeliest = likeliest[np.argsort(-row[likeliest], kind="stable")]
    return Logprobs(Candidate(token, piece(token), float(row[token]) - normaliser),
                    tuple(Candidate(int(i), piece(int(i)), float(row[i]) - normaliser) for i in likeliest))
