"""Hybrid targets and drafts (LFM2: a recurrent state beside attention) on tiny real GGUFs.

A recurrent state holds no positions: llama.cpp takes tokens back out of it only from snapshots of
the last decode, and answers true even where they do not reach. These tests compare every kind of
rollback the loop uses with a fresh decode of the same tokens, and speculation with plain decoding.
"""

import json

import numpy as np
import pytest

from localspec.store import compat, gguf_meta
from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
from localspec.engine import backend
from localspec.engine.devices import supports_gpu_offload
from localspec.engine.drafters import ModelDrafter, NgramDrafter, NoDrafter
from localspec.engine.speculative import generate, scored
from localspec.errors import UsageError
from localspec.events import Step, Token
from localspec.request import Request
from localspec.session import Session
from localspec.stats import record

from tinymodels import TinySpec, row_tolerance, write_tiny_model

GREEDY = Sampling(temperature=0)
ROWS = row_tolerance(1e-4)  # a rolled-back state's row against a fresh decode's


def next_logits(context, tokens: list[int]) -> np.ndarray:
    """The logits after `tokens`, decoded from an empty cache."""
    context.truncate(0)
    context.decode(tokens, logits="last")
    return context.logits(-1).copy()


def parts_at_a_near_tie(reference, prompt: list[int], plain: list[int], drafted: list[int]) -> bool:
    """Where greedy speculation parted from plain decoding on a GPU: whether plain's row there (decoded from
    an empty cache) holds the two tokens within the GPU's row tolerance of each other,
    so that the same row computed in a verification's batch may prefer the other (an H200 parted so at token
    157 of 200, 0.00067 logits apart, 2026-11-27). On a CPU never: there the texts must be the same."""
    if not supports_gpu_offload():
        return False
    at = next(k for k, (a, b) in enumerate(zip(plain + [None], drafted + [None])) if a != b)
    row = next_logits(reference, prompt + plain[:at])
    return None not in (plain[at:at + 1] + drafted[at:at + 1]) and abs(row[plain[at]] - row[drafted[at]]) < ROWS


@pytest.fixture(scope="module")
def hybrid(load):
    return load("hybrid")


def test_the_tiny_lfm2_is_hybrid_and_keeps_snapshots_for_a_verification(hybrid, tiny):
    assert hybrid.model.recurrent and hybrid.rollback >= 4 and hybrid.max_rows == hybrid.rollback + 1
    info = gguf_meta.read(tiny["hybrid"])
    assert info.recurrent and info.rolls_back


def test_every_rollback_leaves_the_state_a_fresh_decode_would(load, hybrid, prompt):
    reference = load("hybrid")
    draft = hybrid.model.tokenize("abcdefg", add_special=False, parse_special=False)
    follow = draft[0]
    # a verification batch with its last 4 tokens rejected: snapshots of the last decode
    hybrid.truncate(0)
    hybrid.decode(prompt, logits="last")
    hybrid.decode(draft, logits="all")
    hybrid.truncate(len(prompt) + 3)
    hybrid.decode([follow], logits="last")
    assert np.abs(hybrid.logits(-1) - next_logits(reference, prompt + draft[:3] + [follow])).max() < ROWS
    # the last decode was one token: no snapshot reaches before it, so going back is refused, nothing changed
    kept = prompt + draft[:3] + [follow]
    with pytest.raises(backend.EngineError, match="recurrent state"):
        hybrid.truncate(len(kept) - 1)
    hybrid.check_holds(kept)
    # tokens decoded one a time (a draft model drafting) go back to a checkpoint and are decoded again
    hybrid.checkpoint()
    for token in draft[:5]:
        hybrid.decode([token], logits="last")
    hybrid.truncate(len(kept) + 2)
    hybrid.decode([follow], logits="last")
    kept += draft[:2] + [follow]
    assert np.abs(hybrid.logits(-1) - next_logits(reference, kept)).max() < ROWS
    hybrid.check_holds(kept)
    # before the checkpoint, with no snapshot to reach back: a new prompt is read from scratch, never
    # from a wrong state
    hybrid.decode(draft, logits="all")
    shorter = prompt[:4] + draft
    assert hybrid.prefill(shorter, logits="last") == 0
    assert np.abs(hybrid.logits(-1) - next_logits(reference, shorter)).max() < ROWS


@pytest.mark.parametrize("draft_name", ["hybrid_partial", "partial", "ngram"])  # partial: a llama model
def test_greedy_speculation_on_a_hybrid_target_matches_plain_decoding(load, hybrid, prompt, draft_name):
    """The autouse fixture checks every cache after every step, as LOCALSPEC_DEBUG=1 does."""
    speculation = Speculation(draft_max=4, p_min=0.0)
    if draft_name == "ngram":  # the tiny model rarely repeats itself: a longer text gives lookups a chance
        drafter, limits = NgramDrafter(1, 3), Limits(max_tokens=200)
        tokens = hybrid.model.tokenize("abcabcabcabc", add_special=True, parse_special=False)
    else:
        drafter, limits = ModelDrafter(load(draft_name), 0.0, hybrid.model.n_vocab), Limits(max_tokens=60)
        tokens = prompt
    plain = [e.id for e in generate(hybrid, NoDrafter(), tokens, GREEDY, speculation, limits) if isinstance(e, Token)]
    events = list(generate(hybrid, drafter, tokens, GREEDY, speculation, limits))
    drafted = [e.id for e in events if isinstance(e, Token)]
    assert drafted == plain or parts_at_a_near_tie(load("hybrid", n_ctx=512), tokens, plain, drafted)
    summary = record(events).summary()
    assert any(s.accepted < s.drafted for s in events if isinstance(s, Step))  # rejected drafts were rolled back
    # a llama draft has other weights than the LFM2 target: it proposes the same vocabulary, but badly
    assert summary.accepted > 0 or draft_name == "partial"


