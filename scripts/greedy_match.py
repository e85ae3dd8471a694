"""How often greedy speculative output equals plain greedy output, and why it differs.

    python scripts/greedy_match.py TARGET.gguf [--draft DRAFT.gguf] [--max-tokens 128]
                                   [--prompts humaneval,mtbench --limit 4]

For each prompt (its own eight, or bench's prompt sets), runs plain greedy decoding, then greedy speculation with the
draft model (if given) and with n-gram lookup, in one process. Where outputs
differ, prints the position and the gap between the target's two best logits
there in plain decoding: a tiny gap means a near-tie that batched and
single-token matrix products break differently (both outputs are the target's
greedy choice under its own verification logits).
"""

import argparse
from pathlib import Path

import numpy as np

from localspec import bench
from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
from localspec.events import Token
from localspec.request import Request
from localspec.session import Session

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain the difference between a list and a tuple in Python.",
    "Write a function that merges two sorted lists into one sorted list.",
    "What is speculative decoding in language models? Answer briefly.",
    "Write a SQL query that returns the ten customers with the highest total order value.",
    "Rewrite this loop as a list comprehension: result = []\nfor x in range(10):\n    if x % 2 == 0:\n        result.append(x * x)",
    "Write a bash script that counts the lines of every .py file in a directory.",
    "Implement binary search in Python and explain its complexity.",
]


def tokens_of(session: Session, prompt: list[int], max_tokens: int) -> list[int]:
    events = session.generate(Request(Sampling(temperature=0.0), Limits(max_tokens=max_tokens), prompt=prompt))
    return [e.id for e in events if isinstance(e, Token)]


def logit_gap(session: Session, context: list[int]) -> float:
    target = session.target
    target.truncate(0)
    target.decode(context, logits="last")
    top2 = np.sort(target.logits(-1))[-2:]
    return float(top2[1] - top2[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", type=Path)
    parser.add_argument("--draft", type=Path)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompts", help="bench's prompt sets, comma-separated, in place of the eight here")
    parser.add_argument("--limit", type=int, help="the first N prompts of each set")
    args = parser.parse_args()

    runtime = Runtime(ctx_size=2048)
    drafts = {DrafterKind.NGRAM: None} | ({DrafterKind.DRAFT: args.draft} if args.draft else {})
    matches = {name: 0 for name in drafts}
    with Session(args.target, None, runtime, Speculation(DrafterKind.PLAIN)) as plain_session:
        if args.prompts:
            prompts = [plain_session.prompts.prompt_tokens(list(p.messages)) for name in bench.expand(args.prompts)
                       for p in bench.load_prompts(name, args.limit)]
        else:
            prompts = [plain_session.prompts.tokenize(p, raw=False) for p in PROMPTS]
        plain = [tokens_of(plain_session, p, args.max_tokens) for p in prompts]
        gaps = {}
        for name, draft in drafts.items():
            with Session(args.target, draft, runtime, Speculation(name, draft_max=4, p_min=0.0)) as session:
                for i, prompt in enumerate(prompts):
                    output = tokens_of(session, prompt, args.max_tokens)
                    if output == plain[i]:
                        matches[name] += 1
                        continue
                    at = next((j for j, (a, b) in enumerate(zip(output, plain[i])) if a != b), min(len(output), len(plain[i])))
                    key = (i, at)
                    if key not in gaps:
                        gaps[key] = logit_gap(plain_session, prompt + plain[i][:at])
                    print(f"{name}: prompt {i} differs at token {at} of {len(plain[i])};"
                          f" gap between the target's top two logits there: {gaps[key]:.4f}")
    for name, count in matches.items():
        print(f"{name}: {count}/{len(plain)} prompts identical to plain greedy decoding")


if __name__ == "__main__":
    main()
