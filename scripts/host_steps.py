"""Host work a step on the accelerator report's models, with more tokens than the report's smallest run.

    python scripts/host_steps.py [--size smallest] [--prompts 3] [--tokens 256] [--repeats 3] [--sampled]

The accelerator report's target and a draft model of other random weights (written under build/host-steps on
first use), so the draft is never right: the floor. Plain and auto decode each prompt in turn, each from
nothing remembered; a step's host time is its wall time less the time inside llama_decode (bench.HostTime).
Prints each mode's mean microseconds a step and how many steps drafted (where auto drafted, n-gram lookups in
a text that loops, it is not the floor alone). --sampled: instead, the report's host stage (greedy and
T = 0.8, sampling on the backend and on the host, drafts of 0-16 tokens): microseconds a step and a further
verified row. On a GPU a step of a 1.5B model takes about 1.7 ms, so each 17 us of host work there is 1% of
its speed; auto's work beyond plain's read 77 us a step in the lent H200's floor (1.5B-shaped) where this
2-vCPU AMD EPYC read 61-64 in this script's, with the same code (2026-11-29).
"""

import argparse
from dataclasses import replace
from pathlib import Path

from localspec.bench import HostTime
from localspec.config import DrafterKind, Runtime

import accelerator_measure as measure

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="smallest", help="the accelerator report's size (default: smallest)")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=256, help="generated a prompt")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sampled", action="store_true", help="the report's host stage instead of the floor")
    args = parser.parse_args()
    size = replace(measure.report_script().SIZES[args.size], tokens=args.tokens, prompts=args.prompts)
    pair = measure.Pair(0, size.pairs[0], size, ROOT / "build" / "host-steps")
    if args.sampled:
        sampled(pair, args.repeats)
    else:
        floor(pair, args.repeats)


def floor(pair: measure.Pair, repeats: int) -> None:
    modes = {DrafterKind.PLAIN: HostTime(), DrafterKind.AUTO: HostTime()}
    drafted = dict.fromkeys(modes, 0)
    with pair.session() as session:
        for _ in range(repeats):
            for prompt in pair.prompts:
                for mode, host in modes.items():
                    session.forget()
                    recorder = measure.with_mode(session, mode, prompt, pair.size.tokens, host)[0]
                    drafted[mode] += sum(tally.steps for tally in recorder.drafters.values())
    for mode, host in modes.items():
        print(f"{mode}: {host.seconds / host.steps * 1e6:.1f} us a step over {host.steps} steps,"
              f" {drafted[mode]} of them drafted")


def sampled(pair: measure.Pair, repeats: int) -> None:
    for on_backend in (True, False):
        with pair.session(Runtime(ctx_size=measure.CONTEXT, backend_sampling=on_backend)) as session:
            for label, row in measure.host_costs(session, pair.prompts * repeats, pair.size.tokens).items():
                print(f"{label}, sampled on the {row['sampled_on']}: {row['us_per_step']:.1f} us a step,"
                      f" {row['us_per_row']:.1f} us a further row")


if __name__ == "__main__":
    main()
