#!/usr/bin/env python3
"""batch --parallel N against --parallel 1 on the same items, in one process, runs interleaved
(1, N, 1, N: each mode twice, so each mode's two runs are an A/A control of its noise):

    .venv/bin/python scripts/parallel_batch.py qwen2.5-coder-1.5b --parallel 4 --items 16 --max-tokens 64

Items are the first --items prompts of a prompt set (bench's, default mtbench), greedy. Prints each
run's aggregate tokens/s (generation only: the models are loaded before the clock starts), the ratio
of the modes' medians, the A/A ratios, and how many items' texts are identical across the modes (a
difference is batched logits rounding otherwise in a near-tie: the first differing character is shown).
"""

import argparse
import io
import statistics
import time

from localspec import batch
from localspec.bench import load_prompts
from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
from localspec.session import open_session


def run(model: str, items: list, parallel: int, max_tokens: int, drafting: DrafterKind) -> tuple[float, dict]:
    with open_session(model, None, Runtime(ctx_size=2048, parallel=parallel), Speculation(drafting=drafting),
                      offline=True) as session:
        started = time.perf_counter()
        records = batch.run(session, items, io.StringIO(), Sampling(temperature=0), Limits(max_tokens), False,
                            lambda record: None, False)
        seconds = time.perf_counter() - started
    failed = [r for r in records if "error" in r]
    assert not failed, failed
    return sum(r["stats"]["tokens"] for r in records) / seconds, {r["id"]: r["text"] for r in records}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--items", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompts", default="mtbench")
    parser.add_argument("--drafting", default="plain", choices=[str(kind) for kind in DrafterKind])
    args = parser.parse_args()

    items = [batch.Item(id=str(i), messages=prompt.messages)
             for i, prompt in enumerate(load_prompts(args.prompts, args.items))]
    rates: dict[int, list[float]] = {1: [], args.parallel: []}
    texts: dict[int, dict] = {}
    for parallel in (1, args.parallel, 1, args.parallel):
        rate, texts[parallel] = run(args.model, items, parallel, args.max_tokens, DrafterKind(args.drafting))
        rates[parallel].append(rate)
        print(f"--parallel {parallel}: {rate:.2f} tok/s", flush=True)
    one, many = rates[1], rates[args.parallel]
    print(f"ratio {statistics.median(many) / statistics.median(one):.2f}x (--parallel {args.parallel} over 1);"
          f" A/A: --parallel 1 {one[1] / one[0]:.2f}, --parallel {args.parallel} {many[1] / many[0]:.2f}")
    same = [i for i in texts[1] if texts[1][i] == texts[args.parallel][i]]
    print(f"{len(same)} of {len(items)} items' texts identical across the modes")
    for i in texts[1]:
        if i not in same:
            a, b = texts[1][i], texts[args.parallel][i]
            at = next((n for n, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            print(f"  item {i} differs from character {at}: {a[max(0, at - 20):at + 20]!r} / {b[max(0, at - 20):at + 20]!r}")


if __name__ == "__main__":
    main()
