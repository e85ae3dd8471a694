"""Speedups on another device, predicted from acceptance measured here and that device's cost curve.

    python scripts/predict_gpu.py RECORDING --device REPORT.json [--target-shape qwen2.5-1.5b-shaped]
                                  [--mixed] [--json]

RECORDING is what `scripts/replay.py record` wrote: greedy replies of a real target and, along
them, what its draft model would propose. For greedy decoding, which drafted tokens the target
accepts does not depend on the hardware; only what a step costs does. REPORT.json is what
scripts/accelerator-report wrote on the device (docs/examples/example-device-report.json is an
illustrative curve until a device has been measured): the target shape standing in for the
recording's target (its verification curve, and its draft's token cost) prices each step. Every
prompt set is replayed with plain decoding, fixed n-gram lookup, the suffix cache of the set's earlier
replies, the prompt's prediction (where the set has them), the draft model (the engine's default
length and p_min) and auto (every drafter it has with a draft model, choosing by the device's costs,
so its choices are the ones it would make there). Prints a markdown table of predicted tokens/s
against plain decoding, the acceptance behind it, and a paragraph on the method.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path
from time import perf_counter

from localspec.config import DrafterKind, Speculation
from localspec.engine.drafters import Learner, NgramDrafter, NoDrafter, PredictionDrafter, SuffixDrafter
from localspec.engine.costs import Costs, DraftCosts
from localspec.engine.drafters.spec import draft_limit
from localspec.engine.policy import AutoDrafter
from localspec.engine.suffix import SuffixCache

sys.path.insert(0, str(Path(__file__).parent))
from replay import RecordedDraftModel, chain_lengths, replay  # noqa: E402

QWEN_SHAPE = "qwen2.5-1.5b-shaped"  # the report's stand-in for Qwen2.5-Coder-1.5B with its 0.5B draft
POSITIONS = 4  # draft positions whose acceptance the tables show
CATCH_UP_BATCH = 32  # the draft's batch costs.calibrate times for its catch-up cost a token
COLUMNS = [DrafterKind.NGRAM, DrafterKind.SUFFIX, DrafterKind.PREDICTION, DrafterKind.DRAFT, DrafterKind.AUTO]
HEADINGS = {DrafterKind.NGRAM: "n-gram", DrafterKind.SUFFIX: "suffix", DrafterKind.PREDICTION: "prediction",
            DrafterKind.DRAFT: "draft model", DrafterKind.AUTO: "auto"}


def device_costs(report: dict, shape: str, where: str) -> Costs:
    """The cost table auto would hold on the device: verify(1) and the curve as measured, the draft model's
    token as measured (where the report's draft stage ran), and its catch-up a token as calibrate() times
    it, a batch of CATCH_UP_BATCH over as many tokens, which the report does not time: taken to be a draft
    token times the target curve's verify(n) / n there."""
    targets = report.get("targets")
    if not isinstance(targets, dict) or shape not in targets:
        raise SystemExit(f"{where} has no {shape} target (it has: {', '.join(targets or {}) or 'none'});"
                         " name one with --target-shape")
    section = targets[shape]
    if "verify" not in section:
        raise SystemExit(f"{where}: {shape} has no verification curve (its plain stage did not run)")
    try:
        ratios = {int(n): float(ratio) for n, ratio in section["verify"]["ratios"].items()}
        costs = Costs(float(section["verify"]["seconds_1"]), ratios)
        costs.reshape, costs.recapture = changing_of(section)
        if "draft_cost" in section:
            token = float(section["draft_cost"]["token_cost"])
            batch = costs.verify_seconds(CATCH_UP_BATCH) / costs.level / CATCH_UP_BATCH
            costs.drafts[DrafterKind.DRAFT] = DraftCosts(token, token * batch)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise SystemExit(f"{where}: {shape}'s verify or draft_cost is not as scripts/accelerator-report writes it"
                         f" ({type(error).__name__}: {error})") from None
    return costs


def changing_of(section: dict) -> tuple[float, float]:
    """What a change of batch size costs relative to verify(1) (Costs.reshape, Costs.recapture): as auto
    calibrated both on the device, where the report has them (stage (f)'s costs after a generation, else
    stage (h)'s calibration); else the median of stage (f)'s verify(k) just after another size less held
    for the reshape, and for the recapture what auto calibrated for the two together (reports of
    2026-11-27, 03:00 UTC) less that, or none."""
    calibrated = section.get("auto_costs", {})
    if "recapture" in calibrated:
        return float(calibrated["reshape"]), float(calibrated["recapture"])
    if "recapture" in section.get("policy", {}):
        return float(section["policy"]["reshape"]), float(section["policy"]["recapture"])
    verify = section.get("gap", {}).get("verify_ms")
    if not verify:
        return 0.0, 0.0
    level_ms = float(section["verify"]["seconds_1"]) * 1e3
    reshape = statistics.median(verify["changed"][k] - verify["held"][k] for k in verify["held"]) / level_ms
    return reshape, max(0.0, float(calibrated.get("reshape", reshape)) - reshape)


def acceptance_by_position(runs: list[list[int]], positions: int) -> list[float | None]:
    """P(draft position n is accepted | the positions before it were), n = 1 .. positions, over drafts
    started at every reply position with room for n tokens, from each reply's chain_lengths."""
    rates = []
    for n in range(1, positions + 1):
        tried = sum(run >= n - 1 for lengths in runs for run in lengths[: len(lengths) - n + 1])
        accepted = sum(run >= n for lengths in runs for run in lengths[: len(lengths) - n + 1])
        rates.append(accepted / tried if tried else None)
    return rates


class Tally:
    """One column's replays over a prompt set: seconds, and its drafting steps by the drafter that drafted
    (a prompt's prediction drafts in every column)."""

    def __init__(self):
        self.seconds = 0.0
        self.prompt_seconds = 0.0  # the draft model reading prompts beside the target (prefill, not in seconds)
        self.by: dict[str, dict[str, int]] = {}  # drafter -> steps, drafted, accepted
        self.shapes: list[tuple[int, int]] = []  # (drafted, accepted) of every step, plain ones included
        self.host_seconds = 0.0  # the drafter's own work, timed here (auto's column only)

    def add(self, seconds: float, steps) -> None:
        self.seconds += seconds
        for step in steps:
            self.shapes.append((step.drafted, step.accepted))
            if step.drafted:
                counts = self.by.setdefault(step.drafter, {"steps": 0, "drafted": 0, "accepted": 0})
                counts["steps"] += 1
                counts["drafted"] += step.drafted
                counts["accepted"] += step.accepted


class Timed:
    """A drafter whose own host work (its proposals and what it learns from each step) is timed as it is
    replayed: with nothing decoded between steps, as on a device whose decode leaves the host's caches alone
    (on this CPU each decode streams the weights through them, and what runs next runs cold)."""

    def __init__(self, drafter):
        self.drafter, self.seconds = drafter, 0.0

    def begin(self, prompt, sampling, rng) -> None:
        self.drafter.begin(prompt, sampling, rng)

    def propose(self, history, k):
        started = perf_counter()
        draft = self.drafter.propose(history, k)
        self.seconds += perf_counter() - started
        return draft

    def observe(self, step) -> None:
        if isinstance(self.drafter, Learner):
            started = perf_counter()
            self.drafter.observe(step)
            self.seconds += perf_counter() - started


def fixed_drafter(kind: DrafterKind, item: dict, costs: Costs, cache: SuffixCache, speculation: Speculation):
    """A column's drafter, fresh for a recorded generation (the prediction's column: nothing, which the
    prompt's prediction then wraps)."""
    if kind == DrafterKind.DRAFT:
        model = RecordedDraftModel(costs, speculation.p_min)
        model.follow(item)
        return model
    return {DrafterKind.NGRAM: lambda: NgramDrafter(speculation.ngram_min, speculation.ngram_max),
            DrafterKind.SUFFIX: lambda: SuffixDrafter(cache), DrafterKind.PREDICTION: NoDrafter}[kind]()


def predict(recording: dict, device: dict, shape: str, where: str, mixed: bool = False, blind: bool = False) -> dict:
    """Per prompt set: plain decoding's seconds on the device, each drafter's, and the acceptance behind them.
    blind: auto weighs its steps as if a change of batch size cost nothing (as before 2026-11-27), while
    each step still costs what it does."""
    speculation = Speculation(DrafterKind.AUTO)
    has_draft = bool(device_costs(device, shape, where).drafts)
    columns = [kind for kind in COLUMNS if kind != DrafterKind.DRAFT or has_draft]
    cache = SuffixCache()
    auto = None
    sets = {}
    for name, items in recording["sets"].items():
        if not mixed or auto is None:  # a fresh session's: nothing learned, no earlier replies
            costs = device_costs(device, shape, where)
            if blind:
                costs.reshape = costs.recapture = 0.0
            costly = [RecordedDraftModel(costs, speculation.p_min)] if has_draft else []
            auto = AutoDrafter(NgramDrafter(speculation.ngram_min, speculation.ngram_max), costly, costs,
                               SuffixDrafter(cache))
            cache.clear()
        predicted = any("prediction" in item for item in items)
        tallies = {kind: Tally() for kind in columns if kind != DrafterKind.PREDICTION or predicted}
        plain = 0.0
        for item in items:
            prompt, reply = item["prompt"], item["reply"]
            plain += replay(NoDrafter(), prompt, reply, device_costs(device, shape, where), 0)[0]  # its changes of size too
            for model in auto.costly.values():
                model.follow(item)
            for kind, tally in tallies.items():
                costs = auto.costs if kind == DrafterKind.AUTO else device_costs(device, shape, where)
                drafter = auto if kind == DrafterKind.AUTO else fixed_drafter(kind, item, costs, cache, speculation)
                reader = auto.costly.get(DrafterKind.DRAFT) if kind == DrafterKind.AUTO else (
                    drafter if kind == DrafterKind.DRAFT else None)
                limit = draft_limit(speculation, kind)
                if "prediction" in item:  # a prompt's prediction drafts in every mode, as bench runs it
                    drafter = PredictionDrafter(item["prediction"], drafter, limit)
                    limit = draft_limit(speculation, DrafterKind.PREDICTION)
                timed = Timed(drafter) if kind == DrafterKind.AUTO else None
                charged = device_costs(device, shape, where)
                tally.add(*replay(timed or drafter, prompt, reply, costs, limit, charged=charged))
                tally.host_seconds += timed.seconds if timed else 0.0
                if reader is not None:
                    tally.prompt_seconds += charged.catch_up_seconds(DrafterKind.DRAFT, reader.prompt_read)
            cache.add(prompt[-cache.depth :] + reply)  # as a session keeps each finished generation
        runs = [chain_lengths(item["draft"]["likeliest"], item["reply"]) for item in items]
        sure = [p >= speculation.p_min for item in items for p in item["draft"]["sure"]]
        sets[name] = {
            "prompts": len(items), "tokens": sum(len(item["reply"]) for item in items), "plain_seconds": plain,
            "seconds": {kind: tally.seconds for kind, tally in tallies.items()},
            "prompt_seconds": {kind: tally.prompt_seconds for kind, tally in tallies.items()},
            "speedups": {kind: plain / tally.seconds for kind, tally in tallies.items()},
            "drafting": {kind: tally.by for kind, tally in tallies.items()},
            "auto_host_seconds_a_step": (tallies[DrafterKind.AUTO].host_seconds
                                         / max(1, len(tallies[DrafterKind.AUTO].shapes))),
            # what that host work would add to auto's predicted time there (a long copy's step is many tokens' worth)
            "auto_host_share": tallies[DrafterKind.AUTO].host_seconds / tallies[DrafterKind.AUTO].seconds,
            "shapes": {kind: tally.shapes for kind, tally in tallies.items()},
            "draft_model": {"acceptance_by_position": acceptance_by_position(runs, POSITIONS),
                            "sure": sum(sure) / len(sure) if sure else None},
        }
    return sets


def ngram_offers(items: list[dict]) -> list[list]:
    """What n-gram lookup offers auto at each position of the set's replies, one after another: [tokens
    offered, how many of them the reply has next, how far the match runs back, the agreement of earlier
    occurrences], or [] where it finds nothing (the accelerator report's stage (h) offers the same on
    its own answer)."""
    speculation = Speculation(DrafterKind.AUTO)
    k = draft_limit(speculation, DrafterKind.AUTO)
    offers = []
    for item in items:
        ngram = NgramDrafter(speculation.ngram_min, speculation.ngram_max)
        ngram.begin(item["prompt"], None, None)
        reply = item["reply"]
        for position in range(len(reply)):
            draft = ngram.propose(item["prompt"] + reply[:position], min(k, len(reply) - position - 1))
            ahead = reply[position:]
            agreed = next((i for i, (a, b) in enumerate(zip(draft.tokens, ahead)) if a != b), len(draft.tokens))
            offers.append([len(draft.tokens), agreed, draft.run, str(draft.evidence.agreement)] if draft.tokens else [])
    return offers


def pooled(sets: dict) -> dict:
    """Every set together: all plain seconds over all of each drafter's (sets without a drafter left out)."""
    out = {}
    for kind in COLUMNS:
        having = [s for s in sets.values() if s["speedups"].get(kind) is not None]
        if having:
            out[kind] = sum(s["plain_seconds"] for s in having) / sum(s["seconds"][kind] for s in having)
    return out


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def _rate(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def _share(counts: dict | None) -> str:
    if not counts or not counts["drafted"]:
        return ""
    return f"{counts['accepted'] / counts['drafted']:.0%} of {counts['drafted']}"


def _together(by: dict) -> dict:
    return {key: sum(counts[key] for counts in by.values()) for key in ("steps", "drafted", "accepted")}


def markdown(sets: dict, recording: dict, device: dict, shape: str, where: str) -> str:
    """The predicted speedups, the acceptance behind them, and the method in a paragraph."""
    costs = device_costs(device, shape, where)
    named = f"{device.get('device', 'the device')} ({where}, {device.get('date', 'undated')})"
    headings = " | ".join(HEADINGS[kind] for kind in COLUMNS)
    lines = [f"*Predicted* tokens/s against plain decoding on {named}, from acceptance measured here:", "",
             f"| prompt set | prompts | tokens | {headings} |", "|---|---:|---:|" + "---:|" * len(COLUMNS)]
    for name, s in sets.items():
        ratios = " | ".join(_ratio(s["speedups"].get(kind)) for kind in COLUMNS)
        lines.append(f"| {name} | {s['prompts']} | {s['tokens']} | {ratios} |")
    together = pooled(sets)
    lines.append(f"| all sets | {sum(s['prompts'] for s in sets.values())} | {sum(s['tokens'] for s in sets.values())}"
                 f" | {' | '.join(_ratio(together.get(kind)) for kind in COLUMNS)} |")
    host = ", ".join(f"{name} {s['auto_host_seconds_a_step'] * 1e6:.0f} us ({s['auto_host_share']:.1%})"
                     for name, s in sets.items())
    most = max(s["auto_host_seconds_a_step"] for s in sets.values()) if sets else 0.0
    lines += ["", "Auto's own host work a step (its policy and its drafters, the draft model's recorded stand-in"
              " among them, timed in its replay on this machine's CPU with nothing decoded between steps; not in the"
              " ratios above), and in parentheses what it would add to auto's predicted time on the device: "
              f"{host}; a step's at most {most / costs.level:.1%} of the device's verify(1) (a step that drafts a"
              " long copy weighs more lengths, and makes many tokens)."]
    lines += ["", "The acceptance behind it, measured here (the same on any device, greedy): the draft model's"
              " acceptance along the replies by draft position (each given the positions before it accepted) and how often it is"
              " sure enough to draft (p_min), each replayed drafter's accepted share of what it drafted (auto's:"
              " of all it drafted), and the steps auto drafted with each drafter:", "",
              f"| prompt set | draft model, positions 1-{POSITIONS} | sure | {headings} | auto drafted with |",
              "|---|---|---:|" + "---:|" * len(COLUMNS) + "---|"]
    for name, s in sets.items():
        model = s["draft_model"]
        positions = " / ".join(_rate(rate) for rate in model["acceptance_by_position"])
        sure = "" if model["sure"] is None else f"{model['sure']:.0%}"
        drafting = s["drafting"]
        shares = " | ".join(_share(_together(drafting[kind]) if kind == DrafterKind.AUTO else
                                   drafting.get(kind, {}).get(kind)) for kind in COLUMNS)
        steps = ", ".join(f"{kind} {counts['steps']}" for kind, counts in
                          sorted(drafting[DrafterKind.AUTO].items(), key=lambda pair: -pair[1]["steps"]))
        lines.append(f"| {name} | {positions} | {sure} | {shares} | {steps or 'nothing'} |")
    curve = ", ".join(f"{n}: {costs.verify_seconds(n) / costs.level:.2f}" for n in (2, 4, 8, 16, 32))
    if costs.drafts:
        draft = costs.drafts[DrafterKind.DRAFT]
        pricing = (f" a draft-model token costs {draft.token:.2f} of a target token, and its catch-up"
                   f" {draft.prefill_token:.3f} a token (assumed: a draft token times the curve's verify(n) / n at"
                   f" n = {CATCH_UP_BATCH}, the batch the engine's calibration times; the report does not time the"
                   " draft's batches);")
    else:
        pricing = (" the report has no draft cost (its draft stage did not run), so the draft model is left"
                   " out, of auto too;")
    note = f" The report notes: {device['note']}" if device.get("note") else ""
    read = {kind: sum(s["prompt_seconds"].get(kind, 0.0) for s in sets.values()) for kind in (DrafterKind.DRAFT,
                                                                                               DrafterKind.AUTO)}
    prefill = (" prefill: the target reads each prompt alike in every column, and the draft model reads it beside"
               f" the target in the draft model's column ({read[DrafterKind.DRAFT]:.2f} s over all sets, at its"
               f" catch-up cost) and in auto's where a draft with it would pay there ({read[DrafterKind.AUTO]:.2f} s),"
               f" against {sum(s['plain_seconds'] for s in sets.values()):.2f} s of plain decoding;"
               if costs.drafts else " prefill (the prompt is read before decoding in every column alike);")
    lengths = Speculation()
    lines += ["", f"*Method.* These are predictions, not measurements. The replies, and the draft model's proposals"
              f" along them, were recorded on this machine with the real models ({recording['target']} and its"
              f" draft {recording['draft']}, greedy, up to {recording['max_tokens']} tokens a reply); for greedy"
              " decoding a drafted token is accepted exactly when it is the target's own next token, whatever"
              " the hardware, so only the costs are the device's. Each prompt set is replayed step by step"
              " through each drafter and through auto's policy (scripts/replay.py), each step charged what"
              f" {named} measured for the {shape} target: verify(1) = {costs.level * 1e3:.2f} ms and verify(n) /"
              f" verify(1) = {curve};{pricing} auto chooses by those costs, as it would there. Fixed drafters"
              f" draft the engine's default lengths: n-gram {draft_limit(lengths, DrafterKind.NGRAM)} tokens, the draft"
              f" model {draft_limit(lengths, DrafterKind.DRAFT)} with p_min {lengths.p_min}, and up to"
              f" {draft_limit(lengths, DrafterKind.SUFFIX)} the suffix cache wherever it matches (the engine drafts"
              " from it only within auto) and the prediction alone (plain decoding elsewhere); a prompt's"
              " prediction drafts in every column, as in bench. The all-sets row is all plain time over all of a"
              " column's, over the sets the column has. Past a draft model's first miss it is taken to stay sure"
              " up to its length (the most that draft could cost). Left out: host time per step (auto's own is"
              " timed apart, above; sampling,"
              f" Python),{prefill} the machine's drift, and"
              " near-ties that a batched verification breaks otherwise than plain decoding (the replies are"
              f" plain decoding's).{note}"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recording", type=Path, help="what scripts/replay.py record wrote")
    parser.add_argument("--device", type=Path, required=True, help="a device report (scripts/accelerator-report's"
                        " report.json)")
    parser.add_argument("--target-shape", default=QWEN_SHAPE, help=f"the report's target that prices the steps"
                        f" (default: {QWEN_SHAPE})")
    parser.add_argument("--mixed", action="store_true", help="auto and the suffix cache keep what they learned"
                        " from set to set")
    parser.add_argument("--blind", action="store_true", help="auto weighs a change of batch size as free (as"
                        " before 2026-11-27); each step still costs what the device's report says")
    parser.add_argument("--json", action="store_true", help="the figures as JSON instead of the tables")
    parser.add_argument("--steps", type=Path, help="also write each set's replayed steps, (drafted, accepted) in"
                        " order per drafter, to this JSON file: scripts/accelerator-report --steps replays them"
                        " in the loop on the device (stage g)")
    args = parser.parse_args()
    recording, device = (_read(path) for path in (args.recording, args.device))
    if any("draft" not in item for items in recording.get("sets", {}).values() for item in items):
        raise SystemExit(f"{args.recording} holds no draft model's proposals: record it again with scripts/replay.py"
                         " record")
    sets = predict(recording, device, args.target_shape, str(args.device), args.mixed, args.blind)
    shapes = {name: s.pop("shapes") for name, s in sets.items()}
    if args.steps:
        args.steps.write_text(json.dumps({
            "recording": {key: recording.get(key) for key in ("target", "draft", "max_tokens", "limit")},
            "costs": {"report": str(args.device), "device": device.get("device"), "target_shape": args.target_shape},
            "sets": shapes, "ngram_offers": {name: ngram_offers(items) for name, items in recording["sets"].items()}},
            separators=(",", ":")))
    if args.json:
        print(json.dumps({"device": device.get("device"), "date": device.get("date"), "note": device.get("note"),
                          "report": str(args.device), "target_shape": args.target_shape,
                          "recording": {key: recording.get(key) for key in ("target", "draft", "max_tokens", "limit")},
                          "costs": device_costs(device, args.target_shape, str(args.device)).as_dict(),
                          "sets": sets, "all_sets": pooled(sets)}, indent=1))
    else:
        print(markdown(sets, recording, device, args.target_shape, str(args.device)), end="")


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except OSError as error:
        raise SystemExit(f"cannot read {path}: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise SystemExit(f"{path} is not JSON: {error.msg} at line {error.lineno}") from None


if __name__ == "__main__":
    main()
