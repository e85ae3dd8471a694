"""Plain vs fixed draft-model vs fixed n-gram vs auto speculation, side by side in one process.

    python scripts/compare_modes.py TARGET.gguf DRAFT.gguf [--max-tokens 128] [--temp 0] [--rounds 2]

Modes run interleaved, round after round, so that load on a shared machine
hits them alike; each generation starts from an empty KV cache. Prints
tokens/s, acceptance and mean accepted length per mode, and the speedup over
plain decoding.
"""

import argparse
from pathlib import Path

from localspec.config import Limits, Runtime, Sampling, Speculation
from localspec.events import Done
from localspec.session import Session

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Rewrite this function with type hints and a docstring, keeping the body unchanged:\n\n"
    "def moving_average(values, window):\n"
    "    result = []\n"
    "    for i in range(len(values) - window + 1):\n"
    "        chunk = values[i:i + window]\n"
    "        result.append(sum(chunk) / window)\n"
    "    return result\n",
    "Explain what a hash map is, in three sentences.",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", type=Path)
    parser.add_argument("draft", type=Path)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temp", type=float, default=0.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--draft-max", type=int, default=Speculation("fixed").draft_max, help="for the fixed modes")
    parser.add_argument("--p-min", type=float, default=Speculation().p_min)
    args = parser.parse_args()

    fixed = Speculation("fixed", draft_max=args.draft_max, p_min=args.p_min)
    sampling = Sampling(temperature=args.temp, seed=0)
    modes = {
        "plain": (None, fixed),
        "draft": (str(args.draft), fixed),
        "ngram": ("ngram", fixed),
        "auto": (str(args.draft), Speculation("auto", p_min=args.p_min)),
    }
    sessions = {mode: Session(args.target, draft, Runtime(), spec) for mode, (draft, spec) in modes.items()}
    totals = {mode: {"tokens": 0, "seconds": 0.0, "drafted": 0, "accepted": 0, "steps": 0} for mode in modes}
    try:
        for _ in range(args.rounds):
            for text in PROMPTS:
                for mode, session in sessions.items():
                    prompt = session.tokenize(text, raw=False)
                    *_, done = session.generate(prompt, sampling, Limits(max_tokens=args.max_tokens))
                    assert isinstance(done, Done)
                    s, total = done.summary, totals[mode]
                    total["tokens"] += s.tokens
                    total["seconds"] += s.decode_seconds
                    total["drafted"] += s.drafted
                    total["accepted"] += s.accepted
                    total["steps"] += s.steps
    finally:
        for session in sessions.values():
            session.close()

    plain_speed = totals["plain"]["tokens"] / totals["plain"]["seconds"]
    print(f"{'mode':6} {'tok/s':>7} {'speedup':>8} {'accepted':>9} {'tokens/step':>12}")
    for mode, t in totals.items():
        speed = t["tokens"] / t["seconds"]
        acceptance = t["accepted"] / t["drafted"] if t["drafted"] else 0.0
        print(f"{mode:6} {speed:7.2f} {speed / plain_speed:7.2f}x {acceptance:9.0%} {t['tokens'] / t['steps']:12.2f}")


if __name__ == "__main__":
    main()