def test_a_pair_that_cannot_take_drafts_back_is_named_by_the_check(tmp_path, tiny):
    mamba = gguf_meta.read(write_tiny_model(tmp_path / "mamba.gguf", TinySpec(seed=1, architecture="mamba")))
    assert mamba.recurrent and not mamba.rolls_back
    report = compat.check(gguf_meta.read(tiny["target"]), mamba)
    assert not report.compatible and "draft 'mamba' keep a recurrent state" in report.summary()
    both = compat.check(gguf_meta.read(tiny["hybrid"]), gguf_meta.read(tiny["hybrid_partial"]))
    assert both.compatible and "recurrent state snapshots (target, draft)" in str(both.rules)


def test_a_target_without_snapshots_decodes_plainly_unless_drafting_was_asked_for(tiny, monkeypatch):
    monkeypatch.setattr(backend.llama, "llama_n_rs_seq", lambda context: 0)  # as for Mamba or Jamba
    runtime = Runtime(ctx_size=256, threads=2)
    with Session(tiny["hybrid"], None, runtime, Speculation()) as session:
        assert session.mode == DrafterKind.PLAIN and "decoding plainly" in session.notes[-1]
        tokens = session.prompts.tokenize("the cat", raw=False)
        assert record(session.generate(Request(GREEDY, Limits(max_tokens=8), prompt=tokens))).summary().drafted == 0
    with pytest.raises(UsageError, match="can only decode plainly"):
        Session(tiny["hybrid"], None, runtime, Speculation(DrafterKind.NGRAM, required=True))
    # a target with MTP layers neither makes an MTP context nor keeps hidden states it would draft from
    with Session(tiny["mtp"], None, Runtime(ctx_size=512, threads=2), Speculation()) as session:
        assert session.mode == DrafterKind.PLAIN and not session.drafting.costly and not session.target.hidden.layers


def test_hybrid_targets_speculate_from_the_command_line(localspec, tiny):
    for draft, tokens in (("ngram", 200), (tiny["hybrid_partial"], 40)):
        done = localspec("run", tiny["hybrid"], "--draft", draft, "--spec", "fixed", "--p-min", "0", "--temp", "0",
                         "--raw", "-p", "abcabcabcabc", "-n", tokens, "--json")
        assert done.returncode == 0, done.stderr.decode()
        stats = json.loads(done.stdout)["stats"]
        assert stats["tokens"] == tokens and 0 < stats["accepted"] < stats["drafted"], draft
    assert json.loads(done.stdout)["notes"] == []
    check = localspec("check", tiny["hybrid"], tiny["hybrid_partial"], "--json")
    rules = {rule["name"]: rule for rule in json.loads(check.stdout)["rules"]}
    assert check.returncode == 0 and rules["state rollback"]["passed"]


def test_llama_cpps_own_answer_beyond_the_snapshots_would_leave_a_wrong_state(load, hybrid, prompt):
    """Why Context checks what the snapshots reach instead of trusting llama_memory_seq_rm: taking
    back tokens of earlier decodes, llama.cpp answers true and keeps a wrong recurrent state."""
    reference = load("hybrid")
    follow = prompt[1]
    hybrid.truncate(0)
    hybrid.decode(prompt, logits="last")
    for token in prompt[:3]:  # three decodes of one token each, as a draft model drafts
        hybrid.decode([token], logits="last")
    assert backend.llama.llama_memory_seq_rm(hybrid._memory, 0, len(prompt) + 1, -1)
    del hybrid.tokens[len(prompt) + 1:]
    hybrid.decode([follow], logits="last")
    wrong = np.abs(hybrid.logits(-1) - next_logits(reference, prompt + prompt[:1] + [follow])).max()
    assert wrong > 1e-2
    # the same request through the Context is refused, and the cache is read again from scratch
    hybrid.truncate(0)
    hybrid.decode(prompt, logits="last")
    for token in prompt[:3]:
        hybrid.decode([token], logits="last")
    with pytest.raises(backend.EngineError):
        hybrid.truncate(len(prompt) + 1)


def test_a_hybrid_targets_prompt_logprobs_are_its_rows_of_each_prefix(hybrid, prompt):
    """An echoed prompt (or a perplexity chunk) on a recurrent state: read anew from an empty state, a few
    rows a decode (as many as it keeps snapshots for), each token's log probability the row a fresh decode
    of its prefix gives."""
    tokens = (prompt * 4)[:3 * hybrid.max_rows + 2]
    scored_rows = scored(hybrid, tokens, 1)
    assert scored_rows[0].chosen.logprob is None and len(scored_rows) == len(tokens)
    for i in range(1, len(tokens)):
        row = next_logits(hybrid, tokens[:i]).astype(np.float64)
        normaliser = row.max() + np.log(np.exp(row - row.max()).sum())
        assert scored_rows[i].chosen.logprob == pytest.approx(row[tokens[i]] - normaliser, abs=5 * ROWS)
