"""What scripts/accelerator-report measures, once llama.cpp is built and localspec can be imported: models
of real shapes with random weights, and each measurement side by side in one run (see that script)."""

import cProfile
import hashlib
import importlib.machinery
import importlib.util
import io
import json
import pstats
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path
from time import perf_counter

import gguf
import numpy as np

from localspec.store import gguf_meta, hardware
from localspec.store.placement import Placement
from localspec.bench import HostTime
from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation, default_threads
from localspec.engine import library
from localspec.engine.library import llama
from localspec.engine.backend import Context
from localspec.engine.devices import devices
from localspec.engine.drafters import RUN_LIMIT, Agreement, Draft, Evidence, NoDrafter, RunClass
from localspec.engine.drafters.spec import draft_limit
from localspec.engine.sampling import chain_for
from localspec.engine.speculative import generate
from localspec.engine.tree import Alternative, DraftTree
from localspec.events import Step, Token
from localspec.request import Request
from localspec.session import Session
from localspec.stats import Recorder

ROOT = Path(__file__).resolve().parents[1]
GREEDY = Sampling(temperature=0)
SAMPLED = Sampling(temperature=0.8, seed=0)  # and llama.cpp's top-k 40, top-p 0.95, min-p 0.05
CONTEXT = 1024  # the longest prompt, generation and verification batch fit
CONTROL = 3  # <unk>, <s>, </s>: their output rows are zero, so a random model never ends a generation early
QUANT = {"Q4_K": gguf.GGMLQuantizationType.Q4_K, "Q8_0": gguf.GGMLQuantizationType.Q8_0}
# The standard deviation of a block's weights is about this many times its scale d: Q8_0 holds uniform
# int8 (std 73.9); Q4_K's 6-bit scales and mins times 4-bit values, with dmin = 7.5 d so the mean is 0.
SPREAD = {"Q4_K": 257.0, "Q8_0": 73.9}
SHOWN_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # of the curve, in the markdown
CEILING_LENGTHS = (4, 8, 16, 32)
TREE_LENGTHS = (4, 8)  # a two-branch tree's depth: 9 and 17 rows, where a chain of 8 and 16 verifies as many
SETTLING = 3  # untimed runs at most, until a mode's own text is known
# draft lengths for the host fit, one a generation: a step's tokens are emitted after its Step event, so
# the host time measured up to the next Step holds the previous step's tokens; with lengths that vary
# within a generation, a short step after a long one carried the long one's tokens (a first H200 report
# put 135 us on a step that verifies one row, where a run of such steps takes ~40)
HOST_LENGTHS = (0, 1, 2, 4, 8, 16)
BENCH_TOKENS = 128  # llama-bench's tg128
FIRST = CONTROL + 256  # an ordinary token to decode where any will do
VERIFIED = 8  # drafted a step in the loop's timing (steps_in_the_loop)
RAW = "llama-bench's loop in Python, its settings"
OWN = "the session's own context (the one plain decoding uses)"
HELD_WARMUP = 3  # decodes of a shape before it is timed as held
STEADY_SIZES = (1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64)  # k of the held and changed verify(k) in (f)
ACCEPTANCES = (0.6, 0.8, 0.9)
FLOOR = 0.97  # auto against plain where nothing it drafts is accepted
WRITERS, QUIET_WRITERS = ("attn_output.weight", "ffn_down.weight"), 0.25
DRAFT_SHARPNESS = 16.0  # a draft's output layer against a matrix's usual scale: sure of its guesses
# What auto's n-gram beliefs call the strongest evidence: the answer's drafts are weighed as a long copy.
EVIDENCE = Evidence(max(RunClass), Agreement.AGREE)
PARALLEL = 4  # sequences generating at once in the parallel measurement (serve's and batch's auto)
# Real drafters' steps, (drafted, accepted), replayed on the device: scripts/predict_gpu.py --steps wrote them
# from the Qwen pair's recorded replies on this project's CPU, auto choosing by the H200's held curve.
REPLAYED_STEPS = ROOT / "docs" / "examples" / "replayed-steps.json"
REPORT_SCRIPT = ROOT / "scripts" / "accelerator-report"
REPLAYED_SETS = ("humaneval", "humaneval-edit", "mtbench-2turn")
REPLAYED_DRAFTERS = ("ngram", "auto")
FIXED_ROWS = (4, 9)  # verification lengths every step is padded to (drafts longer than rows - 1 cut to it)


def report_script():
    """scripts/accelerator-report as a module (its file name is no module's): its sizes and helpers."""
    loader = importlib.machinery.SourceFileLoader("accelerator_report", str(REPORT_SCRIPT))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# --- Models: real shapes, random weights

