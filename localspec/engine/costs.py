"""What a step costs: seconds for the target to verify n tokens in one batch and for each costly drafter to
draft, as the auto policy weighs them.

Costs come from a calibration at the first load (kept between runs by the session) and are
re-measured by every real step:
verify(1), the level everything else is relative to, follows each step's timing
(plain steps measure it for free), so a machine that gets busier or calmer moves
the policy at once; the shape of the cost curve follows the batch sizes used.

On a GPU a batch's cost depends on the sizes before it: ggml-cuda runs a decode whose batch size
differs from the last one's kernel by kernel (`reshape` more: on an H200 a 1.5B model's verify(1) took
1.7 ms held and 3.0-4.1 ms just after a verification of 4), captures a graph in the next decode of the
same size (`recapture` more), and replays it from the third on. Both are measured at calibration and
charged to the steps that pay them.
"""

from dataclasses import dataclass, field
from time import perf_counter

import numpy as np

from ..config import DrafterKind
from .backend import Context
from .drafters.spec import drafts_a_block

# Observed timings outside [1/CLIP, CLIP] x the prediction are clipped: one stall of the machine
# should not make every batch look slow.
CLIP = 2.0
LEVEL_RATE = 0.1  # weight of each step's timing in the cost level
SHAPE_RATE = 0.2  # weight of each step's timing in its batch size's relative cost
CALIBRATION_TOKEN = 1
# A measured reshape or recapture below this share of verify(1) is timing noise (a CPU rebuilds a changed
# graph in microseconds; SmolLM2-135M's decodes on a 2-core CPU read up to 0.13): taken as none, so that
# such machines weigh steps exactly as before.
RESHAPE_NOISE = 0.25


@dataclass
class DraftCosts:
    """What a drafter that runs a forward pass costs, relative to verify(1)."""

    token: float  # one drafted token (a block drafter: a pass of one position)
    prefill_token: float  # one token of a catch-up (a batch of what was decided since it last ran)


@dataclass
class Costs:
    """Seconds for the target to verify n tokens in one batch, and for each costly drafter (a draft
    model, the target's MTP block) to draft, kept as a level (verify(1)) times each operation's cost
    relative to it."""

    level: float  # verify(1)
    verify: dict[int, float]  # batch size -> verify(n) / verify(1)
    drafts: dict[DrafterKind, DraftCosts] = field(default_factory=dict)
    reshape: float = 0.0  # a decode whose batch size differs from the last one's costs this much more
    recapture: float = 0.0  # and the next decode of its size (where the one before that differed) this much

    def as_dict(self) -> dict:
        """For reports: verify(1) in ms, verify(n) / verify(1) by batch size, and each costly drafter's
        costs and a change of batch size's relative to verify(1)."""
        return {"verify_1_ms": self.level * 1e3, "verify_relative": dict(sorted(self.verify.items())),
                "drafts": {str(kind): {"token": d.token, "prefill_token": d.prefill_token}
                           for kind, d in self.drafts.items()}, "reshape": self.reshape, "recapture": self.recapture}

    @classmethod
    def from_dict(cls, data: dict) -> "Costs":
        """Costs as dataclasses.asdict wrote them, read back through JSON (whose keys are strings)."""
        return cls(float(data["level"]), {int(n): float(r) for n, r in data["verify"].items()},
                   {DrafterKind(kind): DraftCosts(float(d["token"]), float(d["prefill_token"]))
                    for kind, d in data["drafts"].items()}, float(data.get("reshape", 0.0)),
                   float(data.get("recapture", 0.0)))

    def __post_init__(self):
        # The curve's shape moves only when a batch of more than one token is timed; verify(1) moves
        # every step. So the shape is interpolated once per change, not at every look-up.
        self._relative: list[float] = []
        self.shape = 0  # counts the changes of the shape: what the policy's screens are kept against

    def relative(self, most: int) -> list[float]:
        """verify(n) / verify(1) for n = 1 .. most (or further)."""
        if len(self._relative) < most:
            self._relative = _interpolate_all(self.verify, most)
        return self._relative

    def verify_seconds(self, n: int, sizes: tuple[int | None, int | None] | None = None) -> float:
        """Seconds to verify n rows; with `sizes`, after batches of those sizes (verify_table says how)."""
        seconds = self.level * self.relative(n)[n - 1]
        return seconds + self.changing(n, sizes) if sizes and (self.reshape or self.recapture) else seconds

    def verify_table(self, most: int, sizes: tuple[int | None, int | None] | None = None) -> list[float]:
        """verify_seconds(n) for n = 1 .. most, in one sweep (the policy needs them every step); with
        `sizes`, the batch sizes of the two decodes before (the last one second; None: none yet), each
        with what a change of size costs it: a reshape at every size but the last one's."""
        level = self.level
        if not sizes or not (self.reshape or self.recapture):
            return [level * relative for relative in self.relative(most)[:most]]
        reshaped = level * self.reshape
        table = [level * relative + reshaped for relative in self.relative(most)[:most]]
        last = sizes[1]
        if last is not None and last <= most:
            table[last - 1] += self.changing(last, sizes) - reshaped
        return table

    def changing(self, n: int, sizes: tuple[int | None, int | None]) -> float:
        """Seconds more that a batch of n costs after batches of these sizes (the last one second) than
        after batches of its own size."""
        before, last = sizes
        return self.level * (self.reshape if n != last else self.recapture if n != before else 0.0)

    def draft_seconds(self, kind: DrafterKind, k: int) -> float:
        return self.level * self.drafts[kind].token * self._passes(kind, k) if kind in self.drafts else 0.0

    def draft_table(self, kind: DrafterKind, most: int) -> list[float]:
        """draft_seconds(kind, k) for k = 1 .. most, in one sweep (the policy weighs every length every step)."""
        if kind not in self.drafts:
            return [0.0] * most
        token = self.level * self.drafts[kind].token
        passes = self.relative(most + 1)[1 : most + 1] if drafts_a_block(kind) else range(1, most + 1)
        return [token * n for n in passes]

    def _passes(self, kind: DrafterKind, k: int) -> float:
        """What drafting k tokens costs in drafted tokens' worth: k passes of one token, or for a block
        drafter one pass of k + 1 positions, which costs what the target's batch of k + 1 does relative
        to one token (the nearest measure of this machine's batches at hand)."""
        return self.relative(k + 1)[k] if drafts_a_block(kind) else k

    def catch_up_seconds(self, kind: DrafterKind, tokens: int) -> float:
        return self.level * self.drafts[kind].prefill_token * tokens

    def observe_verify(self, n: int, seconds: float, sizes: tuple[int | None, int | None] | None = None) -> None:
        """Learn from a verification of n rows, taken after batches of these sizes (what a change cost
        is not the curve's)."""
        if sizes:
            seconds -= self.changing(n, sizes)
        relative = self.relative(n)[n - 1]
        level = min(max(seconds / relative, self.level / CLIP), self.level * CLIP)
        self.level += LEVEL_RATE * (level - self.level)
        if n > 1:
            self.verify[n] = relative + SHAPE_RATE * (min(max(seconds / self.level, relative / CLIP), relative * CLIP)
                                                      - relative)
            self._relative = []
            self.shape += 1

    def observe_draft(self, kind: DrafterKind, tokens: int, seconds: float) -> None:
        draft = self.drafts[kind]
        per_token = min(max(seconds / self._passes(kind, tokens) / self.level, draft.token / CLIP), draft.token * CLIP)
        draft.token += SHAPE_RATE * (per_token - draft.token)


