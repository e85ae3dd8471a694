"""What the room for draft trees costs plain decoding: the target's context with and without room for
branches (a sampler chain of their own for each, in the graph where rows are sampled there), plain
greedy decoding interleaved round by round in one process. With --parallel N: N sequences of one context
(as serve -np N makes it, rows sampled on the host) generating together, with and without branch ids of
their own for each, their tokens per second in all.

    python scripts/tree_room.py [--model qwen2.5-coder-1.5b] [--rounds 4] [--tokens 48] [--parallel N]
"""

import argparse
import statistics
import time

from localspec.config import Limits, Sampling, Speculation
from localspec.engine.backend import Context
from localspec.engine.drafters import NoDrafter
from localspec.engine.model import Model
from localspec.engine.speculative import generate
from localspec.engine.together import Together
from localspec.events import Token
from localspec.store import download, registry

PROMPT = 'def quicksort(items):\n    """Sort a list."""\n'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--parallel", type=int, default=1)
    args = parser.parse_args()
    model = Model(download.locate(registry.resolve(args.model), offline=True))
    n = args.parallel
    sampled_where = None if n == 1 else False
    contexts = {"no room": Context(model, 2048, 512, 2, sampled_where, 33, n_seq=n),
                "room for 4 branches": Context(model, 2048, 512, 2, sampled_where, 33, n_seq=n, branches=4)}
    sequences = {label: [context] + [context.sequence(seq) for seq in range(1, n)] for label, context in contexts.items()}
    prompt = model.tokenize(PROMPT, add_special=False, parse_special=False)
    speeds: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for label, views in sequences.items():
            together = Together()
            for seq, view in enumerate(views):
                view.truncate(0)
                together.add(seq, generate(view, NoDrafter(), prompt, Sampling(temperature=0.0), Speculation(),
                                           Limits(max_tokens=args.tokens)))
            started, made = time.perf_counter(), 0
            while together:
                made += sum(isinstance(item, Token) for _, item in together.step())
            speeds.setdefault(label, []).append(made / (time.perf_counter() - started))
    for label, values in speeds.items():
        print(f"{label:26} median {statistics.median(values):6.2f} tok/s  rounds {', '.join(f'{v:.2f}' for v in values)}")


if __name__ == "__main__":
    main()
