"""Replay the auto policy's n-gram choices on recorded generations, without a model.

    python scripts/replay.py record [--target qwen2.5-coder-1.5b] [--prompts all] [--limit 4]
                                    [--max-tokens 96] [-o replay.json]
    python scripts/replay.py simulate replay.json [--mixed]

`record` generates each prompt's greedy reply with the target alone and keeps the
token ids, with the verification costs the auto policy calibrates at load (or kept from an earlier
load on this machine; LOCALSPEC_RECALIBRATE=1 measures them anew).
`simulate` then runs the policy (n-gram lookup only: what a draft model would
have proposed is not recorded) over each recording: a draft is accepted as far
as it agrees with the recorded reply, which is what greedy verification does,
and each step costs what the recorded cost table says. It prints auto's and fixed
n-gram's modelled speed against plain decoding per prompt set.

Noise-free and in seconds, it tells policies apart where a real benchmark's
run-to-run spread (about 5% on these sets) would hide the difference; host
work and the machine's drift are left out, so its ratios are what the choices
are worth, not a measurement: `localspec bench` is the measurement.
"""

import argparse
import json
from pathlib import Path

from localspec import bench, download, registry
from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
from localspec.engine.drafters import Draft, Learner, NgramDrafter
from localspec.engine.policy import AutoDrafter, Costs
from localspec.events import Step, Token
from localspec.session import Session


def record(args) -> None:
    target = download.locate(registry.resolve(args.target))
    limits = Limits(max_tokens=args.max_tokens)
    recordings = {}
    with Session(target, None, Runtime(), Speculation(DrafterKind.AUTO)) as session:
        session.use(DrafterKind.AUTO)  # the cost table: calibrated, or kept from an earlier load
        costs = session.costs()
        session.use(DrafterKind.PLAIN)
        for name in bench.expand(args.prompts):
            recordings[name] = []
            for prompt in bench.load_prompts(name, args.limit):
                tokens = session.chat_tokens(bench.own_replies(session, prompt.messages, limits))
                session.reset()
                events = session.generate(tokens, Sampling(temperature=0), limits)
                reply = [event.id for event in events if isinstance(event, Token)]
                recordings[name].append({"prompt": tokens, "reply": reply})
                print(f"{name}: {len(tokens)} + {len(reply)} tokens")
    Path(args.output).write_text(json.dumps({"target": args.target, "costs": costs, "sets": recordings}))


class LlamaNgramSimple:
    """llama.cpp's ngram-simple with its defaults, as the anchor runs it: the latest earlier
    occurrence of the last 12 tokens, and the (up to) 48 tokens that followed it, always drafted."""

    kind = DrafterKind.NGRAM
    n, m = 12, 48

    def begin(self, prompt, sampling, rng) -> None:
        pass

    def propose(self, history, k) -> Draft:
        # llama.cpp searches the history without its last token, and wants n + m + 1 tokens of it
        searched = len(history) - 1
        if searched <= self.n + self.m + 1:
            return Draft()
        pattern = history[-self.n:]
        for start in range(searched - self.n - 1, 0, -1):
            if history[start : start + self.n] == pattern:
                copy = min(self.m, searched - (start + self.n))
                if copy < self.n:
                    return Draft()
                return Draft(history[start + self.n : start + self.n + min(copy, k)], source=self.kind)
        return Draft()


def replay(drafter, prompt: list[int], reply: list[int], costs: Costs, draft_max: int) -> tuple[float, list[Step]]:
    """Seconds the recorded reply takes with this drafter, by the cost table, and its steps."""
    drafter.begin(prompt, Sampling(temperature=0), None)
    history, seconds, steps = list(prompt), 0.0, []
    end = len(prompt) + len(reply)
    while len(history) < end:
        k = min(draft_max, end - len(history) - 1)
        draft = drafter.propose(history, k) if k > 0 else None
        tokens = draft.tokens if draft else []
        written = reply[len(history) - len(prompt):]
        accepted = next((i for i, (a, b) in enumerate(zip(tokens, written)) if a != b), len(tokens))
        verify = costs.verify_seconds(len(tokens) + 1)
        probe = draft.probe if draft else None
        step = Step(draft.source if draft else DrafterKind.PLAIN, len(tokens), accepted, 0.0, verify,
                    probe=probe is not None, plain_seconds=probe.plain_seconds if probe else 0.0)
        if isinstance(drafter, Learner):
            drafter.observe(step)
        steps.append(step)
        seconds += verify
        history += written[: accepted + 1]
    return seconds, steps


def simulate(args) -> None:
    recorded = json.loads(Path(args.recording).read_text())
    table = recorded["costs"]

    def fresh_costs() -> Costs:
        # the table stays fixed: every step takes exactly what it predicts
        return Costs(table["verify_1_ms"] / 1e3, {int(n): r for n, r in table["verify_relative"].items()})

    speculation = Speculation(DrafterKind.AUTO)
    ngram = NgramDrafter(speculation.ngram_min, speculation.ngram_max)
    auto = AutoDrafter(ngram, [], fresh_costs())
    print("| prompt set | tokens | fixed n-gram / plain | llama.cpp ngram-simple / plain | auto / plain"
          " | auto n-gram steps | drafted | accepted |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, recordings in recorded["sets"].items():
        if not args.mixed:
            auto.forget()
        plain = fixed = simple = automatic = 0.0
        tokens = drafting_steps = drafted = accepted = 0
        for item in recordings:
            prompt, reply = item["prompt"], item["reply"]
            tokens += len(reply)
            plain += len(reply) * auto.costs.verify_seconds(1)
            fixed += replay(ngram, prompt, reply, fresh_costs(), speculation.draft_limit(DrafterKind.NGRAM))[0]
            simple += replay(LlamaNgramSimple(), prompt, reply, fresh_costs(), LlamaNgramSimple.m)[0]
            seconds, steps = replay(auto, prompt, reply, auto.costs, speculation.draft_limit(DrafterKind.AUTO))
            automatic += seconds
            drafting = [step for step in steps if step.drafted]
            drafting_steps += len(drafting)
            drafted += sum(step.drafted for step in drafting)
            accepted += sum(step.accepted for step in drafting)
        print(f"| {name} | {tokens} | {plain / fixed:.2f}x | {plain / simple:.2f}x | {plain / automatic:.2f}x | {drafting_steps} | {drafted}"
              f" | {accepted} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    recorder = commands.add_parser("record", help="generate and keep greedy replies and the cost table")
    recorder.add_argument("--target", default="qwen2.5-coder-1.5b")
    recorder.add_argument("--prompts", default="all", help="prompt sets as for localspec bench (default: all)")
    recorder.add_argument("--limit", type=int, default=4)
    recorder.add_argument("--max-tokens", type=int, default=96)
    recorder.add_argument("-o", "--output", default="replay.json")
    simulator = commands.add_parser("simulate", help="replay the policy over a recording")
    simulator.add_argument("recording")
    simulator.add_argument("--mixed", action="store_true", help="auto keeps what it learned from set to set")
    args = parser.parse_args()
    record(args) if args.command == "record" else simulate(args)


if __name__ == "__main__":
    main()
