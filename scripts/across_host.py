"""The host work of drafting across vocabularies, per drafted token: what a draft through text costs beyond
the draft model's decodes and rows (which a draft of the target's vocabulary costs as well): the history's
text, the comparison of texts, the draft's and the target's tokenizers, the intersection.

    python scripts/across_host.py [--target qwen2.5-coder-1.5b] [--draft smollm2-135m] [--set humaneval]
                                  [--limit 4] [--max-tokens 128]

Each piece of that work is timed where generation runs it, right after a decode has streamed the models'
weights through every cache of this CPU (cold), and then at once again on the same input (warm: as on a GPU,
where the decode runs elsewhere and the host keeps its caches; scripts/cold_host.py shows the difference).
Prints, greedy and at T = 0.8, the acceptance and the microseconds of host work per drafted token, both ways.
"""

import argparse
from collections import Counter
from time import perf_counter

from localspec import bench
from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation, default_threads
from localspec.engine.drafters.across import AcrossDrafter, Vocabularies, complete
from localspec.engine.model import Model
from localspec.events import Step
from localspec.request import Request
from localspec.session import Session
from localspec.store import download, registry

# the translation's own work, each pure (it changes nothing), so it can be run twice on one input (the texts
# read a token at a time are list lookups, left out)
PIECES = [(AcrossDrafter, "_agreed"), (AcrossDrafter, "_mapped"), (AcrossDrafter, "_tokens_for"), (Model, "spell"),
          (Vocabularies, "restricted")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="smollm2-135m")
    parser.add_argument("--set", default="humaneval")
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    target, draft = (download.locate(registry.resolve(name)) for name in (args.target, args.draft))
    seconds = Counter()
    depth = 0  # pieces call pieces (_tokens_for calls spell): only the outermost is timed

    def twice(function):
        def timed(*a, **k):
            nonlocal depth
            if depth:
                return function(*a, **k)
            depth += 1
            try:
                started = perf_counter()
                result = function(*a, **k)
                middle = perf_counter()
                function(*a, **k)
                seconds["cold"] += middle - started
                seconds["warm"] += perf_counter() - middle
            finally:
                depth -= 1
            return result
        return timed

    for owner, name in PIECES:
        setattr(owner, name, twice(getattr(owner, name)))
    global_complete = twice(complete)
    import localspec.engine.drafters.across as across
    across.complete = global_complete
    runtime = Runtime(threads=default_threads(), ctx_size=4096)
    with Session(target, draft, runtime, Speculation(DrafterKind.DRAFT)) as session:
        prompts = bench.load_prompts(args.set, args.limit)
        print(f"{args.draft} drafting for {args.target}, {args.set} x {len(prompts)}, up to {args.max_tokens} tokens")
        for sampling in (Sampling(temperature=0.0), Sampling(temperature=0.8, seed=1)):
            seconds.clear()
            drafted = accepted = 0
            for prompt in prompts:
                request = Request(sampling, Limits(max_tokens=args.max_tokens), messages=list(prompt.messages))
                for event in session.generate(request):
                    if isinstance(event, Step):
                        drafted, accepted = drafted + event.drafted, accepted + event.accepted
            per = {way: seconds[way] / max(1, drafted) * 1e6 for way in ("cold", "warm")}
            print(f"T={sampling.temperature}: {drafted} drafted, {accepted / max(1, drafted):.0%} accepted; host work"
                  f" per drafted token {per['cold']:.1f} us cold, {per['warm']:.1f} us warm")


if __name__ == "__main__":
    main()
