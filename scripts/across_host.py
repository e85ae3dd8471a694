"""The host work of drafting across vocabularies, per drafted token: what a draft through text costs beyond
the draft model's decodes and rows (which a draft of the target's vocabulary costs as well): the history's
text compared with the draft's, the draft's and the target's tokenizers, the intersection.

    python scripts/across_host.py [--target qwen2.5-coder-1.5b] [--draft smollm2-135m] [--set humaneval]
                                  [--limit 4] [--max-tokens 128]

Each piece of that work is timed where generation runs it, right after a decode has streamed the models'
weights through every cache of this CPU (cold: where a CPU decodes, Python's own code and data are
evicted meanwhile, and a function of 0.3 us takes 3-12 us), and every call is replayed afterwards on the
same inputs, one after another (warm: as on a GPU, where the decode runs elsewhere and the host keeps its
caches; scripts/cold_host.py shows the difference for the engine's other host work). Prints, greedy and
at T = 0.8, the acceptance and the microseconds of host work per drafted token, both ways.
"""

import argparse
from copy import copy
from time import perf_counter
from types import SimpleNamespace

from localspec import bench
from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation, default_threads
from localspec.engine.drafters import across
from localspec.engine.drafters.across import AcrossDrafter, Vocabularies
from localspec.engine.model import Model
from localspec.events import Step
from localspec.request import Request
from localspec.session import Session
from localspec.store import download, registry

# the translation's own work: each changes nothing, so it can be run again on the same inputs (the texts
# read a token at a time are list lookups, left out)
PIECES = [(AcrossDrafter, "_agreed"), (AcrossDrafter, "_mapped"), (AcrossDrafter, "_tokens_for"), (Model, "spell"),
          (Vocabularies, "restricted"), (across, "complete")]
REPLAYS = 3  # the fastest of these many replays is the warm figure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="smollm2-135m")
    parser.add_argument("--set", default="humaneval")
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    target, draft = (download.locate(registry.resolve(name)) for name in (args.target, args.draft))
    calls: list[tuple] = []  # (function, arguments, keywords) of each outermost piece, for the replay
    cold = 0.0
    depth = 0  # pieces call pieces (_tokens_for calls spell): only the outermost is timed

    def recorded(function, name):
        def timed(*a, **k):
            nonlocal cold, depth
            if depth:
                return function(*a, **k)
            depth += 1
            try:
                started = perf_counter()
                result = function(*a, **k)
                cold += perf_counter() - started
            finally:
                depth -= 1
            if name == "_agreed":  # what it reads of the drafter, as it was
                me = a[0]
                a = (SimpleNamespace(_held=bytearray(me._held), _ends=list(me._ends), _sure=me._sure), *a[1:])
            calls.append((function, tuple(copy(x) if isinstance(x, (bytearray, list)) else x for x in a), k))
            return result
        return timed

    for owner, name in PIECES:
        setattr(owner, name, recorded(getattr(owner, name), name))
    runtime = Runtime(threads=default_threads(), ctx_size=4096)
    with Session(target, draft, runtime, Speculation(DrafterKind.DRAFT)) as session:
        prompts = bench.load_prompts(args.set, args.limit)
        print(f"{args.draft} drafting for {args.target}, {args.set} x {len(prompts)}, up to {args.max_tokens} tokens")
        for sampling in (Sampling(temperature=0.0), Sampling(temperature=0.8, seed=1)):
            calls.clear()
            cold = 0.0
            drafted = accepted = 0
            for prompt in prompts:
                request = Request(sampling, Limits(max_tokens=args.max_tokens), messages=list(prompt.messages))
                for event in session.generate(request):
                    if isinstance(event, Step):
                        drafted, accepted = drafted + event.drafted, accepted + event.accepted
            depth += 1  # the pieces the replayed ones call run as they are, neither timed nor recorded
            warm = min(replayed(calls) for _ in range(REPLAYS))
            depth -= 1
            print(f"T={sampling.temperature}: {drafted} drafted, {accepted / max(1, drafted):.0%} accepted;"
                  f" {len(calls)} calls; host work per drafted token {cold / max(1, drafted) * 1e6:.1f} us cold,"
                  f" {warm / max(1, drafted) * 1e6:.1f} us warm")


def replayed(calls: list[tuple]) -> float:
    started = perf_counter()
    for function, arguments, keywords in calls:
        function(*arguments, **keywords)
    return perf_counter() - started


if __name__ == "__main__":
    main()
