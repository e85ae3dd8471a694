"""Speedups a cost curve predicts for a draft model, from the steps a `localspec bench` run recorded.

    python scripts/predict_from_bench.py BENCH.json [BENCH.json ...]
                                         [--device REPORT.json] [--target-shape qwen2.5-1.5b-shaped]

Each BENCH.json is what `localspec bench ... --modes plain,draft,... -o BENCH.json` wrote. Its `draft` rows
say, per prompt set, how many steps drafted, how many tokens they drafted and how many the target kept;
for greedy decoding which drafted tokens the target keeps does not depend on the hardware, so only what
a step costs is the device's. That works for every draft model, a cross-vocabulary one included (which
scripts/replay.py's recordings, teacher-forced in the target's token ids, cannot hold).

The model of a step, in target tokens' time: a step that drafted k tokens (k the run's mean) costs
verify(k + 1) of the curve and k passes of the draft (reading the target's token, then each drafted token
but the last), one more where the draft stopped unsure before its longest draft (the pass that showed it):
the run does not say how many did, so each figure is a range, from every step stopping so (the low end) to
none (the high end); a step that drafted nothing costs verify(1) and one draft pass. Against the run's own
CPU curve (the costs bench measured) the model is checked against the speedup the same run measured; on a device, its report's curve and draft token cost are used, the
draft's cost scaled by its layer count against the report's draft (on a GPU a small model's pass is
bound by the kernels it launches, a layer at a time, not by its width). Prints a markdown table.
"""

import argparse
import json
import math
from pathlib import Path

from localspec import store
from localspec.engine.costs import Costs


def curve_at(ratios: dict[int, float], n: float) -> float:
    """verify(n) / verify(1) as the engine reads its curve (Costs.relative: linear between the measured
    sizes, proportional to n beyond them), for a mean n between two sizes: linear between them."""
    table = Costs(1.0, ratios).relative(math.ceil(n))
    low = max(1, math.floor(n))
    return table[low - 1] + (n - low) * (table[math.ceil(n) - 1] - table[low - 1])


def predicted(row: dict, ratios: dict[int, float], draft_cost: float, unsure: int) -> float:
    """Tokens per target token's time, as plain decoding's 1.0, for a bench `draft` row; unsure: the draft
    passes a drafting step spends beyond one a drafted token (0 or 1)."""
    steps = sum(d["steps"] for d in row["drafters"].values())
    drafted = sum(d["drafted"] for d in row["drafters"].values())
    accepted = sum(d["accepted"] for d in row["drafters"].values())
    idle = max(0, row["tokens"] - accepted - steps)  # steps that drafted nothing: one token each
    k = drafted / steps
    cost = steps * (curve_at(ratios, k + 1) + (k + unsure) * draft_cost) + idle * (1 + draft_cost)
    return row["tokens"] / cost


def span(row: dict, ratios: dict[int, float], draft_cost: float) -> str:
    return f"{predicted(row, ratios, draft_cost, 1):.2f}-{predicted(row, ratios, draft_cost, 0):.2f}x"


def layers(name: str) -> int:
    """A draft model's layer count, from its header (bench names a registry model or a file)."""
    return store.header(store.here(name)).arch("block_count")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", nargs="+", type=Path)
    parser.add_argument("--device", type=Path)
    parser.add_argument("--target-shape", default="qwen2.5-1.5b-shaped")
    args = parser.parse_args()
    device = json.loads(args.device.read_text()) if args.device else None
    shape = device["targets"][args.target_shape] if device else None
    print("| prompt set | draft | accepted | tokens/step | measured here | predicted here |"
          + (f" predicted on {device['device']} |" if device else ""))
    print("|---|---|---|---|---|---|" + ("---|" if device else ""))
    for path in args.bench:
        run = json.loads(path.read_text())
        here = {int(n): r for n, r in run["costs"]["verify_relative"].items()}
        cost_here = run["costs"]["drafts"]["draft"]["token"]
        if shape:
            there = {int(n): r for n, r in shape["verify"]["ratios"].items()}
            cost_there = shape["draft_cost"]["token_cost"] * layers(run["draft"]) / shape["draft"]["n_layer"]
        for row in run["results"]:
            if row["mode"] != "draft" or not any(d["steps"] for d in row["drafters"].values()):
                continue
            if row.get("trees", {}).get("steps"):  # a tree's nodes are not a chain's k drafted tokens
                parser.error(f"{path}: its draft rows verified draft trees (--draft-branches); this model of a"
                             " step is of chains: bench again with --draft-branches 1")
            cells = [row["prompt_set"], run["draft"], f"{row['acceptance_rate']:.0%}",
                     f"{row['mean_accepted_length']:.2f}", f"{row['speedup']:.2f}x", span(row, here, cost_here)]
            if shape:
                cells.append(span(row, there, cost_there))
            print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
