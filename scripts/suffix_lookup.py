"""What the cross-request suffix cache costs at its default cap: lookups and adds at 1M cached tokens.

    python scripts/suffix_lookup.py [--tokens 1000000] [--vocabulary 150000] [--lookups 5000]

Fills a SuffixCache with ~500-token generations drawn from a few hundred templates with token-level
changes (repeated structure, as batch items and agent turns have), then times `propose` for contexts
cut from fresh generations of the same templates (they match) and for random contexts (they do not),
and `add` of 500-token generations at the cap (the recent tier's merges and the evictions included).
Prints one table; host-side work, so absolute microseconds.
"""

import argparse
from time import perf_counter

import numpy as np

from localspec.engine.suffix import SuffixCache

GENERATION = 500


def generations(rng, templates, count, vocabulary):
    """Template copies with 5% of tokens changed and a random cut of up to 50 tokens at either end."""
    for _ in range(count):
        template = templates[int(rng.integers(len(templates)))]
        generation = template.copy()
        changed = rng.random(len(generation)) < 0.05
        generation[changed] = rng.integers(0, vocabulary, size=int(changed.sum()))
        yield generation[int(rng.integers(50)) : len(generation) - int(rng.integers(50))]


def timed(call, arguments) -> np.ndarray:
    """Microseconds per call, one per argument."""
    spent = []
    for argument in arguments:
        started = perf_counter()
        call(argument)
        spent.append(perf_counter() - started)
    return np.array(spent) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--vocabulary", type=int, default=150_000)
    parser.add_argument("--lookups", type=int, default=5_000)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    rng = np.random.default_rng(options.seed)
    templates = [rng.integers(0, options.vocabulary, size=GENERATION + 100) for _ in range(300)]

    cache = SuffixCache(max_tokens=options.tokens)
    started = perf_counter()
    cache.extend(generations(rng, templates, options.tokens // (GENERATION - 50) + 10, options.vocabulary))
    built = perf_counter() - started
    # Adds at the cap: enough to merge the recent tier into the sealed one and to evict several times.
    adds = timed(cache.add, list(generations(rng, templates, 400, options.vocabulary)))

    fresh = list(generations(rng, templates, options.lookups, options.vocabulary))
    matching = [g[: int(rng.integers(20, len(g)))].tolist() for g in fresh]
    unmatched = [rng.integers(0, options.vocabulary, size=64).tolist() for _ in range(options.lookups)]
    timed(cache.propose, matching[:200])  # warm caches and branch predictors before measuring
    hits = timed(cache.propose, matching)
    misses = timed(cache.propose, unmatched)
    drafts = [cache.propose(context) for context in matching[:1000]]

    print(f"cache: {cache.tokens:,} tokens, {cache.nbytes / 2**20:.1f} MiB, bulk build {built:.2f} s")
    print(f"matching drafts: mean {np.mean([len(d.tokens) for d in drafts]):.1f} tokens, "
          f"mean match {np.mean([d.match for d in drafts]):.1f}, "
          f"median support {np.median([d.support for d in drafts]):.0f}")
    print(f"{'operation':<32}{'median us':>12}{'p99 us':>12}{'mean us':>12}")
    for name, spent in [("propose, context matches", hits), ("propose, context does not", misses),
                        (f"add a {GENERATION}-token generation", adds)]:
        print(f"{name:<32}{np.median(spent):>12.1f}{np.percentile(spent, 99):>12.1f}{np.mean(spent):>12.1f}")


if __name__ == "__main__":
    main()
