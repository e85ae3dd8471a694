#!/usr/bin/env python3
"""batch --parallel N against --parallel 1 on the same items, in one process, runs interleaved
(1, N, 1, N: each mode twice, so each mode's two runs are an A/A control of its noise):

    .venv/bin/python scripts/parallel_batch.py qwen2.5-coder-1.5b --parallel 4 --items 16 --max-tokens 64
    .venv/bin/python scripts/parallel_batch.py qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --drafting draft

Items are the first --items prompts of a prompt set (bench's, default mtbench), greedy. Prints each
run's aggregate tokens/s (generation only: the models are loaded before the clock starts), the ratio
of the modes' medians, the A/A ratios, and how many items' tokens are identical across the modes. For
an item that differs, the target decodes the tokens both modes agreed on once more, one a step, and
says how far apart the logits of the two tokens they then chose were: batched logits round otherwise
than a single row's, which flips a near-tie (a wide gap there would be a fault).
"""

import argparse
import io
import statistics
import time

from localspec import batch
from localspec.bench import load_prompts
from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
from localspec.engine.drafters.spec import MODES
from localspec.events import Token
from localspec.session import open_session


def run(model: str, draft: str | None, items: list, parallel: int, max_tokens: int,
        drafting: DrafterKind) -> tuple[float, dict, float]:
    """(aggregate tokens/s, each item's (prompt tokens, generated tokens) by id, draft tokens accepted a step)."""
    with open_session(model, draft, Runtime(ctx_size=2048, parallel=parallel), Speculation(drafting=drafting),
                      offline=True) as session:
        generated: dict[tuple, list[int]] = {}
        generate = session.generate

        def keeping_tokens(prompt, *args, **options):  # what batch's records leave out: the token ids
            kept = generated.setdefault(tuple(prompt), [])
            for event in generate(prompt, *args, **options):
                if isinstance(event, Token):
                    kept.append(event.id)
                yield event

        session.generate = keeping_tokens
        started = time.perf_counter()
        records = batch.run(session, items, io.StringIO(), Sampling(temperature=0), Limits(max_tokens), False,
                            lambda record: None, False)
        seconds = time.perf_counter() - started
        prompts = {item.id: tuple(session.prompts.chat_tokens(item.messages)) for item in items}
    failed = [r for r in records if "error" in r]
    assert not failed, failed
    steps = sum(r["stats"]["steps"] for r in records)
    return (sum(r["stats"]["tokens"] for r in records) / seconds,
            {i: (list(prompt), generated[prompt]) for i, prompt in prompts.items()},
            sum(r["stats"]["accepted"] for r in records) / max(1, steps))


def gap_where_they_part(model: str, prompt: list[int], agreed: list[int], one: int, other: int) -> float:
    """logit(one) - logit(other) after the prompt and the agreed tokens, decoded one token a step as
    --parallel 1 decodes them."""
    with open_session(model, None, Runtime(ctx_size=2048, backend_sampling=False),
                      Speculation(drafting=DrafterKind.PLAIN), offline=True) as session:
        target = session.target
        target.decode(prompt[:-1], logits="none")
        for token in [prompt[-1], *agreed]:
            target.decode([token], logits="last")
        row = target.logits(-1)
        return float(row[one] - row[other])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--draft", help="a draft model, for --drafting draft or auto")
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--items", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompts", default="mtbench")
    parser.add_argument("--drafting", default="plain", choices=MODES)
    args = parser.parse_args()

    items = [batch.Item(id=str(i), messages=prompt.messages)
             for i, prompt in enumerate(load_prompts(args.prompts, args.items))]
    rates: dict[int, list[float]] = {1: [], args.parallel: []}
    outputs: dict[int, dict] = {}
    for parallel in (1, args.parallel, 1, args.parallel):
        rate, outputs[parallel], accepted = run(args.model, args.draft, items, parallel, args.max_tokens,
                                                DrafterKind(args.drafting))
        rates[parallel].append(rate)
        print(f"--parallel {parallel}: {rate:.2f} tok/s, {accepted:.2f} draft tokens accepted a step", flush=True)
    one, many = rates[1], rates[args.parallel]
    print(f"ratio {statistics.median(many) / statistics.median(one):.2f}x (--parallel {args.parallel} over 1);"
          f" A/A: --parallel 1 {one[1] / one[0]:.2f}, --parallel {args.parallel} {many[1] / many[0]:.2f}")
    same = [i for i in outputs[1] if outputs[1][i][1] == outputs[args.parallel][i][1]]
    print(f"{len(same)} of {len(items)} items' tokens identical across the modes", flush=True)
    for i, (prompt, alone) in outputs[1].items():
        together = outputs[args.parallel][i][1]
        if i in same:
            continue
        at = next((n for n, (a, b) in enumerate(zip(alone, together)) if a != b), min(len(alone), len(together)))
        if at == min(len(alone), len(together)):
            print(f"  item {i}: one is a prefix of the other (an end token at {at})")
            continue
        gap = gap_where_they_part(args.model, prompt, alone[:at], alone[at], together[at])
        print(f"  item {i} parts at token {at}: {alone[at]} alone, {together[at]} beside others, whose logits"
              f" one token a step were {gap:.3f} apart", flush=True)


if __name__ == "__main__":
    main()