def tensor_plan(shape) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy shape, role) of every tensor in file order, as llama.cpp's qwen2 and llama architectures
    name them; role: "ones" (norms), "zeros" (biases), "matrix", and the final "output_norm" and "output"."""
    kv = shape.n_embd // shape.n_head * shape.n_head_kv
    plan = [("token_embd.weight", (shape.n_vocab, shape.n_embd), "matrix")]
    for layer in range(shape.n_layer):
        block = f"blk.{layer}"
        plan.append((f"{block}.attn_norm.weight", (shape.n_embd,), "ones"))
        for name, rows in (("attn_q", shape.n_embd), ("attn_k", kv), ("attn_v", kv)):
            plan.append((f"{block}.{name}.weight", (rows, shape.n_embd), "matrix"))
            if shape.architecture == "qwen2":
                plan.append((f"{block}.{name}.bias", (rows,), "zeros"))
        plan += [(f"{block}.attn_output.weight", (shape.n_embd, shape.n_embd), "matrix"),
                 (f"{block}.ffn_norm.weight", (shape.n_embd,), "ones"),
                 (f"{block}.ffn_gate.weight", (shape.n_ff, shape.n_embd), "matrix"),
                 (f"{block}.ffn_up.weight", (shape.n_ff, shape.n_embd), "matrix"),
                 (f"{block}.ffn_down.weight", (shape.n_embd, shape.n_ff), "matrix")]
    return plan + [("output_norm.weight", (shape.n_embd,), "output_norm"),
                   ("output.weight", (shape.n_vocab, shape.n_embd), "output")]


def quantized(rows: int, columns: int, quant: str, std: float, rng: np.random.Generator) -> np.ndarray:
    """Random blocks of `quant` whose weights spread about `std`: bytes, one row of blocks per matrix row."""
    per_block, size = gguf.GGML_QUANT_SIZES[QUANT[quant]]
    if columns % per_block:
        raise ValueError(f"{quant} needs rows of a multiple of {per_block} weights, not {columns}")
    blocks = rng.integers(0, 256, size=(rows * columns // per_block, size), dtype=np.uint8)
    d = std / SPREAD[quant]
    scales = [d, 7.5 * d] if quant == "Q4_K" else [d]
    blocks[:, : 2 * len(scales)] = np.frombuffer(np.array(scales, np.float16).tobytes(), np.uint8)
    return blocks.reshape(rows, -1)


def write_model(shape, folder: Path, seed: int, draft: bool = False) -> Path:
    """A GGUF of this shape with random weights, written tensor by tensor (an 8B model is 4.5 GB); kept
    and reused while the shape is the same.

    A target's text must not hang on near-ties: batched and single-token logits differ in their last
    bits, and where a random model's top two stood at 34.61 and 34.52 the text parted from the plain
    run's, so drafting the plain run's text failed from there on. Its output layer is its embeddings,
    permuted: the residual stream carries the last token's embedding, so the token it maps to wins by
    several standard deviations of the rest, and the text walks a random permutation of the vocabulary
    (nothing repeats for n-gram lookup to find). A draft's output layer is random and sharp: sure of
    guesses that are never right."""
    digest = hashlib.sha256(json.dumps([asdict(shape), seed, draft]).encode()).hexdigest()[:8]
    path = folder / f"{shape.name}-{digest}.gguf"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    say(f"writing {path.name}")
    partial = path.with_suffix(".partial")
    writer = gguf.GGUFWriter(str(partial), shape.architecture)
    writer.add_name(shape.name)
    writer.add_context_length(CONTEXT * 8)
    writer.add_embedding_length(shape.n_embd)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_block_count(shape.n_layer)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_freq_base(shape.rope_base)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M if shape.quant == "Q4_K" else gguf.LlamaFileType.MOSTLY_Q8_0)
    pieces = shape.n_vocab - CONTROL - 256
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
                          + [f"\u2581t{i}" for i in range(pieces)])
    writer.add_token_scores([0.0] * CONTROL + [-1000.0] * 256 + [-float(i) for i in range(pieces)])
    writer.add_token_types([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
                           + [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * pieces)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    plan = tensor_plan(shape)
    block, size = gguf.GGML_QUANT_SIZES[QUANT[shape.quant]]
    for name, dims, role in plan:
        if len(dims) == 1:  # norms and biases
            writer.add_tensor_info(name, dims, np.dtype(np.float32), dims[0] * 4)
        else:
            rows, columns = dims
            writer.add_tensor_info(name, (rows, columns // block * size), np.dtype(np.uint8),
                                   rows * columns // block * size, raw_dtype=QUANT[shape.quant])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    embeddings = None  # the first tensor's data, kept for the target's output layer
    for name, dims, role in plan:
        if role == "ones" or (role == "output_norm" and draft):
            writer.write_tensor_data(np.ones(dims, np.float32))
        elif role == "output_norm":  # logits of the tokens that lose spread about 1
            writer.write_tensor_data(np.full(dims, shape.n_embd**-0.5, np.float32))
        elif role == "zeros":
            writer.write_tensor_data(np.zeros(dims, np.float32))
        elif role == "output" and not draft:
            data = np.empty_like(embeddings)
            data[rng.permutation(shape.n_vocab)] = embeddings
            data[:CONTROL] = 0
            writer.write_tensor_data(data)
        else:
            rows, columns = dims
            # embeddings about 1, as a trained model's; a matrix keeps its input's scale, but those that
            # write into a target's residual stream leave the last token's embedding standing out in it
            std = 1.0 if name == "token_embd.weight" else columns**-0.5
            if not draft and name.endswith(WRITERS):
                std *= QUIET_WRITERS
            data = quantized(rows, columns, shape.quant, DRAFT_SHARPNESS * std if role == "output" else std, rng)
            if role == "output":
                data[:CONTROL] = 0
            if name == "token_embd.weight":
                embeddings = data
            writer.write_tensor_data(data)
    writer.close()
    partial.rename(path)
    return path


# --- Drafting with the answer known

class Oracle:
    """A free drafter that knows what the target will say (a plain run's output, `answer`): the ceiling
    of every drafter. It stops drafting where the text leaves the answer (batched logits can break a
    near-tie the other way), unless `stubborn`: then it proposes the answer's next tokens regardless.
    length: draft at most this many tokens a step (the host fit's rows)."""

    kind = DrafterKind.NGRAM  # free and deterministic, as n-gram lookup: auto weighs it as one

    def __init__(self, length: int | None = None, stubborn: bool = False):
        self.length, self.stubborn = length, stubborn
        self.answer: list[int] = []

    def begin(self, prompt, sampling, rng) -> None:
        self.expected = list(prompt) + self.answer
        self.agreed = len(prompt)  # the history agrees with the expected text this far

    def propose(self, history, k) -> Draft:
        while self.agreed < min(len(history), len(self.expected)) and history[self.agreed] == self.expected[self.agreed]:
            self.agreed += 1
        if self.agreed < len(history) and not self.stubborn:
            return Draft(source=self.kind)
        if self.length is not None:
            k = min(k, self.length)
        return Draft(self.expected[len(history) : len(history) + k], source=self.kind, evidence=EVIDENCE, run=RUN_LIMIT)


class ForkedAnswer(Oracle):
    """The ceiling of a draft tree of two branches: the answer's next k tokens as the runner-up (rank 2)
    beside a wrong chain of k tokens that the drafter bets on, so every step keeps k + 1 tokens only by
    the tree and verifies 2k + 1 rows."""

    branches = 2

    def propose(self, history, k) -> Draft:
        right = super().propose(history, k).tokens
        if not right:
            return Draft(source=self.kind)
        wrong = [FIRST + 1 if right[0] == FIRST else FIRST] * len(right)
        return Draft(wrong, source=self.kind, tree=DraftTree.forked(wrong, [Alternative(0, 2, tuple(right))]))


class Replayed:
    """A free drafter that proposes the answer in a recorded drafter's step shapes: at step i it drafts
    shapes[i]'s `drafted` tokens of which the first `accepted` are the answer's and the rest a token the
    target will not choose, so each step verifies as many rows and keeps as many tokens as the real one
    did (the shapes repeat when the answer is longer). rows: pad every step's draft (plain steps
    included) with wrong tokens to rows - 1, cutting longer drafts there: a verification length that
    never changes."""

    kind = DrafterKind.NGRAM

    def __init__(self, shapes: list[tuple[int, int]], rows: int | None = None):
        self.shapes, self.rows = shapes, rows
        self.answer: list[int] = []

    def begin(self, prompt, sampling, rng) -> None:
        self.expected = list(prompt) + self.answer
        self.step = 0

    def propose(self, history, k) -> Draft:
        drafted, accepted = self.shapes[self.step % len(self.shapes)]
        self.step += 1
        drafted = min(k, self.rows - 1 if self.rows else drafted)
        accepted = min(accepted, drafted)
        at = len(history)
        tokens = self.expected[at : at + accepted]
        following = self.expected[at + accepted] if at + accepted < len(self.expected) else None
        wrong = FIRST + 1 if following == FIRST else FIRST
        return Draft(tokens + [wrong] * (drafted - len(tokens)), source=self.kind, evidence=EVIDENCE, run=RUN_LIMIT)


class Offered:
    """n-gram lookup as auto met it in a real text: at each position of the answer, what lookup offered
    at that position of a recorded reply ([tokens, how many of them were right, how far the match ran
    back, the earlier occurrences' agreement], or nothing), spelled on the answer: its right tokens the
    answer's, the rest a token the target will not choose. Auto weighs and learns from it as from the
    real lookup, at this device's costs."""

    kind = DrafterKind.NGRAM

    def __init__(self, offers: list[list]):
        self.offers = offers
        self.answer: list[int] = []

    def begin(self, prompt, sampling, rng) -> None:
        self.expected = list(prompt) + self.answer
        self.start = len(prompt)

    def propose(self, history, k) -> Draft:
        offer = self.offers[(len(history) - self.start) % len(self.offers)]
        if not offer or not k:
            return Draft(source=self.kind)
        offered, right, run, agreement = offer
        drafted = min(offered, k)
        at = len(history)
        tokens = self.expected[at : at + min(right, drafted)]
        following = self.expected[at + len(tokens)] if at + len(tokens) < len(self.expected) else None
        wrong = FIRST + 1 if following == FIRST else FIRST
        return Draft(tokens + [wrong] * (drafted - len(tokens)), source=self.kind,
                     evidence=Evidence(RunClass.of(run), Agreement(agreement)), run=run)


# --- Measurements

def verification_curve(session: Session, prompt: list[int], most: int, repeats: int) -> dict[int, float]:
    """Seconds to verify k tokens after the prompt, k = 1 .. most, where the batch's shape holds still
    (shapes_held); the target samples greedy rows as a generation would (on the backend where the
    session does)."""
    session.target.sample_with(chain_for(GREEDY))
    return shapes_held(session.target, prompt, range(1, most + 1), repeats)


def shapes_held(context: Context, prompt: list[int], sizes, repeats: int) -> dict[int, float]:
    """Seconds (median of `repeats`) to verify k rows after the prompt, for each k of sizes, each size
    decoded over and over, as a loop that drafts k tokens a step does: a GPU replays the graph it
    captured for the shape (ggml-cuda keeps one graph a context; a batch of another shape sends the next
    two decodes kernel by kernel, the second capturing), so the first HELD_WARMUP are not kept."""
    return {k: statistics.median(_verified(context, prompt, [k] * (HELD_WARMUP + repeats))[HELD_WARMUP:])
            for k in sizes}


def shapes_changed(context: Context, prompt: list[int], sizes, repeats: int) -> dict[int, float]:
    """As shapes_held, each verification just after a decode of another shape."""
    return {k: statistics.median(_verified(context, prompt, [2 if k == 1 else 1, k] * repeats)[1::2]) for k in sizes}


def _verified(context: Context, prompt: list[int], sizes: list[int]) -> list[float]:
    """Seconds of each verification of sizes[i] rows after the prompt, each taken back at once."""
    context.truncate(0)
    context.decode(prompt, logits="none")
    batch = (prompt * (max(sizes) // len(prompt) + 1))[: max(sizes)]
    seconds = []
    for k in sizes:
        started = perf_counter()
        context.decode(batch[:k], logits="all")
        seconds.append(perf_counter() - started)
        context.truncate(len(prompt))
    context.truncate(0)
    return seconds


def token_seconds(session: Session, prompt: list[int], repeats: int) -> float:
    """The draft model's seconds for one token after the prompt (median of repeats)."""
    context = session.drafting.costly[DrafterKind.DRAFT].context
    context.truncate(0)
    context.decode(prompt, logits="none")
    seconds = []
    for _ in range(repeats + 1):
        started = perf_counter()
        context.decode(prompt[:1], logits="last")
        seconds.append(perf_counter() - started)
        context.truncate(len(prompt))
    context.truncate(0)
    return statistics.median(seconds[1:])


def predicted_speedup(ratios: dict[int, float], draft_cost: float, acceptance: float) -> tuple[float, int]:
    """(speedup over plain decoding, draft length) of the best fixed length k, for a drafter whose every
    token is accepted with probability `acceptance` independently and costs draft_cost single target tokens,
    where verifying n tokens costs ratios[n] single ones: E(k) / (k draft_cost + ratios[k + 1]), with
    E(k) = 1 + a + ... + a^k the tokens a step is expected to make."""
    best = (1.0, 0)
    for k in range(1, max(ratios)):
        expected = sum(acceptance ** i for i in range(k + 1))
        best = max(best, (expected / (k * draft_cost + ratios[k + 1]), k))
    return best


def fold(events, host: HostTime | None, session: Session) -> tuple[Recorder, list[int]]:
    """A generation's events folded, and the tokens it made; host: add each step's host time to it."""
    recorder, made = Recorder(), []
    for event in host.follow(events, session) if host else events:
        recorder.add(event)
        if isinstance(event, Token):
            made.append(event.id)
    return recorder, made


def run(session: Session, drafter, prompt: list[int], sampling: Sampling, draft_max: int, tokens: int,
        host: HostTime | None = None) -> tuple[Recorder, list[int]]:
    """One generation from empty caches with this drafter."""
    session.reset()
    speculation = Speculation(drafting=drafter.kind, draft_max=draft_max)
    events = generate(session.target, drafter, prompt, sampling, speculation, Limits(max_tokens=tokens))
    return fold(events, host, session)


def with_mode(session: Session, mode: DrafterKind, prompt: list[int], tokens: int, host: HostTime | None = None,
              sampling: Sampling = GREEDY, steps: list[Step] | None = None) -> tuple[Recorder, list[int]]:
    """One generation from empty caches in one of the session's own modes; steps: its Steps, in place of
    what the list held."""
    session.use(mode)
    session.reset()
    events = session.generate(Request(sampling, Limits(max_tokens=tokens), prompt=prompt))
    if steps is not None:
        steps.clear()
        events = kept_steps(events, steps)
    return fold(events, host, session)


def drafting_the_answer(generation, oracle: Oracle, answer: list[int]) -> Recorder:
    """generation() timed where the oracle drafts its own text. Batched logits can break a near-tie
    otherwise than single-token ones (write_model keeps the target's text clear of them), and from there
    an answer taken from plain decoding is wrong: untimed runs first replace it by what this mode makes,
    until that stops changing."""
    for _ in range(SETTLING):
        oracle.answer = answer
        recorder, made = generation()
        if made == answer:
            return recorder
        answer = made
    oracle.answer = answer
    return generation()[0]


class Speeds:
    """Generations folded per label: tokens/s over all of them, and how they drafted."""

    def __init__(self):
        self.records: dict[str, list[Recorder]] = {}

    def add(self, label: str, recorder: Recorder) -> None:
        self.records.setdefault(label, []).append(recorder)

    def speed(self, label: str) -> float:
        records = self.records[label]
        return sum(r.tokens for r in records) / sum(r.decode_seconds for r in records)

    def row(self, label: str) -> dict:
        records = self.records[label]
        steps, drafted = sum(r.steps for r in records), sum(r.drafted for r in records)
        by_drafter: dict[str, int] = {}
        for record in records:
            for kind, tally in record.drafters.items():
                by_drafter[str(kind)] = by_drafter.get(str(kind), 0) + tally.steps
        return {"tokens_per_second": self.speed(label), "vs_plain": self.speed(label) / self.speed("plain"),
                "tokens_per_pass": sum(r.decided for r in records) / steps if steps else 0.0,
                "acceptance": sum(r.accepted for r in records) / drafted if drafted else None,
                "steps_by_drafter": by_drafter}


def host_costs(session: Session, prompts: list[list[int]], tokens: int) -> dict:
    """Host microseconds a step and per further verified row, greedy and sampled, fitted over generations
    that each draft one of HOST_LENGTHS; and their share of a plain token's time."""
    out = {}
    for label, sampling in (("greedy", GREEDY), ("T=0.8", SAMPLED)):
        host, plain = HostTime(), Speeds()
        for prompt in prompts:
            recorder, answer = with_mode(session, DrafterKind.PLAIN, prompt, tokens, sampling=sampling)
            plain.add("plain", recorder)
            for length in HOST_LENGTHS:
                oracle = Oracle(length, stubborn=True)
                oracle.answer = answer
                run(session, oracle, prompt, sampling, max(HOST_LENGTHS), tokens, host)
        token = 1 / plain.speed("plain")
        per_step, per_row = host.per_step(), host.per_row()
        out[label] = {"us_per_step": per_step * 1e6, "us_per_row": per_row * 1e6 if per_row is not None else None,
                      "plain_token_ms": token * 1e3, "share_of_plain_token": per_step / token,
                      "sampled_on": "backend" if session.target.on_backend else "host"}
    return out


def against_llama_cpp(session: Session, model: Path, first: list[int], llama_bench: Path, repeats: int) -> dict:
    """localspec's plain decoding and llama-bench's tg on the same file and libraries: tokens/s, from an
    empty cache, BENCH_TOKENS tokens, same threads; localspec's runs before and after llama-bench's."""
    if not llama_bench.exists():
        return {"skipped": "llama-bench is not built here (scripts/accelerator-report --cpu --build builds it)"}
    ours = []
    for half in range(2):
        for _ in range(repeats):
            ours.append(with_mode(session, DrafterKind.PLAIN, first, BENCH_TOKENS)[0].summary().tokens_per_second)
        if half == 0:
            command = [str(llama_bench), "-m", str(model), "-p", "0", "-n", str(BENCH_TOKENS), "-r", str(repeats),
                       "-t", str(default_threads()), "-o", "json"]  # the threads localspec's Runtime runs
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                return {"skipped": f"llama-bench failed ({done.returncode}): {done.stderr.strip()[-500:]}"}
            theirs = json.loads(done.stdout)[0]
    samples = theirs.get("samples_ts") or [theirs["avg_ts"]]
    ours_median, theirs_median = statistics.median(ours), statistics.median(samples)
    return {"localspec_tokens_per_second": ours_median, "llama_bench_tokens_per_second": theirs_median,
            "ratio": ours_median / theirs_median, "localspec_runs": ours, "llama_bench_runs": samples,
            "llama_bench": {key: theirs.get(key) for key in ("build_commit", "backends", "gpu_info", "cpu_info",
                                                             "n_gpu_layers", "flash_attn", "n_threads")}}


def gap(session: Session, model: Path, llama_bench: Path, repeats: int) -> dict:
    """Where plain decoding's time goes against llama-bench's: BENCH_TOKENS one-token decodes as
    llama-bench's tg makes them, in a context with the session's target's settings and in ones with each
    setting as llama-bench has it (timed in turns: a drift of the device spreads over all of them);
    llama-bench with flash attention auto, off and on, and llama-bench's loop itself in Python; and, in
    the session's target's context, verify(k) where the batch's shape holds still and just after it
    changed (a GPU replays a captured graph only while it holds)."""
    target = session.target
    own = {"n_ctx": target.n_ctx, "n_batch": target.n_batch, "backend_sampling": target.backend_sampling,
           "max_outputs": target.max_rows}
    settings = {"the session's target": (own, True),
                "its tokens not read": (own, False),
                f"context of {BENCH_TOKENS} (llama-bench's)": ({**own, "n_ctx": BENCH_TOKENS}, True),
                "one output row (llama-bench's)": ({**own, "max_outputs": 1}, True),
                "sampled on the host": ({**own, "backend_sampling": False}, True),
                "all of llama-bench's": ({**own, "n_ctx": BENCH_TOKENS, "max_outputs": 1, "backend_sampling": False},
                                         False),
                "1 thread": ({**own, "threads": 1}, True),
                "4 threads": ({**own, "threads": min(4, default_threads())}, True),
                RAW: ({**own, "n_ctx": BENCH_TOKENS, "max_outputs": 1, "backend_sampling": False}, False)}
    contexts = {label: Context(session.target_model, **{"threads": default_threads(), **kwargs})
                for label, (kwargs, _) in settings.items()}
    target_context = contexts["the session's target"]
    try:
        # the session's own context beside a fresh one of its settings, and its plain generation, in the
        # same turns: whether what plain loses is the loop's or the context's (its earlier batches')
        runs: dict[str, list[float]] = {label: [] for label in (OWN, *settings)}
        plain = []
        for round_ in range(repeats + 1):  # the first round warms up and is not kept
            for label, context in {OWN: session.target, **contexts}.items():
                speed = raw_decodes(context) if label == RAW else one_token_decodes(
                    context, read=label == OWN or settings[label][1])
                if round_:
                    runs[label].append(speed)
            speed = with_mode(session, DrafterKind.PLAIN, [FIRST], BENCH_TOKENS)[0].summary().tokens_per_second
            if round_:
                plain.append(speed)
        out = {"settings": {label: {**settings.get(label, (own, True))[0], "read": settings.get(label, (own, True))[1],
                                    "tokens_per_second": statistics.median(speeds)}
                            for label, speeds in runs.items()},
               "localspec_plain": statistics.median(plain),
               "verify_ms": {label: {k: seconds * 1e3 for k, seconds in measured(
                   target_context, [FIRST] * 16, [k for k in STEADY_SIZES if k <= target_context.max_rows],
                   repeats).items()} for label, measured in (("held", shapes_held), ("changed", shapes_changed))}}
    finally:
        for context in contexts.values():
            context.close()
    if llama_bench.exists():
        command = [str(llama_bench), "-m", str(model), "-p", "0", "-n", str(BENCH_TOKENS), "-r", str(repeats),
                   "-t", str(default_threads()), "-fa", "auto,off,on", "-o", "json"]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            out["llama_bench"] = {"skipped": f"llama-bench failed ({done.returncode}): {done.stderr.strip()[-500:]}"}
        else:
            out["llama_bench"] = {f"flash attention {name}": statistics.median(entry.get("samples_ts") or [entry["avg_ts"]])
                                  for name, entry in zip(("auto", "off", "on"), json.loads(done.stdout))}
    else:
        out["llama_bench"] = {"skipped": "llama-bench is not built here"}
    return out


def raw_decodes(context: Context) -> float:
    """Tokens/s of llama-bench's tg loop itself, written in Python: llama_decode of a one-token batch and
    llama_synchronize, BENCH_TOKENS times from an empty cache, nothing else (what Python's calls cost
    beside the Context's own work)."""
    memory = llama.llama_get_memory(context._ctx)
    llama.llama_memory_clear(memory, True)
    token = (llama.llama_token * 1)(FIRST)
    started = perf_counter()
    for _ in range(BENCH_TOKENS):
        llama.llama_decode(context._ctx, llama.llama_batch_get_one(token, 1))
        llama.llama_synchronize(context._ctx)
    seconds = perf_counter() - started
    llama.llama_memory_clear(memory, True)
    return BENCH_TOKENS / seconds


def one_token_decodes(context: Context, read: bool) -> float:
    """Tokens/s of BENCH_TOKENS one-token decodes from an empty cache, each token read or not."""
    context.sample_with(chain_for(GREEDY))
    context.truncate(0)
    token = FIRST
    started = perf_counter()
    for _ in range(BENCH_TOKENS):
        context.decode([token], logits="last")
        if read:
            token = context.token(0)
    seconds = perf_counter() - started
    context.truncate(0)
    return BENCH_TOKENS / seconds


def steps_in_the_loop(session: Session, prompt: list[int], tokens: int, k: int) -> dict:
    """Milliseconds of the verifications (median) of the steps that drafted k tokens, in a generation that
    drafts the answer k at a time: what the loop's batches cost where their shape holds still."""
    oracle = Oracle()
    _, oracle.answer = with_mode(session, DrafterKind.PLAIN, prompt, tokens)
    session.reset()
    steps = [event for event in generate(session.target, oracle, prompt, GREEDY, Speculation(drafting=oracle.kind,
                                                                                             draft_max=k),
                                         Limits(max_tokens=tokens)) if isinstance(event, Step)]
    drafted_k = [step.verify_seconds for step in steps if step.drafted == k]
    return {"k": k, "steps": len(steps), "steps_that_drafted_k": len(drafted_k),
            "verify_ms": statistics.median(drafted_k) * 1e3 if drafted_k else None}


def ceiling(session: Session, prompts: list[list[int]], tokens: int, ratios: dict[int, float]) -> dict:
    """The answer drafted at each of CEILING_LENGTHS and under auto, against plain decoding, prompt by
    prompt; beside each, what the curve alone predicts: (k + 1) / verify(k + 1)."""
    speeds = Speeds()
    oracle = Oracle()
    session.use(DrafterKind.AUTO)
    session.forget()
    auto = session.drafting.drafter
    for prompt in prompts:
        session.remember_as("plain")  # the answer reaches auto through the oracle alone, not the suffix cache
        recorder, answer = with_mode(session, DrafterKind.PLAIN, prompt, tokens)
        speeds.add("plain", recorder)
        session.remember_as("auto")
        for k in CEILING_LENGTHS:
            speeds.add(f"answer k={k}", drafting_the_answer(
                lambda k=k, prompt=prompt: run(session, oracle, prompt, GREEDY, k, tokens), oracle, answer))
        auto.ngram = oracle  # auto with the answer as its free drafter, beside the draft model
        try:
            speeds.add("auto", drafting_the_answer(
                lambda prompt=prompt: with_mode(session, DrafterKind.AUTO, prompt, tokens), oracle, answer))
        finally:
            auto.ngram = session.drafting.ngram
    rows = {label: speeds.row(label) for label in speeds.records}
    for k in CEILING_LENGTHS:
        rows[f"answer k={k}"]["predicted"] = (k + 1) / ratios[k + 1] if k + 1 in ratios else None
    return rows


def tree_ceiling(session: Session, prompts: list[list[int]], tokens: int, ratios: dict[int, float]) -> dict:
    """The answer drafted as the second of two branches (ForkedAnswer) at TREE_LENGTHS, against plain
    decoding and the answer drafted as a chain, on a context of the target's with room for the tree,
    sampling where the session's does (on a GPU, in the decode graph: each branch by a sampler of its own).
    Beside each, what the curve predicts from rows alone: (k + 1) / verify(rows)."""
    target = session.target
    branching = Context(target.model, target.n_ctx, target.n_batch, default_threads(),
                        backend_sampling=target.backend_sampling, max_outputs=target.n_batch,
                        branches=ForkedAnswer.branches)
    speeds = Speeds()

    def on_branching(drafter, prompt: list[int], k: int) -> tuple[Recorder, list[int]]:
        branching.truncate(0)
        return fold(generate(branching, drafter, prompt, GREEDY, Speculation(drafting=drafter.kind, draft_max=k),
                             Limits(max_tokens=tokens)), None, session)

    try:
        for prompt in prompts:
            recorder, answer = on_branching(NoDrafter(), prompt, 1)
            speeds.add("plain", recorder)
            for k in TREE_LENGTHS:
                for label, oracle in ((f"answer k={k}", Oracle()), (f"tree 2x{k}, answer 2nd", ForkedAnswer())):
                    speeds.add(label, drafting_the_answer(
                        lambda oracle=oracle, prompt=prompt, k=k: on_branching(oracle, prompt, k), oracle, answer))
    finally:
        branching.close()
    rows = {label: speeds.row(label) for label in speeds.records}
    for k in TREE_LENGTHS:
        rows[f"answer k={k}"]["predicted"] = (k + 1) / ratios[k + 1] if k + 1 in ratios else None
        rows[f"tree 2x{k}, answer 2nd"]["predicted"] = (k + 1) / ratios[2 * k + 1] if 2 * k + 1 in ratios else None
    return rows


def floor(session: Session, prompts: list[list[int]], tokens: int) -> dict:
    """Plain (twice: an A/A control), the draft model that never agrees (fixed drafting) and auto,
    interleaved prompt by prompt."""
    speeds = Speeds()
    modes = {"plain": DrafterKind.PLAIN, "plain again": DrafterKind.PLAIN, "draft model": DrafterKind.DRAFT,
             "auto": DrafterKind.AUTO}
    hosts = {label: HostTime() for label in modes}
    session.forget()
    for prompt in prompts:
        for label, mode in modes.items():
            session.remember_as(label)  # auto must not draft plain's answer to the same prompt from the suffix cache
            speeds.add(label, with_mode(session, mode, prompt, tokens, hosts[label])[0])
    rows = {label: speeds.row(label) for label in speeds.records}
    for label, host in hosts.items():  # what each mode's own work on the host costs a step, on average
        rows[label]["host_us_per_step"] = host.seconds / host.steps * 1e6 if host.steps else None
    return {"modes": rows, "auto_vs_plain": rows["auto"]["vs_plain"], "holds": rows["auto"]["vs_plain"] >= FLOOR,
            "a_a": rows["plain again"]["vs_plain"]}


def kept_steps(events, steps: list[Step]):
    """The events as they come, each Step also appended to steps."""
    for event in events:
        if isinstance(event, Step):
            steps.append(event)
        yield event


def replayed_shapes(session: Session, prompts: list[list[int]], tokens: int, recorded: dict) -> dict:
    """Real drafters' step shapes replayed on the answer (Replayed), as they came and padded to each of
    FIXED_ROWS, against plain decoding, prompt by prompt: what changing verification lengths cost here,
    and whether one fixed length would cost less. Each run's verifications by rows (median ms) beside,
    with whether the step's shape differed from the step before's."""
    speeds, timings = Speeds(), {}
    for prompt in prompts:
        recorder, answer = with_mode(session, DrafterKind.PLAIN, prompt, tokens)
        speeds.add("plain", recorder)
        for name in REPLAYED_SETS:
            for drafter in REPLAYED_DRAFTERS:
                shapes = [tuple(shape) for shape in recorded[name][drafter]]
                longest = max(drafted for drafted, _ in shapes)
                for rows in (None, *FIXED_ROWS):
                    label = f"{name}, {drafter}, " + (f"{rows} rows a step" if rows else "as drafted")
                    replayed = Replayed(shapes, rows)
                    limit = max(1, rows - 1 if rows else longest)
                    steps: list[Step] = []

                    def generation(replayed=replayed, limit=limit, prompt=prompt, steps=steps):
                        session.reset()
                        steps.clear()
                        events = generate(session.target, replayed, prompt, GREEDY,
                                          Speculation(drafting=replayed.kind, draft_max=limit), Limits(max_tokens=tokens))
                        return fold(kept_steps(events, steps), None, session)

                    speeds.add(label, drafting_the_answer(generation, replayed, answer))
                    for before, step in zip([None, *steps], steps):
                        changed = "changed" if before is None or before.drafted != step.drafted else "held"
                        timings.setdefault(label, {}).setdefault(f"{step.drafted + 1} {changed}", []).append(step.verify_seconds)
    rows = {label: speeds.row(label) for label in speeds.records}
    for label, by in timings.items():
        rows[label]["verify_ms"] = {key: [len(seconds), statistics.median(seconds) * 1e3] for key, seconds in sorted(
            by.items(), key=lambda item: (int(item[0].split()[0]), item[0]))}
    return rows


def auto_on_offers(session: Session, prompts: list[list[int]], tokens: int, offers: dict) -> dict:
    """Auto choosing live among real n-gram offers (Offered; no suffix cache, no draft model), as it
    weighs a change of batch size by its calibration and blind to it, beside the offers drafted as
    they come (fixed n-gram) and plain decoding, prompt by prompt; each auto generation starts from
    nothing learned."""
    speeds = Speeds()
    session.use(DrafterKind.AUTO)
    session.remember_as(None)
    auto = session.drafting.drafter
    calibrated = auto.costs.reshape, auto.costs.recapture
    generations: list[list[Step]] = []
    for prompt in prompts:
        recorder, answer = with_mode(session, DrafterKind.PLAIN, prompt, tokens)
        speeds.add("plain", recorder)
        for name in REPLAYED_SETS:
            offered = Offered(offers[name])
            speeds.add(f"{name}, n-gram offers as they come", drafting_the_answer(
                lambda offered=offered, prompt=prompt: run(session, offered, prompt, GREEDY,
                                                           draft_limit(session.speculation, DrafterKind.AUTO), tokens),
                offered, answer))
            auto.ngram = offered
            try:
                for label, charged in (("auto", calibrated), ("auto blind to reshapes", (0.0, 0.0))):
                    steps: list[Step] = []

                    def generation(prompt=prompt, steps=steps):
                        auto.forget()
                        return with_mode(session, DrafterKind.AUTO, prompt, tokens, steps=steps)

                    auto.costs.reshape, auto.costs.recapture = charged
                    speeds.add(f"{name}, {label}", drafting_the_answer(generation, offered, answer))
                    generations.append(steps)
            finally:
                auto.ngram = session.drafting.ngram
                auto.costs.reshape, auto.costs.recapture = calibrated
    return {"reshape": calibrated[0], "recapture": calibrated[1], "in_the_loop": changes_in_the_loop(generations),
            "modes": {label: speeds.row(label) for label in speeds.records}}


def changes_in_the_loop(generations: list[list[Step]]) -> dict | None:
    """What a change of batch size cost the plain steps (one row) of these generations, against the price auto's
    calibration reads on an empty cache (the seventh lease's stage (h): charged that price, auto lost to
    weighing blind): the median verification of a plain step after two plain steps (held), just after a step of
    more rows (reshape) and the one after that (recapture), the last two as what they add over verify(1) held.
    None where no plain step followed a draft."""
    verified: dict[str, list[float]] = {"held": [], "reshape": [], "recapture": []}
    for steps in generations:
        rows = [step.drafted + 1 for step in steps]
        for at in range(2, len(steps)):  # (the first two follow the prompt's batch)
            if rows[at] == 1:
                kind = "reshape" if rows[at - 1] != 1 else "recapture" if rows[at - 2] != 1 else "held"
                verified[kind].append(steps[at].verify_seconds)
    if not verified["held"] or not verified["reshape"]:
        return None
    held = statistics.median(verified["held"])
    return {"held_ms": held * 1e3, "steps": {kind: len(seconds) for kind, seconds in verified.items()},
            **{kind: statistics.median(verified[kind]) / held - 1 if verified[kind] else None
               for kind in ("reshape", "recapture")}}


def parallel_sequences(target: Path, draft: Path, prompts: list[list[int]], tokens: int) -> dict:
    """Tokens/s of PARALLEL generations at once (serve's and batch's --parallel) against the same prompts
    one at a time, from empty caches: plainly, and with the draft model drafting for every sequence side
    by side (fixed drafting; its drafts are never right here, so its row shows what drafting for several
    sequences at once costs)."""
    chosen = (prompts * PARALLEL)[:PARALLEL]
    rates: dict[str, dict[int, float]] = {}
    for parallel in (1, PARALLEL):
        with Session(target, draft, Runtime(ctx_size=CONTEXT, parallel=parallel),
                     Speculation(drafting=DrafterKind.AUTO)) as session:
            with_mode(session, DrafterKind.PLAIN, chosen[0], 16)  # warm-up
            for label, mode in (("plain", DrafterKind.PLAIN), ("draft model", DrafterKind.DRAFT)):
                session.use(mode)
                session.reset()
                started = perf_counter()
                produced = generated_together(session, chosen, tokens) if parallel > 1 else sum(
                    fold(session.generate(Request(GREEDY, Limits(max_tokens=tokens), prompt=prompt)), None, session)[0].tokens
                    for prompt in chosen)
                rates.setdefault(label, {})[parallel] = produced / (perf_counter() - started)
    return {label: {"one_at_a_time": rate[1], "together": rate[PARALLEL], "ratio": rate[PARALLEL] / rate[1]}
            for label, rate in rates.items()}


def generated_together(session: Session, prompts: list[list[int]], tokens: int) -> int:
    """Tokens generated from the prompts, one on each of the session's sequences, all at once."""
    scheduler, produced = session.scheduler(), 0
    for prompt in prompts:
        scheduler.add(Request(GREEDY, Limits(max_tokens=tokens), prompt=prompt))
    while scheduler:
        for _, item in scheduler.step():
            if isinstance(item, Exception):
                raise item
            produced += isinstance(item, Token)
    return produced


class Pair:
    """One target and its draft, written when first needed, with the prompts every stage measures."""

    def __init__(self, number: int, shapes, size, models: Path):
        self.target_shape, self.draft_shape = shapes
        self.number, self.size, self.models = number, size, models
        rng = np.random.default_rng(number)  # prompts of ordinary tokens (no control or byte tokens)
        self.prompts = [[int(t) for t in rng.integers(CONTROL + 256, self.target_shape.n_vocab, size.prompt)]
                        for _ in range(size.prompts)]

    @property
    def target(self) -> Path:
        return write_model(self.target_shape, self.models, seed=2 * self.number)

    @property
    def draft(self) -> Path:
        return write_model(self.draft_shape, self.models, seed=2 * self.number + 1, draft=True)

    def session(self, runtime: Runtime | None = None, draft: bool = True, **speculation) -> Session:
        """The pair loaded, warmed up (first-use costs kept out of every timing)."""
        session = Session(self.target, self.draft if draft else None, runtime or Runtime(ctx_size=CONTEXT),
                          Speculation(**{"drafting": DrafterKind.AUTO, "draft_max": self.size.most, **speculation}))
        session.set_draft_max(None)  # each mode's own default; the batch was sized for the longest curve
        with_mode(session, DrafterKind.PLAIN, self.prompts[0], 16)
        return session


def stage_plain(pair: Pair, section: dict, llama_bench: Path) -> dict:
    """(a) Where the models run, the verification curve, and plain decoding beside llama-bench."""
    with pair.session() as session:
        out = {"placement": session.placement()}
        seconds = verification_curve(session, pair.prompts[0], pair.size.most, pair.size.repeats)
        out["verify"] = {"seconds_1": seconds[1], "ratios": {k: s / seconds[1] for k, s in seconds.items()}, "held": True}
        out["llama_cpp"] = against_llama_cpp(session, pair.target, pair.prompts[0][:1], llama_bench, pair.size.repeats)
    return out


def stage_bounds(pair: Pair, section: dict, llama_bench: Path) -> dict:
    """(b) The ceiling (a free drafter that knows the answer) and the floor (a draft that never agrees)."""
    ratios = {int(k): r for k, r in section["verify"]["ratios"].items()}
    with pair.session() as session:
        return {"ceiling": ceiling(session, pair.prompts, pair.size.tokens, ratios),
                "floor": floor(session, pair.prompts, pair.size.tokens),
                "trees": tree_ceiling(session, pair.prompts, pair.size.tokens, ratios)}


def stage_draft(pair: Pair, section: dict, llama_bench: Path) -> dict:
    """(c) A draft token's cost against a target token's, and the speedups the curve then predicts."""
    ratios = {int(k): r for k, r in section["verify"]["ratios"].items()}
    with pair.session() as session:
        cost = token_seconds(session, pair.prompts[0], pair.size.repeats) / section["verify"]["seconds_1"]
    return {"draft_cost": {"token_cost": cost, "predicted": {
        str(a): dict(zip(("speedup", "k"), predicted_speedup(ratios, cost, a))) for a in ACCEPTANCES}}}


def stage_gap(pair: Pair, section: dict, llama_bench: Path) -> dict:
    """(f) Plain decoding with the session's context settings and with llama-bench's; and the costs auto
    holds after one generation (its calibration at load, corrected by real steps), beside the curve."""
    with pair.session() as session:
        with_mode(session, DrafterKind.AUTO, pair.prompts[0], pair.size.tokens)
        out = {"gap": gap(session, pair.target, llama_bench, pair.size.repeats), "auto_costs": session.costs()}
        out["gap"]["loop"] = steps_in_the_loop(session, pair.prompts[0], pair.size.tokens, VERIFIED)
        return out


def stage_parallel(pair: Pair, section: dict, llama_bench: Path) -> dict:
    """(d) Several sequences at once against one at a time."""
    return {"parallel": parallel_sequences(pair.target, pair.draft, pair.prompts, pair.size.tokens)}


def stage_shapes(pair: Pair, section: dict, llama_bench: Path) -> dict:
    """(g) Real drafters' step shapes replayed, as drafted and at fixed verification lengths."""
    recorded = json.loads(REPLAYED_STEPS.read_text())["sets"]
    with pair.session(draft=False) as session:
        return {"shapes": replayed_shapes(session, pair.prompts, pair.size.tokens, recorded)}


def stage_policy(pair: Pair, section: dict, llama_bench: Path) -> dict:
    """(h) Auto live on real n-gram offers, weighing a change of batch size and blind to it."""
    offers = json.loads(REPLAYED_STEPS.read_text())["ngram_offers"]
    with pair.session(draft=False) as session:
        return {"policy": auto_on_offers(session, pair.prompts, pair.size.tokens, offers)}


def stage_host(pair: Pair, section: dict, llama_bench: Path) -> dict:
    """(e) Host time a step and a row, sampling on the backend and on the host."""
    host = {}
    for on_backend in (True, False):
        runtime = Runtime(ctx_size=CONTEXT, backend_sampling=on_backend)
        with pair.session(runtime, draft=False, drafting=DrafterKind.NGRAM, draft_max=max(HOST_LENGTHS)) as session:
            host["backend" if on_backend else "host"] = host_costs(session, pair.prompts, pair.size.tokens)
    return {"host": host}


def stage_fit(pair: Pair, section: dict, llama_bench: Path) -> dict:
    """(i) -ngl auto on a GPU made to look small: --fit-target leaves room for the draft model and half the
    target's layers; the layers it placed, the bytes the estimate expected on the GPU against those the load
    took there, and the pair's text against the text with every layer offloaded."""
    def gpu_free() -> int:
        return sum(d.free for d in devices() if d.is_local_gpu)

    runtime = Runtime(ctx_size=CONTEXT)
    everything = Placement.plan(runtime, gguf_meta.read(pair.target), gguf_meta.read(pair.draft))
    if not everything.target.offload:
        return {"fit": None}  # nothing to fit to on a CPU
    wanted = everything.draft.on_devices + everything.target.sizes.on_devices(everything.target.layers // 2)
    runtime = replace(runtime, fit_margin=max(0, (gpu_free() - wanted) // len(everything.target.offload)))
    before = gpu_free()
    with pair.session(runtime) as session:
        taken, plan = before - gpu_free(), session.plan
        _, fitted = with_mode(session, DrafterKind.AUTO, pair.prompts[0], pair.size.tokens)
    with pair.session() as session:
        _, whole = with_mode(session, DrafterKind.AUTO, pair.prompts[0], pair.size.tokens)
    return {"fit": {"margin": runtime.fit_margin, "target_layers": plan.target.layers_on_gpu,
                    "target_of": plan.target.layers, "draft_layers": plan.draft.layers_on_gpu,
                    "draft_of": plan.draft.layers, "expected": plan.target.on_devices + plan.draft.on_devices,
                    "taken": taken, "notes": plan.notes, "same_text": fitted == whole}}


# Most valuable first: a call cut short has measured what matters most (issue 47).
STAGES = {
    "plain": ("(a) plain decoding beside llama-bench, and the verification curve", stage_plain),
    "bounds": ("(b) the ceiling and the floor", stage_bounds),
    "draft": ("(c) the draft's cost and the curve's prediction", stage_draft),
    "parallel": (f"(d) {PARALLEL} sequences at once", stage_parallel),
    "host": ("(e) host time per step and row", stage_host),
    "gap": ("(f) plain decoding with the session's context settings and with llama-bench's", stage_gap),
    "shapes": ("(g) real drafters' step shapes replayed, as drafted and at fixed verification lengths", stage_shapes),
    "policy": ("(h) auto live on real n-gram offers, weighing a change of batch size and blind to it", stage_policy),
    "fit": ("(i) -ngl auto on a GPU made to look small: the layers placed, the bytes expected and taken", stage_fit),
}


def device_name(accelerator: str) -> str:
    if accelerator != "cpu":
        gpus = [d.description for d in devices() if d.is_local_gpu]
        if gpus:
            return gpus[0]
    identity = hardware.identity()
    return f"{identity['cpu']} ({identity['cores']} cores)"


def measure(size_name: str, size, accelerator: str, llama_bench: Path, models: Path, out: Path | None,
            fresh: bool, only: list[str] | None = None) -> Path:
    """Every stage for every target of the size, most valuable first, each written into out/report.json
    (and report.md) as soon as it is measured; stages an earlier run of the same size on this device
    measured are kept, so a rerun goes on where the last one stopped. only: these stages alone, measured
    again whatever out holds."""
    device = device_name(accelerator)
    out = out or ROOT / "build" / "accelerator-report" / accelerator / "report"
    out.mkdir(parents=True, exist_ok=True)
    report = {"device": device, "accelerator": accelerator, "size": size_name, "targets": {}}
    saved = out / "report.json"
    if saved.exists() and not fresh:
        earlier = json.loads(saved.read_text())
        if all(earlier.get(key) == report[key] for key in ("device", "accelerator", "size")):
            report = earlier
    report.update(date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), localspec=_commit(),
                  llama_cpp=library.system_info(), llama_bench=str(llama_bench) if llama_bench.exists() else None)
    pairs = [Pair(number, shapes, size, models) for number, shapes in enumerate(size.pairs)]
    say(f"measuring on {device}")
    began = time.monotonic()
    for stage, (title, run_stage) in STAGES.items():
        if only and stage not in only:
            continue
        for pair in pairs:
            name = pair.target_shape.name
            section = report["targets"].setdefault(name, {
                "target": asdict(pair.target_shape), "draft": asdict(pair.draft_shape), "stages": {}})
            if stage in section["stages"] and not only:
                say(f"{title}, {name}: measured before (--fresh measures it again)")
                continue
            started = time.monotonic()
            section["bytes"] = {"target": pair.target.stat().st_size, "draft": pair.draft.stat().st_size}
            try:
                section.update(run_stage(pair, section, llama_bench))
            except Exception as error:  # the stages after it still measure what they can; a rerun tries it again
                traceback.print_exc()
                section.setdefault("failed", {})[stage] = f"{type(error).__name__}: {error}"
                say(f"{title}, {name}: FAILED after {time.monotonic() - started:.1f} s: {type(error).__name__}: {error}")
                continue
            section.get("failed", {}).pop(stage, None)
            section["stages"][stage] = time.monotonic() - started
            say(f"{title}, {name}: {section['stages'][stage]:.1f} s (all: {time.monotonic() - began:.0f} s)")
            saved.write_text(json.dumps(report, indent=1))
            (out / "report.md").write_text(markdown(report))
    (out / "report.md").write_text(markdown(report))
    say(f"wrote {saved} and {out / 'report.md'}")
    return out


PROFILED_TOKENS = 512


def profile_plain(size, models: Path, out: Path) -> Path:
    """Plain decoding of the first target, timed with sampling on the backend and on the host, then once
    under cProfile: where the host time of a plain token goes (the functions by their own time); then
    auto's in the floor (profile_floor); written to out/profile.txt."""
    pair = Pair(0, size.pairs[0], size, models)
    lines = [f"# Plain decoding of {pair.target_shape.name}, {PROFILED_TOKENS} tokens", ""]
    for on_backend in (True, False):
        with pair.session(Runtime(ctx_size=CONTEXT, backend_sampling=on_backend), draft=False) as session:
            rates = [with_mode(session, DrafterKind.PLAIN, pair.prompts[0], PROFILED_TOKENS)[0].summary().tokens_per_second
                     for _ in range(3)]
            lines.append(f"sampling asked on the {'backend' if on_backend else 'host'}"
                         f" ({'backend' if session.target.on_backend else 'host'}): tokens/s {statistics.median(rates):.1f}"
                         f" (runs {', '.join(f'{r:.1f}' for r in rates)})")
            if on_backend:
                profiler = cProfile.Profile()
                profiler.enable()
                profiled = with_mode(session, DrafterKind.PLAIN, pair.prompts[0], PROFILED_TOKENS)[0]
                profiler.disable()
    shown = io.StringIO()
    pstats.Stats(profiler, stream=shown).sort_stats("tottime").print_stats(30)
    lines += ["", f"under cProfile (sampling on the backend): {profiled.summary().tokens_per_second:.1f} tokens/s", "",
              shown.getvalue()]
    lines += profile_floor(pair)
    path = out / "profile.txt"
    path.write_text("\n".join(lines))
    say(f"wrote {path}")
    return path


def profile_floor(pair: Pair) -> list[str]:
    """Auto beside a draft model that is never right (the floor), each prompt from nothing remembered:
    each mode's host time a step, then auto under cProfile (by own and by cumulative time): where auto's
    host work beyond plain's goes."""
    lines = ["", f"# Auto where the draft model is never right (the floor), {pair.target_shape.name},"
                 f" {len(pair.prompts)} prompts of {PROFILED_TOKENS} tokens", ""]
    with pair.session() as session:
        hosts = {DrafterKind.PLAIN: HostTime(), DrafterKind.AUTO: HostTime()}
        for prompt in pair.prompts:
            for mode, host in hosts.items():
                session.forget()
                with_mode(session, mode, prompt, PROFILED_TOKENS, host)
        lines += [f"{mode}: host us a step {host.seconds / host.steps * 1e6:.0f} over {host.steps} steps"
                  for mode, host in hosts.items()]
        profiler, steps = cProfile.Profile(), 0
        for prompt in pair.prompts:
            session.forget()
            profiler.enable()
            steps += with_mode(session, DrafterKind.AUTO, prompt, PROFILED_TOKENS)[0].summary().steps
            profiler.disable()
    for order in ("tottime", "cumulative"):
        shown = io.StringIO()
        pstats.Stats(profiler, stream=shown).sort_stats(order).print_stats(35)
        lines += ["", f"auto under cProfile, {steps} steps, by {order}:", "", shown.getvalue()]
    return lines


def _commit() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "unknown (no git here)"


# --- The report as a reader sees it

def markdown(report: dict) -> str:
    """The report as far as it is measured: each stage's part where the stage is done."""
    lines = [f"# localspec on {report['device']}", "",
             f"{report['date']}; localspec {report['localspec']}; {report['size']} shapes, random weights;"
             f" llama.cpp: {report['llama_cpp']}", ""]
    for name, t in report["targets"].items():
        stages = t.get("stages", {})
        if not stages and not t.get("failed"):
            continue
        timed = ", ".join(f"{stage} {seconds:.0f} s" for stage, seconds in stages.items())
        missing = [stage for stage in STAGES if stage not in stages]
        lines += [f"## {name} ({t['bytes']['target'] / 2**20:,.0f} MiB {t['target']['quant']}),"
                  f" draft {t['draft']['name']} ({t['bytes']['draft'] / 2**20:,.0f} MiB {t['draft']['quant']})", "",
                  f"{placement(t['placement']) if 'placement' in t else 'Placement not measured'}."
                  f" Stages measured: {timed or 'none'}"
                  + (f"; not yet: {', '.join(missing)}." if missing else "."), ""]
        lines += [f"Stage {stage} failed: {why}" for stage, why in t.get("failed", {}).items()]
        if "plain" in stages:
            lines += _plain_lines(t)
        if "bounds" in stages:
            lines += _bounds_lines(t)
        if "draft" in stages:
            predicted = t["draft_cost"]["predicted"]
            lines += [f"A {t['draft']['name']} draft token costs {t['draft_cost']['token_cost']:.2f} of a target token;"
                      " by the measured costs alone it would give "
                      + "; ".join(f"{p['speedup']:.2f}x at acceptance {a} (k = {p['k']})" for a, p in predicted.items())
                      + ".", ""]
        if "parallel" in stages:
            lines += [f"| {PARALLEL} sequences at once (greedy) | one at a time, tokens/s | at once | ratio |",
                      "|---|---:|---:|---:|"]
            lines += [f"| {label} | {row['one_at_a_time']:.1f} | {row['together']:.1f} | {row['ratio']:.2f}x |"
                      for label, row in t["parallel"].items()]
            lines.append("")
        if "host" in stages:
            lines += ["| host time | sampled on | us / step | us / further row | share of a plain token |",
                      "|---|---|---:|---:|---:|"]
            for where, by_sampling in t["host"].items():
                for label, h in by_sampling.items():
                    row = "n/a" if h["us_per_row"] is None else f"{h['us_per_row']:.0f}"
                    lines.append(f"| {label}, asked: {where} | {h['sampled_on']} | {h['us_per_step']:.0f} | {row} |"
                                 f" {h['share_of_plain_token']:.1%} |")
            lines.append("")
        if "gap" in stages:
            lines += _gap_lines(t["gap"])
        if "shapes" in stages:
            lines += _shapes_lines(t["shapes"])
        if "fit" in stages and t["fit"]:
            f = t["fit"]
            lines += [f"-ngl auto with {f['margin'] / 2**20:,.0f} MiB left free: {f['target_layers']} of the target's"
                      f" {f['target_of']} layers and {f['draft_layers']} of the draft's {f['draft_of']} on the GPU;"
                      f" expected {f['expected'] / 2**20:,.0f} MiB there, the load took {f['taken'] / 2**20:,.0f} MiB;"
                      f" greedy text {'the same as' if f['same_text'] else 'other than'} with every layer there"
                      " (the CPU's kernels and the GPU's may round apart).", ""]
        if "policy" in stages:
            lines += _policy_lines(t["policy"])
            if t.get("auto_costs"):
                costs = t["auto_costs"]
                lines += [f"Auto's costs after one generation: verify(1) {costs['verify_1_ms']:.2f} ms; verify(n) / verify(1) "
                          + ", ".join(f"{n}: {r:.2f}" for n, r in costs["verify_relative"].items())
                          + "".join(f"; a {kind} token {d['token']:.2f}" for kind, d in costs["drafts"].items()) + ".", ""]
    return "\n".join(lines)


def _gap_lines(g: dict) -> list[str]:
    bench = g["llama_bench"]
    base = bench.get("flash attention auto")
    versus = (lambda speed: f"{speed / base:.3f}x") if base else (lambda speed: "")
    lines = [f"| plain decoding, {BENCH_TOKENS} tokens from an empty cache | tokens/s | vs llama-bench |",
             "|---|---:|---:|", f"| localspec plain | {g['localspec_plain']:.1f} | {versus(g['localspec_plain'])} |"]
    lines += [f"| one-token decodes: {label} | {row['tokens_per_second']:.1f} | {versus(row['tokens_per_second'])} |"
              for label, row in g["settings"].items()]
    lines += ([f"| llama-bench, {label} | {speed:.1f} | {versus(speed)} |" for label, speed in bench.items()]
              if "skipped" not in bench else [f"| llama-bench: {bench['skipped']} | | |"])
    lines.append("")
    verify = g.get("verify_ms")
    if verify:
        sizes = list(verify["held"])
        lines += ["| verify(k), ms | " + " | ".join(map(str, sizes)) + " |", "|---|" + "---:|" * len(sizes)]
        lines += [f"| {label} | " + " | ".join(f"{verify[key][k]:.2f}" for k in sizes) + " |"
                  for key, label in (("held", "the shape held still"), ("changed", "just after another shape"))]
        lines.append("")
    loop = g.get("loop")
    if loop and loop["verify_ms"] is not None:
        lines += [f"In the loop, drafting the answer {loop['k']} at a time: {loop['steps_that_drafted_k']} of"
                  f" {loop['steps']} steps drafted {loop['k']}, their verification {loop['verify_ms']:.2f} ms (median).", ""]
    return lines


def _shapes_lines(rows: dict) -> list[str]:
    lines = ["| real drafters' steps replayed (greedy) | tokens/s | vs plain | tokens / pass |"
             " verification ms by rows, shape changed or held (steps) |", "|---|---:|---:|---:|---|"]
    for label, row in rows.items():
        timed = ", ".join(f"{key} {ms:.2f} ({count})" for key, (count, ms) in row.get("verify_ms", {}).items() if count >= 3)
        lines.append(f"| {label} | {row['tokens_per_second']:.1f} | {row['vs_plain']:.3f}x | {row['tokens_per_pass']:.2f} |"
                     f" {timed} |")
    return lines + [""]


def _policy_lines(policy: dict) -> list[str]:
    lines = [f"| auto on real n-gram offers (greedy; by auto's calibration a change of batch size costs"
             f" {policy['reshape']:.2f} verify(1), the next decode {policy.get('recapture', 0.0):.2f})"
             " | tokens/s | vs plain | tokens / pass | steps that drafted |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {label} | {row['tokens_per_second']:.1f} | {row['vs_plain']:.3f}x | {row['tokens_per_pass']:.2f} |"
              f" {sum(row['steps_by_drafter'].values())} |" for label, row in policy["modes"].items()]
    loop = policy.get("in_the_loop")
    if loop:
        counted = loop["steps"]
        recapture = f"{loop['recapture']:.2f}" if loop["recapture"] is not None else "none timed"
        lines += ["", f"Auto's own plain steps in these generations: held {loop['held_ms']:.2f} ms ({counted['held']});"
                  f" just after a draft {loop['reshape']:.2f} verify(1) more ({counted['reshape']}), the next"
                  f" {recapture} ({counted['recapture']}): what a change cost there, beside the calibration's price."]
    return lines + [""]


def _plain_lines(t: dict) -> list[str]:
    ratios = {int(k): v for k, v in t["verify"]["ratios"].items()}
    shown = [k for k in SHOWN_SIZES if k in ratios]
    lines = [f"Verification cost, verify(k) / verify(1), verify(1) = {t['verify']['seconds_1'] * 1e3:.2f} ms"
             + (" (each k timed in a run of its own: the batch's shape held still):" if t["verify"].get("held") else ":"),
             "",
             "| k | " + " | ".join(map(str, shown)) + " |", "|---|" + "---:|" * len(shown),
             "| cost | " + " | ".join(f"{ratios[k]:.2f}" for k in shown) + " |", ""]
    bench = t["llama_cpp"]
    if "skipped" in bench:
        return lines + [f"localspec plain against llama-bench: not measured ({bench['skipped']}).", ""]
    return lines + [f"localspec plain {bench['localspec_tokens_per_second']:.1f} tokens/s, llama-bench tg"
                    f"{BENCH_TOKENS} {bench['llama_bench_tokens_per_second']:.1f} on the same file and build:"
                    f" **{bench['ratio']:.3f}x**.", ""]


def _bounds_lines(t: dict) -> list[str]:
    lines = ["| ceiling (greedy) | tokens/s | vs plain | predicted by the curve | tokens / pass | acceptance |",
             "|---|---:|---:|---:|---:|---:|"]
    for label, row in t["ceiling"].items():
        predicted = "" if row.get("predicted") is None else f"{row['predicted']:.2f}x"
        acceptance = "" if row["acceptance"] is None else f"{row['acceptance']:.0%}"
        lines.append(f"| {label} | {row['tokens_per_second']:.1f} | {row['vs_plain']:.2f}x | {predicted} |"
                     f" {row['tokens_per_pass']:.2f} | {acceptance} |")
    if "trees" in t:  # (reports before draft trees: none)
        lines += ["", "| draft trees (greedy) | tokens/s | vs plain | predicted by the curve |"
                  " tokens / pass |", "|---|---:|---:|---:|---:|"]
        for label, row in t["trees"].items():
            predicted = "" if row.get("predicted") is None else f"{row['predicted']:.2f}x"
            lines.append(f"| {label} | {row['tokens_per_second']:.1f} | {row['vs_plain']:.2f}x | {predicted} |"
                         f" {row['tokens_per_pass']:.2f} |")
    f = t["floor"]
    lines += ["", "| floor (greedy) | tokens/s | vs plain | host us / step | steps that drafted, by drafter |",
              "|---|---:|---:|---:|---|"]
    for label, row in f["modes"].items():
        drafting = ", ".join(f"{kind} {steps}" for kind, steps in row["steps_by_drafter"].items())
        lines.append(f"| {label} | {row['tokens_per_second']:.1f} | {row['vs_plain']:.3f}x |"
                     f" {row['host_us_per_step']:.0f} | {drafting} |")
    verdict = "holds" if f["holds"] else "**missed**"
    return lines + ["", f"Floor: auto / plain = {f['auto_vs_plain']:.3f}x ({verdict} >= {FLOOR}); A/A control"
                    f" (plain twice) {f['a_a']:.3f}x.", ""]


def placement(where: dict) -> str:
    models = [f"{role} on {', '.join(p['devices'])} ({p['layers_on_gpu']}/{p['layers']} layers on a GPU)"
              for role, p in where.items() if role in ("target", "draft")]
    return f"{'; '.join(models)}; greedy rows sampled on the {where['sampling']}"
