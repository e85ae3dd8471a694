"""Where a bench run's greedy text departed from plain decoding's, whether each departure is a near-tie.

    python scripts/departures.py BENCH.json [BENCH.json ...]

A drafting mode's greedy output is the target's own argmax at every position, but the target's rows are
computed in batches of another shape than plain decoding's, and llama.cpp's sums then round otherwise:
where the target's two likeliest tokens are nearly tied, the batched row may prefer the other. For each
departure `bench` listed (BENCH.json's `differs_from_plain`), this reads plain decoding's row there, one
token at a time as plain decoding does, and the same row computed inside a batch of the last few tokens
(as a verification computes it), and prints the gap between the two likeliest tokens and whether the
batched row prefers the other one: a departure with a gap of a few hundredths and a batched row that
flips is a near-tie, not a drafter's doing.
"""

import argparse
import json
from pathlib import Path

import numpy as np

from localspec import bench
from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
from localspec.engine.sampling import chain_for
from localspec.events import Token
from localspec.request import Request
from localspec.session import Session
from localspec.store import download, registry

BATCH = 4  # the rows of a verification read with the departure's


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", nargs="+", type=Path)
    args = parser.parse_args()
    runs = [json.loads(path.read_text()) for path in args.bench]
    for target_name in dict.fromkeys(run["target"] for run in runs):
        target = download.locate(registry.resolve(target_name), offline=True)
        with Session(target, None, Runtime(ctx_size=4096), Speculation(DrafterKind.PLAIN)) as session:
            for run in (r for r in runs if r["target"] == target_name):
                for row in run["results"]:
                    for departure in row.get("differs_from_plain") or []:
                        print(f"{run['draft'] or 'no draft'}, {row['mode']} on {row['prompt_set']}, prompt"
                              f" {departure['prompt']} from token {departure['at']}: "
                              + traced(session, row["prompt_set"], departure, run["max_tokens"]))


def traced(session: Session, prompt_set: str, departure: dict, max_tokens: int) -> str:
    prompt = bench.load_prompts(prompt_set, departure["prompt"])[departure["prompt"] - 1]
    tokens = session.prompts.prompt_tokens(list(prompt.messages))
    request = Request(Sampling(temperature=0.0), Limits(max_tokens=max_tokens), prompt=tokens)
    session.target.truncate(0)  # read from an empty cache, as bench reads every prompt
    plain = [e.id for e in session.generate(request) if isinstance(e, Token)]
    before = tokens + plain[: departure["at"]]
    target, piece = session.target, session.target_model.piece
    target.sample_with(chain_for(request.sampling), host=True)  # full rows, read here
    target.truncate(0)
    target.decode(before[:-BATCH], logits="none")
    for token in before[-BATCH:]:  # a token at a time, as plain decoding reads it
        target.decode([token], logits="last")
    alone = target.logits(-1).copy()
    target.truncate(len(before) - BATCH)
    target.decode(before[-BATCH:], logits="all")  # the same rows in one batch, as a verification reads them
    batched = target.logits(BATCH - 1).copy()
    first, second = np.argsort(alone)[::-1][:2]
    flips = int(np.argmax(batched)) != int(first)
    return (f"{piece(int(first))!r} {alone[first]:.3f} against {piece(int(second))!r} {alone[second]:.3f}, "
            f"{alone[first] - alone[second]:.3f} apart; in a batch of {BATCH}: {batched[first] - batched[second]:+.3f}"
            + (" (the batched row prefers the other: a near-tie)" if flips else ""))


if __name__ == "__main__":
    main()
