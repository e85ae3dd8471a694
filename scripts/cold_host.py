"""Why host work costs more between CPU decodes than on its own: each host operation timed twice, first
right after a llama_decode (which streams the model's weights through every cache) and then at once again.

    python scripts/cold_host.py [--model smollm2-135m] [--steps 200]

Prints the median microseconds of each, cold and warm. On a GPU the decode runs elsewhere and the host
keeps its caches, so the warm figure is the one that carries over there.
"""

import argparse
import statistics
from time import perf_counter

import numpy as np

from localspec.store import download, registry
from localspec.config import DrafterKind, Runtime, Sampling, Speculation, default_threads
from localspec.engine.sampling import chain_for, softmax
from localspec.session import Session

PROMPT = "def fibonacci(n):\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    path = download.locate(registry.resolve(args.model))
    rng = np.random.default_rng(0)
    operations = {
        "greedy row (argmax taken in the graph)": (chain_for(Sampling(temperature=0)), lambda c: c.token(0)),
        "sampled row: the chain's candidates and their p": (chain_for(Sampling()), lambda c: softmax(*c.candidates(0))),
        "sampled plain step: llama.cpp draws": (chain_for(Sampling()), lambda c: c.draw(0, rng)),
    }
    with Session(path, None, Runtime(threads=default_threads(), ctx_size=512), Speculation(DrafterKind.PLAIN)) as session:
        target = session.target
        prompt = session.prompts.tokenize(PROMPT, raw=True)
        print(f"{args.model}, {target.model.n_vocab} tokens, {args.steps} decodes each; median µs")
        for name, (chain, operation) in operations.items():
            target.truncate(0)
            target.sample_with(chain)
            target.decode(prompt, logits="last")
            cold, warm = [], []
            for _ in range(args.steps):
                target.decode(prompt[-1:], logits="all")
                for times in (cold, warm):
                    started = perf_counter()
                    operation(target)
                    times.append(perf_counter() - started)
                target.truncate(len(prompt))
            print(f"  {name}: {statistics.median(cold) * 1e6:.0f} after a decode,"
                  f" {statistics.median(warm) * 1e6:.0f} again at once")


if __name__ == "__main__":
    main()
