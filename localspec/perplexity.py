"""A text's perplexity under the target, measured as llama.cpp's llama-perplexity measures it, so that the two
numbers can be set side by side: the text is tokenized whole (with the start token where the model takes
one), cut into chunks of the context's length, each read from an empty cache with its first token the start
token again; the second half of each chunk is scored, every token given all the chunk's tokens before it.
PPL = exp(mean negative log-likelihood), and its error as llama-perplexity gives it."""

import math
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter

from .errors import InputError
from .session import Session


@dataclass(frozen=True)
class Estimate:
    """ctx: tokens a chunk; running: the PPL after each chunk (llama-perplexity's [1]..., [2]... line)."""

    ppl: float
    error: float
    chunks: int
    ctx: int
    scored_tokens: int
    running: tuple[float, ...]
    seconds: float

    @property
    def tokens_per_second(self) -> float | None:
        """Tokens read a second, scored or not."""
        return self.chunks * self.ctx / self.seconds if self.seconds else None

    def as_dict(self) -> dict:
        return {"ppl": self.ppl, "error": self.error, "chunks": self.chunks, "ctx_size": self.ctx,
                "scored_tokens": self.scored_tokens, "running": list(self.running), "seconds": self.seconds,
                "tokens_per_second": self.tokens_per_second}


def chunks_of(tokens: list[int], ctx: int, bos: int | None, most: int | None = None) -> list[list[int]]:
    """The whole chunks of ctx tokens (at most `most`), each beginning with the start token where the model
    takes one, in place of the text's token there (as llama-perplexity does)."""
    count = len(tokens) // ctx if most is None else min(most, len(tokens) // ctx)
    chunks = [tokens[i * ctx : (i + 1) * ctx] for i in range(count)]
    return [[bos, *chunk[1:]] if bos is not None else chunk for chunk in chunks]


def estimate(negative_logs: list[float]) -> tuple[float, float]:
    """(PPL, its error) of the scored tokens' negative log-likelihoods, as llama-perplexity computes them."""
    count = len(negative_logs)
    mean = sum(negative_logs) / count
    spread = sum(v * v for v in negative_logs) / count - mean * mean
    ppl = math.exp(mean)
    return ppl, (math.sqrt(spread / (count - 1)) * ppl if spread > 0 and count > 1 else 0.0)


def measure(session: Session, text: str, ctx: int, most: int | None = None,
            progress: Callable[[int, int, float], None] | None = None) -> Estimate:
    """The text's perplexity in chunks of ctx tokens (at most `most` chunks); progress(done, chunks, running PPL)
    after each. InputError where the text holds no whole chunk."""
    model = session.prompts.model
    tokens = model.tokenize(text, add_special=True, parse_special=False)
    chunks = chunks_of(tokens, ctx, model.bos, most)
    if not chunks:
        raise InputError(f"the text is {len(tokens):,} tokens, less than one chunk of {ctx}: give a longer text"
                         " or a smaller --ctx-size")
    first = ctx // 2  # (the first half of a chunk is only read: each scored token has that much before it)
    steps: list[tuple[list[float], float]] = []  # each chunk's scored tokens and the estimate with them
    negative_logs: list[float] = []
    started = perf_counter()
    try:
        for number, chunk in enumerate(chunks, start=1):
            scored = [-entry.chosen.logprob for entry in session.score(chunk, start=first + 1)[first + 1 :]]
            steps.append((scored, estimate(negative_logs + scored)[0]))  # (one append: Ctrl-C finds it whole)
            negative_logs += scored
            if progress:
                progress(number, len(chunks), steps[-1][1])
    except KeyboardInterrupt:
        if not steps:
            raise
        raise Interrupted(_estimate(steps, ctx, perf_counter() - started), len(chunks)) from None
    return _estimate(steps, ctx, perf_counter() - started)


def _estimate(steps: list[tuple[list[float], float]], ctx: int, seconds: float) -> Estimate:
    negative_logs = [value for scored, _ in steps for value in scored]
    ppl, error = estimate(negative_logs)
    return Estimate(ppl, error, len(steps), ctx, len(negative_logs), tuple(running for _, running in steps), seconds)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C while measuring: the estimate over the chunks read by then (of chunks in all)."""

    def __init__(self, found: Estimate, chunks: int):
        super().__init__()
        self.found, self.chunks = found, chunks
