"""The auto policy against an earlier revision of itself: the same choices, and its host time a step.

    python scripts/policy_ab.py [--against HEAD] [--model smollm2-135m] [--tokens 200] [--repeats 5]
                                [--engine] [--recording replies.json]

Records greedy replies of a real model alone (GSM8K questions, a code edit, a story), then replays
each through both policies side by side. Each step both are shown the same history and the same
verified Step: a draft is accepted as far as it agrees with the recorded reply (what greedy
verification does), and timed by a fixed cost table with seeded jitter, so that the costs move as in
a real run. A draft model stand-in agrees with the reply for a seeded number of tokens. Any difference
in a step's choice (drafter, tokens, probe) is printed and fails the run; cost tables of a CPU and of
a GPU (where the draft model and its probes are chosen) are both replayed.

Host time: propose + observe a step, the two policies interleaved (which goes first alternates),
medians over --repeats replays, split by whether the step drafted. --engine also times them inside
real generations (the model drafting for itself), the policies alternating generation by generation.
--recording keeps the replies in a file (read back if it exists) for the next run.
"""

import argparse
import importlib.util
import json
import random
import statistics
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from time import perf_counter_ns

from localspec import bench

from localspec.store import download, registry
from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
from localspec.engine import policy as current
from localspec.engine.costs import DraftCosts
from localspec.engine.drafters.spec import draft_limit
from localspec.engine.drafters import Draft, NgramDrafter
from localspec.events import Step, Token
from localspec.request import Request
from localspec.session import Session

GREEDY = Sampling(temperature=0)
PROMPTS = {
    "gsm8k": lambda: [prompt.messages for prompt in bench.load_prompts("gsm8k", 3)],
    "code edit": lambda: [prompt.messages for prompt in bench.load_prompts("humaneval-edit", 1)],
    "story": lambda: [[{"role": "user", "content": "Write a short story about a dragon who learns to cook."}]],
}
# verify(n) / verify(1) and a draft token / verify(1): the 2-core AMD EPYC with the Qwen pair
# (BENCHMARKS.md, 2026-11-25), and a GPU where verifying 16 more tokens costs almost nothing
TABLES = {"cpu": (0.0323, {1: 1.0, 2: 1.61, 4: 2.51, 8: 4.55, 16: 4.75, 32: 8.78}, 0.60),
          "gpu": (0.020, {1: 1.0, 16: 1.05, 32: 1.3}, 0.075)}
JITTER = 0.05  # relative spread of a step's timing around the table's


def policy_at(revision: str):
    """localspec.engine.policy as it was at a git revision, imported beside the current one."""
    source = subprocess.run(["git", "show", f"{revision}:localspec/engine/policy.py"], capture_output=True,
                            text=True, check=True).stdout
    name = f"localspec.engine._policy_{revision.replace('~', '_').replace('^', '_')}"
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "localspec.engine"
    sys.modules[name] = module
    exec(compile(source, f"{revision}:policy.py", "exec"), module.__dict__)
    return module


class StandIn:
    """A draft model that agrees with the recorded reply for a seeded number of tokens, then errs."""

    kind = DrafterKind.DRAFT

    def __init__(self, prompt: list[int], reply: list[int]):
        self.text = prompt + reply
        self.seen = 0

    def prepare(self, sampling, rng) -> None:
        self.seen = 0

    def behind(self, history) -> int:
        return len(history) - self.seen

    def propose(self, history, k) -> Draft:
        agree = int(random.Random(len(history)).expovariate(0.4))
        ahead = self.text[len(history) : len(history) + k]
        tokens = ahead[:agree] + [-1 - t for t in ahead[agree:]]
        self.seen = len(history) + len(tokens)
        return Draft(tokens, source=self.kind)


def record(model: str, tokens: int) -> dict[str, list[tuple[list[int], list[int]]]]:
    path = download.locate(registry.resolve(model))
    out = {}
    # one thread: the text is what matters here, and llama.cpp's threads crawl on a shared, busy machine
    with Session(path, None, Runtime(threads=1), Speculation(DrafterKind.PLAIN)) as session:
        for name, prompts in PROMPTS.items():
            out[name] = []
            for conversation in prompts():
                prompt = session.prompts.chat_tokens(conversation)
                reply = [e.id for e in session.generate(Request(GREEDY, Limits(max_tokens=tokens), prompt=prompt))
                         if isinstance(e, Token)]
                out[name].append((prompt, reply))
    return out