def _interpolate_all(table: dict[int, float], most: int) -> list[float]:
    """table's value at n = 1 .. most: linear between its sizes, proportional to n beyond them."""
    sizes = sorted(table)
    out, below = [], 0
    for n in range(1, most + 1):
        while below + 1 < len(sizes) and sizes[below + 1] <= n:
            below += 1
        low = sizes[below]
        if n <= low or below + 1 == len(sizes):
            out.append(table[low] * n / low)
        else:
            high = sizes[below + 1]
            out.append(table[low] + (n - low) / (high - low) * (table[high] - table[low]))
    return out


def calibrate(target: Context, drafts: dict[DrafterKind, Context], max_batch: int) -> Costs:
    """Time a few target batches and each costly drafter's decodes on throwaway positions; leaves
    every cache empty."""
    # Powers of two: CPU and GPU matmul kernels work in tiles, so batch cost rises in steps that
    # end there (measured on a 2-core CPU: 4 tokens cost less than 3, 16 no more than 12), and
    # interpolating across a step hides its cheap end. The best of two runs each: a single timing
    # taken while the machine stalls would rule a size out until it is used again. Each after an
    # untimed one of its shape: on a GPU, a decode whose batch differs from the last one's runs
    # kernel by kernel and the next captures a graph, where later ones replay it (on an H200 a 1.5B
    # model's verify(1) took 1.7 ms held and 3.0 ms just after another size).
    sizes = [1 << i for i in range(max_batch.bit_length()) if 1 << i <= max_batch]
    seconds = {n: _time(lambda: target.decode([CALIBRATION_TOKEN] * n, logits="all"), target) for n in sizes}
    level = seconds[1]
    costs = Costs(level, {n: s / level for n, s in seconds.items()})
    if max_batch > 1:
        costs.reshape, costs.recapture = (extra / level if extra / level >= RESHAPE_NOISE else 0.0
                                          for extra in _changing_seconds(target, level))
    for kind, draft in drafts.items():
        def decode_draft(n: int, draft=draft) -> None:
            # an MTP block or EAGLE-3 drafter reads a hidden state with each token; a zero one costs the same
            hidden = np.zeros((n, draft.model.n_embd), np.float32) if draft.reads_hidden else None
            draft.decode([CALIBRATION_TOKEN] * n, logits="last", hidden=hidden)

        batch = min(32, draft.n_batch)
        costs.drafts[kind] = DraftCosts(_time(lambda: decode_draft(1), draft) / level,
                                        _time(lambda: decode_draft(batch), draft) / batch / level)
    return costs


def _changing_seconds(target: Context, held: float, repeats: int = 2) -> tuple[float, float]:
    """What a change of batch size costs beyond a held decode's `held` seconds (the best of `repeats`
    each): a decode of one row after one of two (reshape), and the one after it (recapture)."""
    best = [float("inf")] * 2
    for _ in range(repeats):
        target.truncate(0)
        target.decode([CALIBRATION_TOKEN] * 2, logits="all")
        for which in range(2):
            target.truncate(0)
            started = perf_counter()
            target.decode([CALIBRATION_TOKEN], logits="all")
            best[which] = min(best[which], perf_counter() - started - held)
    target.truncate(0)
    return best[0], best[1]


def _time(decode, context: Context, repeats: int = 2, unkept: int = 1) -> float:
    """The best of `repeats` timings of decode() on an empty cache, after `unkept` untimed ones."""
    best = float("inf")
    for run in range(unkept + repeats):
        context.truncate(0)
        started = perf_counter()
        decode()
        if run >= unkept:
            best = min(best, perf_counter() - started)
    context.truncate(0)
    return best
