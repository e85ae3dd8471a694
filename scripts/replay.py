"""Replay drafters and the auto policy on recorded generations, without a model.

    python scripts/replay.py record [--target qwen2.5-coder-1.5b] [--draft auto] [--prompts all] [--limit 4]
                                    [--max-tokens 96] [-o replay.json]
    python scripts/replay.py simulate replay.json [--mixed]
    python scripts/predict_gpu.py replay.json --device REPORT.json   (another device's speeds: see there)

`record` generates each prompt's greedy reply with the target alone and keeps the
token ids, with the verification costs the auto policy calibrates at load (or kept from an earlier
load on this machine; LOCALSPEC_RECALIBRATE=1 measures them anew), each prompt's prediction where its
set has one, and what the draft model (--draft; auto: the target's recommended one) would propose along
the reply: it reads prompt and reply teacher-forced, in batches, and keeps at each reply position its
likeliest token and that token's probability among its 10 likeliest (what a greedy draft judges p_min
on). A greedy draft started at any position is then accepted exactly as far as those tokens agree with
the reply, and where it stops unsure along the way is known (RecordedDraftModel).
`simulate` then runs the policy (n-gram lookup only) over each recording: a draft is accepted as far
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

import numpy as np

from localspec import bench

from localspec.store import download, registry
from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
from localspec.engine.backend import Context
from localspec.engine.drafters import GREEDY_DRAFT, Draft, Learner, NgramDrafter
from localspec.engine.costs import Costs
from localspec.engine.drafters.spec import draft_limit
from localspec.engine.policy import AutoDrafter
from localspec.engine.sampling import softmax
from localspec.errors import LocalspecError
from localspec.events import Step, Token
from localspec.request import Request
from localspec.session import Session


def record(args) -> None:
    resolved = registry.resolve(args.target)
    target = download.locate(resolved)
    draft = download.locate(registry.resolve_draft(args.draft, resolved))
    limits = Limits(max_tokens=args.max_tokens)
    recordings = {}
    recorded = {"target": args.target, "draft": draft.name, "max_tokens": args.max_tokens, "limit": args.limit,
                "sets": recordings}
    with Session(target, draft, Runtime(), Speculation(DrafterKind.AUTO)) as session:
        session.use(DrafterKind.AUTO)  # the cost table: calibrated, or kept from an earlier load
        recorded["costs"] = session.costs()
        session.use(DrafterKind.PLAIN)
        for name in bench.expand(args.prompts):
            recordings[name] = []
            for prompt in bench.load_prompts(name, args.limit):
                tokens = session.prompts.chat_tokens(bench.own_replies(session, prompt.messages, limits))
                session.reset()
                events = session.generate(Request(Sampling(temperature=0), limits, prompt=tokens))
                reply = [event.id for event in events if isinstance(event, Token)]
                likeliest, sure = draft_along(session.drafting.costly[DrafterKind.DRAFT].context, tokens, reply)
                item = {"prompt": tokens, "reply": reply, "draft": {"likeliest": likeliest, "sure": sure}}
                if prompt.prediction:
                    item["prediction"] = session.prompts.prediction_tokens(prompt.prediction)
                recordings[name].append(item)
                # written after every prompt: a run cut short keeps what it recorded
                Path(args.output).write_text(json.dumps(recorded))
                agreed = sum(a == b for a, b in zip(likeliest, reply))
                print(f"{name}: {len(tokens)} + {len(reply)} tokens, the draft's likeliest token agrees at {agreed}",
                      flush=True)


def draft_along(context: Context, prompt: list[int], reply: list[int]) -> tuple[list[int], list[float]]:
    """The draft model's likeliest token at each reply position, reading prompt and reply teacher-forced, and
    its probability among the 10 likeliest (as a greedy draft's p_min is judged); leaves the cache empty."""
    context.sample_with(GREEDY_DRAFT)
    context.truncate(0)
    context.decode(prompt[:-1], logits="none")
    rows = (prompt[-1:] + reply)[: len(reply)]  # the token before each reply token
    likeliest, sure = [], []
    for offset in range(0, len(rows), context.max_rows):
        chunk = rows[offset : offset + context.max_rows]
        context.decode(chunk, logits="all")
        for row in range(len(chunk)):
            q = softmax(*context.candidates(row))
            best = int(np.argmax(q.probs))
            likeliest.append(int(q.ids[best]))
            sure.append(float(q.probs[best]))
    context.truncate(0)
    return likeliest, sure


def chain_lengths(likeliest: list[int], reply: list[int]) -> list[int]:
    """At each reply position, how many of the draft's tokens from there on agree with the reply without a
    break: how far a greedy draft started there is accepted, unless p_min or its length stops it first."""
    lengths = [0] * (len(reply) + 1)
    for position in range(len(reply) - 1, -1, -1):
        lengths[position] = lengths[position + 1] + 1 if likeliest[position] == reply[position] else 0
    return lengths[:-1]


class RecordedDraftModel:
    """The draft model of a recording, drafting greedily along the target's path as it would have: while
    its likeliest token's probability is at least p_min, up to the draft's length. Past its first miss it
    would be reading its own wrong token, which the recording does not hold: it is taken to stay sure up to
    the draft's length (the most that draft could cost), its tokens there stand-ins verification never reaches.

    What it costs: n drafted tokens are n decodes (Costs.draft_seconds; the first reads the token committed
    last), and its Draft's catch_up_seconds hold the rest: one decode more where it stopped unsure, and
    whatever else its cache lacks at the catch-up rate a token (the prompt when auto first chooses it; a
    fully accepted draft's last token, as a draft of k feeds the draft model only its first k - 1)."""

    kind = DrafterKind.DRAFT

    def __init__(self, costs: Costs, p_min: float):
        self.costs, self.p_min = costs, p_min
        self.prompt_read = 0  # the prompt tokens it read beside the target (prefill, which replay() does not charge)

    def follow(self, item: dict) -> None:
        """Draft along this recorded generation from now on."""
        self.start = len(item["prompt"])
        self.reply = item["reply"]
        self.likeliest, self.sure = item["draft"]["likeliest"], item["draft"]["sure"]
        self.runs = chain_lengths(self.likeliest, self.reply)

    def begin(self, prompt, sampling, rng) -> None:
        """As fixed drafting (and auto where the draft model would pay): the prompt is read while the target
        reads it, before decoding starts."""
        self.agreed = self.cached = self.prompt_read = len(prompt)

    def prepare(self, sampling, rng) -> None:
        """As auto elsewhere: the first draft reads all it lacks."""
        self.agreed = self.cached = self.prompt_read = 0

    def behind(self, history: list[int]) -> int:
        """As ModelDrafter's: the tokens since it last drafted, at most (what auto weighs)."""
        return len(history) - self.agreed

    def propose(self, history: list[int], k: int) -> Draft:
        at = len(history) - self.start
        run = self.runs[at] if at < len(self.runs) else 0
        tokens, unsure = [], False
        for position in range(at, min(at + k, len(self.reply))):
            if position - at <= run and self.sure[position] < self.p_min:  # (judged where it reads the path)
                unsure = True
                break
            tokens.append(self.likeliest[position])
        fed = len(tokens) if unsure else max(0, len(tokens) - 1)
        read = len(history) - min(self.cached, len(history) - 1)  # its catch-up, the last committed token included
        level, token = self.costs.level, self.costs.drafts[self.kind].token
        catch_up = level * token * (1 + fed - len(tokens)) + self.costs.catch_up_seconds(self.kind, read - 1)
        self.agreed = len(history)
        self.cached = len(history) + min(fed, run)
        return Draft(tokens, source=self.kind, catch_up_seconds=catch_up)


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


def replay(drafter, prompt: list[int], reply: list[int], costs: Costs, draft_max: int,
           charged: Costs | None = None) -> tuple[float, list[Step]]:
    """Seconds the recorded reply takes with this drafter, by the cost table, and its steps. A costly
    drafter's draft costs its tokens (Costs.draft_seconds) and the catch-up its Draft names; a step whose
    batch size differs from the last one's, the table's reshape, and the next of that size its recapture.
    charged: verifications cost what this table says, not costs' (a policy weighing other costs)."""
    drafter.begin(prompt, Sampling(temperature=0), None)
    history, seconds, steps, sizes = list(prompt), 0.0, [], (None, None)
    learns = isinstance(drafter, Learner)
    end = len(prompt) + len(reply)
    while len(history) < end:
        k = min(draft_max, end - len(history) - 1)
        draft = drafter.propose(history, k) if k > 0 else Draft()
        tokens = draft.tokens
        written = reply[len(history) - len(prompt):]
        accepted = next((i for i, (a, b) in enumerate(zip(tokens, written)) if a != b), len(tokens))
        drafting = costs.draft_seconds(draft.source, len(tokens)) + draft.catch_up_seconds
        rows = len(tokens) + 1
        verify = (charged or costs).verify_table(rows, sizes)[rows - 1]
        sizes = (sizes[1], rows)
        probe = draft.probe
        step = Step(draft.source, len(tokens), accepted, drafting, verify, draft.catch_up_seconds,
                    probe=probe is not None, plain_seconds=probe.plain_seconds if probe else 0.0)
        if learns:
            drafter.observe(step)
        steps.append(step)
        seconds += drafting + verify
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
            fixed += replay(ngram, prompt, reply, fresh_costs(), draft_limit(speculation, DrafterKind.NGRAM))[0]
            simple += replay(LlamaNgramSimple(), prompt, reply, fresh_costs(), LlamaNgramSimple.m)[0]
            seconds, steps = replay(auto, prompt, reply, auto.costs, draft_limit(speculation, DrafterKind.AUTO))
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
    recorder = commands.add_parser("record", help="generate and keep greedy replies, the draft model's proposals"
                                                  " along them and the cost table")
    recorder.add_argument("--target", default="qwen2.5-coder-1.5b")
    recorder.add_argument("--draft", default="auto", help="the draft model (default: the target's recommended one)")
    recorder.add_argument("--prompts", default="all", help="prompt sets as for localspec bench (default: all)")
    recorder.add_argument("--limit", type=int, default=4)
    recorder.add_argument("--max-tokens", type=int, default=96)
    recorder.add_argument("-o", "--output", default="replay.json")
    simulator = commands.add_parser("simulate", help="replay the policy over a recording")
    simulator.add_argument("recording")
    simulator.add_argument("--mixed", action="store_true", help="auto keeps what it learned from set to set")
    args = parser.parse_args()
    try:
        record(args) if args.command == "record" else simulate(args)
    except LocalspecError as error:
        raise SystemExit(str(error)) from None


if __name__ == "__main__":
    main()
