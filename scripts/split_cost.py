"""What splitting a reasoning model's reply into thinking and answer costs the host, per token.

    python scripts/split_cost.py [--tokens 200000] [--repeats 5]

Feeds a made-up reply (token pieces of 1-6 characters: a thinking block of most of it, then the
answer; for harmony, an analysis message then the final one) through reasoning.split as the engine's
Token events, beside the same events passed through untouched, and prints the median microseconds a
token each, and the difference: what the split adds to a step's host time (issue 49's target: < 5 us).
"""

import argparse
import random
import statistics
import sys
from pathlib import Path
from time import perf_counter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from localspec import reasoning  # noqa: E402
from localspec.events import Done, Step, Token  # noqa: E402

WORDS = "so the user wants the sum of two and two which is four let me check that again carefully".split()


def reply_pieces(tokens: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    text = " ".join(rng.choice(WORDS) for _ in range(tokens))
    pieces, at = [], 0
    while len(pieces) < tokens and at < len(text):
        size = rng.randint(1, 6)
        pieces.append(text[at: at + size])
        at += size
    return pieces


def events(family: reasoning.Family, tokens: int) -> list:
    pieces = reply_pieces(tokens)
    cut = len(pieces) * 9 // 10  # most of a reasoning model's reply is its thinking
    if family is reasoning.HARMONY:
        marked = ["<|channel|>", "analysis", "<|message|>", *pieces[:cut], "<|end|>", "<|start|>", "assistant",
                  "<|channel|>", "final", "<|message|>", *pieces[cut:]]
    else:
        marked = [family.open, *pieces[:cut], family.close, *pieces[cut:]]
    out = []
    for number, piece in enumerate(marked):
        if number % 4 == 0:
            out.append(Step("ngram", 3, 3, 0.0, 0.0))
        out.append(Token(number, piece, False))
    return [*out, Done("stop", "", 0.0)]


def timed(run, repeats: int) -> float:
    seconds = []
    for _ in range(repeats):
        started = perf_counter()
        run()
        seconds.append(perf_counter() - started)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"{'family':<8} {'tokens':>8} {'pass us/token':>14} {'split us/token':>15} {'added':>7}")
    for family in (reasoning.THINK, reasoning.GEMMA4, reasoning.HARMONY):
        stream = events(family, args.tokens)
        tokens = sum(isinstance(event, Token) for event in stream)
        plan = reasoning.Plan(family)

        def passed() -> None:
            for _ in iter(stream):
                pass

        pieces = {event.id: event.text.encode() for event in stream if isinstance(event, Token)}

        def control_text(token: int) -> str | None:  # as Model.control_text does for a text token: a cached piece
            return None if pieces.get(token) else ""

        def split() -> None:
            for _ in reasoning.split(iter(stream), plan, control_text, lambda made: iter(())):
                pass

        through, splitting = (timed(run, args.repeats) / tokens * 1e6 for run in (passed, split))
        print(f"{family.name:<8} {tokens:>8} {through:>14.3f} {splitting:>15.3f} {splitting - through:>7.3f}")


if __name__ == "__main__":
    main()
