"""Host time of n-gram lookup on long contexts: a new prompt's first proposal and the median of the 200 after it, and
each turn of a chat whose prompt goes on from the last (3,000 new tokens a turn, 200 tokens generated between turns).

    python scripts/ngram_index.py

Random tokens, half of them from 2,000 common ones (so that n-grams repeat) and half from a 150,000-token vocabulary;
auto's n-gram sizes and alternatives. Best of 5 for the new prompts' first proposals.
"""

import random
import statistics
import time

from localspec.config import Sampling, Speculation
from localspec.engine.drafters.free import NgramDrafter

SPECULATION = Speculation()


def token(rng: random.Random) -> int:
    return rng.randrange(150_000) if rng.random() < 0.5 else rng.randrange(2_000)


def drafter() -> NgramDrafter:
    return NgramDrafter(SPECULATION.ngram_min, SPECULATION.ngram_max, alternatives=2)


def first_proposal(one: NgramDrafter, prompt: list[int]) -> float:
    started = time.perf_counter()
    one.begin(prompt, Sampling(), None)
    one.propose(prompt, 8)
    return time.perf_counter() - started


def later_proposals(one: NgramDrafter, prompt: list[int], rng: random.Random) -> list[float]:
    one.begin(prompt, Sampling(), None)
    history, seconds = list(prompt), []
    for _ in range(200):
        started = time.perf_counter()
        one.propose(history, 8)
        seconds.append(time.perf_counter() - started)
        history.append(token(rng))
    return seconds


def main() -> None:
    rng = random.Random(0)
    for length in (2_000, 8_000, 32_000):
        prompt = [token(rng) for _ in range(length)]
        best = min(first_proposal(drafter(), prompt) for _ in range(5))
        print(f"a new prompt of {length:,} tokens: first proposal {best * 1e3:.2f} ms, the next 200 "
              f"{statistics.median(later_proposals(drafter(), prompt, rng)) * 1e6:.1f} us each (median)")
    chat, history = drafter(), [token(rng) for _ in range(1_000)]
    for turn in range(1, 9):
        prompt = history + [token(rng) for _ in range(3_000)]
        seconds = first_proposal(chat, prompt)
        history = list(prompt)
        for _ in range(200):
            chat.propose(history, 8)
            history.append(token(rng))
        print(f"turn {turn}: a prompt of {len(prompt):,} tokens, first proposal {seconds * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