def replay(modules, table: str, prompt: list[int], reply: list[int], draft_max: int, first: int) -> tuple:
    """Both policies over one reply in lockstep: (steps, host ns per step for each, the first difference)."""
    level, relative, draft_token = TABLES[table]
    autos = []
    for module in modules:
        costs = module.Costs(level, dict(relative), {DrafterKind.DRAFT: DraftCosts(draft_token, draft_token / 4)})
        auto = module.AutoDrafter(NgramDrafter(2, 4), [StandIn(prompt, reply)], costs)
        auto.begin(prompt, GREEDY, None)
        autos.append(auto)
    truth = autos[0].costs.verify_seconds  # the table as first given: what every step is taken to cost
    history, end, steps = list(prompt), len(prompt) + len(reply), []
    spent = [[], []]
    jitter = random.Random(table)
    while len(history) < end:
        k = min(draft_max, end - len(history) - 1)
        drafts, nanoseconds = [None, None], [0, 0]
        order = (first, 1 - first) if len(steps) % 2 == 0 else (1 - first, first)
        for i in order:
            started = perf_counter_ns()
            drafts[i] = autos[i].propose(history, k) if k > 0 else Draft()
            nanoseconds[i] += perf_counter_ns() - started
        a, b = ((d.source, d.tokens, d.probe) for d in drafts)
        if a != b:
            return steps, spent, f"step {len(steps)} at {len(history)}: {a} against {b}"
        draft = drafts[0]
        n = len(draft.tokens)
        written = reply[len(history) - len(prompt) :]
        accepted = next((i for i, (x, y) in enumerate(zip(draft.tokens, written)) if x != y), n)
        seconds = truth(n + 1) * (1 + JITTER * jitter.gauss(0, 1))
        drafting = autos[0].costs.draft_seconds(draft.source, n) if draft.source == DrafterKind.DRAFT else 0.0
        step = Step(draft.source, n, accepted, drafting, seconds, probe=draft.probe is not None,
                    plain_seconds=draft.probe.plain_seconds if draft.probe else 0.0)
        for i in order:
            started = perf_counter_ns()
            autos[i].observe(step)
            nanoseconds[i] += perf_counter_ns() - started
        for i in (0, 1):
            spent[i].append((n > 0, nanoseconds[i]))
        steps.append(step)
        history += written[: accepted + 1]
    return steps, spent, None


def medians(samples: list[tuple[bool, int]]) -> tuple[float, float, int]:
    """Median microseconds of steps that drafted nothing, of those that drafted, and how many drafted."""
    plain = [ns for drafted, ns in samples if not drafted]
    drafting = [ns for drafted, ns in samples if drafted]
    return (statistics.median(plain) / 1e3 if plain else float("nan"),
            statistics.median(drafting) / 1e3 if drafting else float("nan"), len(drafting))


def engine(model: str, modules, labels, prompts: list[list[int]], tokens: int, repeats: int) -> None:
    """propose + observe inside real generations (the model as its own draft model), alternating policies."""
    path = download.locate(registry.resolve(model))
    with Session(path, path, Runtime(threads=1), Speculation(DrafterKind.AUTO)) as session:
        made = session.drafting.drafter
        autos = [made if module is current else module.AutoDrafter(made.ngram, list(made.costly.values()),
                                                                    module.Costs.from_dict(asdict(made.costs)))
                 for module in modules]
        spent = [[], []]
        for repeat in range(repeats):
            for prompt in prompts:
                for i in (0, 1) if repeat % 2 == 0 else (1, 0):
                    auto = autos[i]
                    auto.forget()
                    session.drafting.drafter = timed(auto, spent[i])
                    for _ in session.generate(Request(GREEDY, Limits(max_tokens=tokens), prompt=prompt)):
                        pass
        for label, samples in zip(labels, spent):
            plain, drafting, n = medians(samples)
            print(f"  engine, {label}: {plain:.1f} us a step that drafted nothing, {drafting:.1f} us one that"
                  f" drafted ({n} of {len(samples)})")


def timed(auto, spent: list):
    """auto with propose + observe timed into `spent` as (drafted, ns) a step."""
    propose, observe = auto.propose, auto.observe

    class Timed:
        kind = auto.kind

        def begin(self, prompt, sampling, rng):
            auto.begin(prompt, sampling, rng)

        def propose(self, history, k):
            started = perf_counter_ns()
            self.draft = propose(history, k)
            self.ns = perf_counter_ns() - started
            return self.draft

        def observe(self, step):
            started = perf_counter_ns()
            observe(step)
            spent.append((step.drafted > 0, self.ns + perf_counter_ns() - started))

    return Timed()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", default="HEAD", help="the git revision whose policy.py to compare with")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--engine", action="store_true", help="also time both inside real generations")
    parser.add_argument("--recording", help="a file to keep the recorded replies in, and to read them from")
    args = parser.parse_args()
    modules = [policy_at(args.against), current]
    labels = [args.against, "working tree"]
    kept = Path(args.recording) if args.recording else None
    if kept and kept.exists():
        recorded = json.loads(kept.read_text())
    else:
        recorded = record(args.model, args.tokens)
        if kept:
            kept.write_text(json.dumps(recorded))
    draft_max = draft_limit(Speculation(DrafterKind.AUTO))
    differences = 0
    for table in TABLES:
        for name, items in recorded.items():
            spent, drafted = [[], []], []
            for repeat in range(args.repeats):
                for prompt, reply in items:
                    steps, times, difference = replay(modules, table, prompt, reply, draft_max, repeat % 2)
                    if difference:
                        differences += 1
                        print(f"  {table}, {name}: DIFFERENT CHOICE, {difference}")
                    for i in (0, 1):
                        spent[i] += times[i]
                    if repeat == 0:
                        drafted += [(step.drafter, step.drafted, step.accepted) for step in steps if step.drafted]
            print(f"{table}, {name}: {sum(len(r) for _, r in items)} tokens, {len(drafted)} steps drafted"
                  f" ({sum(d for _, d, _ in drafted)} tokens, {sum(a for _, _, a in drafted)} accepted)")
            for label, samples in zip(labels, spent):
                plain, drafting, n = medians(samples)
                print(f"  {label}: {plain:.1f} us a step that drafted nothing, {drafting:.1f} us one that drafted")
    if args.engine:
        prompts = [prompt for items in recorded.values() for prompt, _ in items]
        engine(args.model, modules, labels, prompts, args.tokens, args.repeats)
    print("same choices at every step" if not differences else f"{differences} replays chose differently")
    sys.exit(1 if differences else 0)


if __name__ == "__main__":
    main()
