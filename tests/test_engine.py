"""The speculative loop on tiny real GGUFs through llama.cpp: greedy correctness, stops, KV rollback."""

import numpy as np
import pytest

from localspec.config import DrafterKind, Limits, Rope, Sampling, Speculation
from localspec.engine import rollback
from localspec.engine.backend import Context
from localspec.engine.model import Model
from localspec.engine.drafters import ModelDrafter, NgramDrafter, NoDrafter
from localspec.engine.sampling import chain_for, softmax, transform
from localspec.engine.speculative import generate
from localspec.errors import EngineError, InputError
from localspec.events import Done, Prefill, Reading, Step, Token
from localspec.stats import record

GREEDY = Sampling(temperature=0.0)


class RecordingContext:
    """The target context, remembering the argmax of every verified row by its position."""

    def __init__(self, inner):
        self.inner = inner
        self.argmax_at: dict[int, int] = {}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def decode(self, tokens, logits):
        start = len(self.inner.tokens)
        self.inner.decode(tokens, logits)
        if logits == "all":
            for row in range(len(tokens)):
                self.argmax_at[start + row] = int(np.argmax(self.inner.logits(row)))


def run(target, drafter, prompt, sampling=GREEDY, speculation=Speculation(draft_max=4, p_min=0.0), limits=Limits(max_tokens=60)):
    events = list(generate(target, drafter, prompt, sampling, speculation, limits))
    tokens = [e.id for e in events if isinstance(e, Token)]
    return tokens, events


def model_drafter(load, name, p_min=0.0, backend_sampling=False):
    draft = load(name, backend_sampling=backend_sampling)
    return ModelDrafter(draft, p_min, draft.model.n_vocab)


CHAINS = [
    Sampling(),  # llama.cpp's defaults: top-k 40, top-p 0.95, min-p 0.05, temperature 0.8
    Sampling(temperature=1.3, top_k=3, top_p=1.0, min_p=0.0),
    Sampling(temperature=1.0, top_k=0, top_p=0.7, min_p=0.0),
    Sampling(temperature=0.8, top_k=0, top_p=1.0, min_p=0.2),
    Sampling(temperature=0.5, top_k=0, top_p=1.0, min_p=0.0),
]


@pytest.mark.parametrize("on_backend", [False, True], ids=["host", "backend"])
@pytest.mark.parametrize("sampling", CHAINS, ids=str)
def test_llama_cpps_chain_keeps_what_the_reference_transform_keeps(load, prompt, sampling, on_backend):
    reference, context = load("target"), load("target", backend_sampling=on_backend)
    context.sample_with(chain_for(sampling))
    for each in (reference, context):
        each.truncate(0)
        each.decode(prompt, logits="all")
    for row in range(len(prompt)):
        expected, got = transform(reference.logits(row), sampling), softmax(*context.candidates(row))
        assert sorted(got.ids.tolist()) == sorted(expected.ids.tolist())
        np.testing.assert_allclose(got.probs_of(expected.ids), expected.probs, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=1.0, top_k=10, top_p=1.0, min_p=0.0)], ids=str)
def test_on_a_real_152k_vocabulary_the_host_chain_keeps_what_the_reference_transform_keeps(real_model, sampling):
    # top-k looks only into the groups of the row that can hold its k highest: exact on real rows too
    model = Model(real_model("qwen2.5-coder-0.5b"))
    context = Context(model, 256, 64, threads=2, max_outputs=64)
    try:
        context.sample_with(chain_for(sampling))
        prompt = model.tokenize("def merge(left, right):\n    result = []\n", add_special=True, parse_special=False)
        context.decode(prompt, logits="all")
        for row in range(len(prompt)):
            expected, got = transform(context.logits(row), sampling), softmax(*context.candidates(row))
            assert sorted(got.ids.tolist()) == sorted(expected.ids.tolist())
            np.testing.assert_allclose(got.probs_of(expected.ids), expected.probs, rtol=1e-5)
    finally:
        context.close()
        model.close()


def test_greedy_on_the_backend_emits_the_same_tokens_as_on_the_host(load, prompt):
    host, _ = run(load("target"), model_drafter(load, "partial"), prompt)
    on_backend = load("target", backend_sampling=True)
    tokens, events = run(on_backend, model_drafter(load, "partial", backend_sampling=True), prompt)
    assert tokens == host and record(events).summary().accepted > 0
    with pytest.raises(EngineError, match="not kept"):  # llama.cpp no longer copies full rows out
        on_backend.logits(-1)


def test_a_chain_llama_cpp_will_not_run_on_the_backend_is_an_error_naming_the_way_out(load, monkeypatch):
    # llama.cpp refuses a backend sampler for tensor-split models; a CPU has none to refuse with
    from localspec.engine import backend

    context = load("target", backend_sampling=True)  # (loads llama.cpp first: backend.llama is lazy until then)
    monkeypatch.setattr(backend.llama, "llama_set_sampler", lambda ctx, seq, sampler: False)
    with pytest.raises(EngineError, match="--no-backend-sampling"):
        context.sample_with(chain_for(GREEDY))


def test_by_default_a_greedy_chain_llama_cpp_will_not_take_stays_on_the_host(load, prompt, monkeypatch):
    from localspec.engine import backend

    host, _ = run(load("target"), NoDrafter(), prompt)
    monkeypatch.setattr(backend.llama, "llama_set_sampler", lambda ctx, seq, sampler: False)
    context = load("target", backend_sampling=None)
    tokens, _ = run(context, NoDrafter(), prompt)
    assert not context.on_backend and tokens == host


@pytest.mark.parametrize("draft_name", ["same", "partial", "unrelated", "ngram", "none"])
def test_every_greedy_token_is_the_targets_argmax_in_its_verification_batch(load, target, prompt, draft_name):
    drafter = {"ngram": NgramDrafter(1, 3), "none": NoDrafter()}.get(draft_name) or model_drafter(load, draft_name)
    recorder = RecordingContext(target)
    tokens, events = run(recorder, drafter, prompt)
    assert len(tokens) == 60
    for offset, token in enumerate(tokens):
        position_of_previous = len(prompt) + offset - 1
        assert token == recorder.argmax_at[position_of_previous], f"token {offset}"


def test_identical_draft_is_always_accepted(load, target, prompt):
    tokens, events = run(target, model_drafter(load, "same"), prompt)
    summary = record(events).summary()
    assert summary.drafted > 0
    assert summary.acceptance_rate == 1.0
    assert summary.mean_accepted_length == pytest.approx(5.0, abs=0.5)


def test_unrelated_draft_is_mostly_rejected_but_output_is_the_targets(load, target, prompt):
    plain, _ = run(target, NoDrafter(), prompt)
    tokens, events = run(target, model_drafter(load, "unrelated"), prompt)
    summary = record(events).summary()
    assert summary.acceptance_rate < 0.2
    assert tokens == plain


def test_partial_draft_accepts_some_and_matches_plain(load, target, prompt):
    plain, _ = run(target, NoDrafter(), prompt)
    tokens, events = run(target, model_drafter(load, "partial"), prompt)
    summary = record(events).summary()
    assert 0.2 < summary.acceptance_rate < 1.0
    assert tokens == plain


def test_events_come_in_order_and_add_up(load, target, prompt):
    tokens, events = run(target, model_drafter(load, "partial"), prompt)
    assert isinstance(events[0], Prefill) and events[0].prompt_tokens == len(prompt)
    assert isinstance(events[-1], Done)
    steps = [e for e in events if isinstance(e, Step)]
    from_draft = [e.from_draft for e in events if isinstance(e, Token)]
    summary = record(events).summary()
    assert summary.steps == len(steps)
    assert summary.accepted == sum(s.accepted for s in steps) == sum(from_draft) == summary.from_drafts
    assert summary.tokens == len(tokens) == len(from_draft)
    # each step emits its accepted draft tokens, then one of the target's own
    emitted = iter(from_draft)
    for step in steps:
        flags = [next(emitted, None) for _ in range(step.accepted + 1)]
        assert flags[: step.accepted] == [True] * step.accepted
        assert flags[-1] in (False, None)  # None: the generation ended inside this step
    assert len(summary.per_position_acceptance) == max(s.drafted for s in steps)


def test_draft_max_and_min_bound_each_step(load, target, prompt):
    _, events = run(target, model_drafter(load, "same"), prompt, speculation=Speculation(draft_max=2, p_min=0.0))
    assert {e.drafted for e in events if isinstance(e, Step)} <= {0, 1, 2}
    _, events = run(target, NgramDrafter(1, 3), prompt, speculation=Speculation(draft_max=4, draft_min=3))
    assert {e.drafted for e in events if isinstance(e, Step)} <= {0, 3, 4}


def test_p_min_stops_unsure_drafts(load, target, prompt):
    _, sure = run(target, model_drafter(load, "partial", p_min=0.0), prompt)
    _, unsure = run(target, model_drafter(load, "partial", p_min=0.99), prompt)
    assert record(unsure).summary().drafted < record(sure).summary().drafted


def test_a_scaled_rope_changes_the_rows_and_drafting_keeps_the_targets_text_under_it(tiny, prompt):
    """llama.cpp's --rope-scaling and --rope-scale (a longer context than the model was trained on): every row past
    the first is another, and drafts keep what the target writes so."""
    scaled = Rope(scaling="linear", freq_scale=0.25)
    contexts = []
    try:
        for rope, name in ((Rope(), "target"), (scaled, "target"), (scaled, "same")):
            model = Model(tiny[name])
            contexts.append((Context(model, 256, 64, threads=2, max_outputs=64, rope=rope), model))
        (plain, _), (target, _), (draft, _) = contexts
        for context in (plain, target):
            context.decode(prompt, "all")
        assert np.array_equal(plain.logits(0), target.logits(0))  # (position 0 turns by no angle)
        assert not np.allclose(plain.logits(len(prompt) - 1), target.logits(len(prompt) - 1))
        target.truncate(0)
        alone, _ = run(target, NoDrafter(), prompt)
        target.truncate(0)
        drafted, events = run(target, ModelDrafter(draft, 0.0, draft.model.n_vocab), prompt)
        assert drafted == alone and record(events).summary().drafted > 0
    finally:
        for context, model in contexts:
            context.close()
            model.close()


def test_max_tokens_stops_with_length(target, prompt):
    tokens, events = run(target, NgramDrafter(1, 3), prompt, limits=Limits(max_tokens=7))
    assert len(tokens) == 7
    assert events[-1].finish_reason == "length"


def test_full_context_stops_cleanly(load, prompt):
    small = load("target", n_ctx=32, n_batch=8)
    drafter = ModelDrafter(load("same", n_ctx=32, n_batch=8), 0.0, small.model.n_vocab)
    limits = Limits(max_tokens=small.n_ctx * 2)  # llama.cpp may round the context size up
    tokens, events = run(small, drafter, prompt, speculation=Speculation(draft_max=7, p_min=0.0), limits=limits)
    assert events[-1].finish_reason == "context"
    assert len(prompt) + len(tokens) == small.n_ctx + 1  # the last token needs no KV slot


def test_stop_string_ends_generation_before_it(target, prompt):
    plain, events = run(target, NoDrafter(), prompt)
    text = record(events).text
    stop = text[10:13]
    tokens, events = run(target, NgramDrafter(1, 3), prompt, limits=Limits(max_tokens=60, stop=(stop,)))
    assert events[-1].finish_reason == "stop"
    # what the Token events streamed, and the tail held back to the end, is the text up to the stop string
    streamed = "".join(e.text for e in events if isinstance(e, Token)) + events[-1].tail
    assert streamed == text[: text.index(stop)]


@pytest.mark.parametrize("start", [4, 9, 14, 19])
def test_a_step_the_answer_ends_inside_counts_only_the_tokens_the_answer_took(load, target, prompt, start):
    # drafted tokens accepted past a stop string (or an end token) were counted as accepted and settled:
    # "326 tokens (+3 not shown)" where plain decoding said +1, and tokens/pass above what the answer got
    _, events = run(target, NoDrafter(), prompt)
    stop = record(events).text[start:start + 3]
    _, events = run(target, model_drafter(load, "same"), prompt, limits=Limits(max_tokens=60, stop=(stop,)))
    summary = record(events).summary()
    assert events[-1].stop_sequence == stop
    assert summary.accepted == sum(e.from_draft for e in events if isinstance(e, Token))
    assert round(summary.mean_accepted_length * summary.steps) == summary.tokens
    steps = [e for e in events if isinstance(e, Step)]
    assert all(s.accepted == 4 for s in steps[:-1]) and steps[-1].accepted < 4  # (the draft model is the target)


def test_end_of_generation_token_stops_and_is_not_emitted(target, prompt):
    # Sampling at a high temperature reaches </s> (whose logit is pinned at 0) within a few seeds.
    eos_seen = False
    for seed in range(40):
        sampling = Sampling(temperature=3.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed)
        tokens, events = run(target, NgramDrafter(1, 3), prompt, sampling=sampling, limits=Limits(max_tokens=200))
        if events[-1].finish_reason == "stop":
            eos_seen = True
            assert not any(target.model.is_eog(t) for t in tokens)
            break
    assert eos_seen


def test_draft_context_is_rolled_back_to_match_history(load, target, prompt):
    draft = load("partial")
    drafter = ModelDrafter(draft, 0.0, draft.model.n_vocab)
    tokens, _ = run(target, drafter, prompt)
    # the draft's KV holds exactly the committed tokens it has seen, in order
    committed = prompt + tokens
    assert draft.tokens == committed[: len(draft.tokens)]


def test_seeded_sampling_is_reproducible(load, target, prompt):
    sampling = Sampling(temperature=1.0, seed=7)
    first, _ = run(target, model_drafter(load, "partial"), prompt, sampling=sampling)
    second, _ = run(target, model_drafter(load, "partial"), prompt, sampling=sampling)
    assert first == second


def test_empty_and_oversized_prompts_are_user_errors(target, prompt):
    with pytest.raises(InputError, match="empty"):
        run(target, NoDrafter(), [])
    with pytest.raises(InputError, match="ctx-size"):
        run(target, NoDrafter(), prompt * 100)


def test_logits_are_views_on_llama_cpp_memory(target, prompt):
    target.truncate(0)
    target.decode(prompt, logits="all")
    row = target.logits(2)
    assert not row.flags.owndata and row.shape == (target.model.n_vocab,)
    assert np.shares_memory(row, target.logits(2))


def test_prompts_longer_than_a_batch_are_prefilled_in_chunks_each_watched(load, prompt):
    chunked = load("target", n_ctx=256, n_batch=4)
    reference, _ = run(load("target"), NoDrafter(), prompt, limits=Limits(max_tokens=10))
    tokens, events = run(chunked, NoDrafter(), prompt, limits=Limits(max_tokens=10))
    assert tokens == reference
    # a Reading after each batch (the prompt's last token is read with the first step), all before the Prefill
    readings = [e for e in events if isinstance(e, Reading)]
    assert [r.read for r in readings] == [*range(4, len(prompt) - 1, 4), len(prompt) - 1]
    assert {(r.total, r.cached) for r in readings} == {(len(prompt), 0)}
    assert [r.seconds for r in readings] == sorted(r.seconds for r in readings)
    assert all(isinstance(e, Reading) for e in events[:len(readings)]) and isinstance(events[len(readings)], Prefill)
    # read on from what the cache holds: those tokens counted as cached
    longer = prompt + tokens[:1] + [5] * 9
    _, events = run(chunked, NoDrafter(), longer, limits=Limits(max_tokens=2))
    [prefill] = [e for e in events if isinstance(e, Prefill)]
    readings = [e for e in events if isinstance(e, Reading)]
    assert prefill.reused_tokens == len(prompt) + 1 and {r.cached for r in readings} == {prefill.reused_tokens}
    assert readings[-1].read == len(longer) - 1
    # a prompt whose unread part fits one batch sends none
    _, events = run(load("target"), NoDrafter(), prompt, limits=Limits(max_tokens=2))
    assert not any(isinstance(e, Reading) for e in events)


@pytest.mark.slow
def test_real_qwen_pair_emits_the_argmax_of_each_verification_batch(real_model):
    from localspec.config import Runtime
    from localspec.session import Session

    target, draft = real_model("qwen2.5-coder-1.5b"), real_model("qwen2.5-coder-0.5b")
    speculation = Speculation("draft", draft_max=3, p_min=0.0)
    with Session(target, draft, Runtime(ctx_size=1024, backend_sampling=False), speculation) as session:
        prompt = session.prompts.tokenize("Write a Python function that merges two sorted lists.", raw=False)
        recorder = RecordingContext(session.target)
        tokens, events = run(recorder, session.drafting.drafter, prompt, limits=Limits(max_tokens=64))
    assert record(events).summary().acceptance_rate > 0.5
    for offset, token in enumerate(tokens):
        assert token == recorder.argmax_at[len(prompt) + offset - 1], f"token {offset}"
    with Session(target, draft, Runtime(ctx_size=1024), speculation) as session:  # the argmax taken in the graph
        assert run(session.target, session.drafting.drafter, prompt, limits=Limits(max_tokens=64))[0] == tokens
        assert session.target.on_backend


def test_a_prompt_that_extends_the_last_one_reuses_both_kv_caches(load, prompt):
    target, draft = load("target"), load("partial")
    drafter = ModelDrafter(draft, 0.0, target.model.n_vocab)
    first, _ = run(target, drafter, prompt, limits=Limits(max_tokens=20))
    follow_up = prompt + first + target.model.tokenize(" and then", add_special=False, parse_special=False)
    warm, events = run(target, drafter, follow_up, limits=Limits(max_tokens=20))
    assert events[0].reused_tokens >= len(prompt) + len(first) - 1
    cold_target = load("target")
    cold, _ = run(cold_target, ModelDrafter(load("partial"), 0.0, cold_target.model.n_vocab), follow_up,
                  limits=Limits(max_tokens=20))
    assert warm == cold
    assert draft.tokens == (follow_up + warm)[: len(draft.tokens)]


def test_a_small_context_lowers_the_batch_and_drafts_stay_within_it(load, prompt):
    # llama.cpp lowers n_batch to a small requested context; exceeding it would abort the process.
    small = load("target", n_ctx=16, n_batch=64)
    assert small.n_batch == 16
    drafter = ModelDrafter(load("same", n_ctx=16, n_batch=64), 0.0, small.model.n_vocab)
    long_prompt = prompt * 3  # longer than one batch: prefilled in chunks
    tokens, events = run(small, drafter, long_prompt, speculation=Speculation(draft_max=30, p_min=0.0))
    assert max(e.drafted for e in events if isinstance(e, Step)) <= 15
    assert len(tokens) == 60


def test_auto_reads_the_prompt_into_the_draft_model_only_once_it_drafts_with_it(load, prompt):
    from localspec.engine.costs import Costs, DraftCosts
    from localspec.engine.policy import AutoDrafter

    target, draft = load("target"), load("same")
    draft.truncate(0)

    def auto(verify_seconds: dict[int, float]) -> AutoDrafter:
        level = verify_seconds[1]
        costs = Costs(level, {n: s / level for n, s in verify_seconds.items()},
                      {DrafterKind.DRAFT: DraftCosts(0.001 / level, 0.0002 / level)})
        return AutoDrafter(NgramDrafter(2, 4), [ModelDrafter(draft, 0.0, target.model.n_vocab)], costs)

    # verification as costly as the tokens it could save: plain steps only, the draft model untouched
    _, events = run(target, auto({1: 0.05, 9: 0.45}), prompt, limits=Limits(max_tokens=20))
    assert {e.drafter for e in events if isinstance(e, Step)} == {"plain"} and draft.tokens == []
    # nearly free verification: it drafts, and the draft cache follows the committed tokens
    tokens, events = run(target, auto({1: 0.05, 9: 0.051}), prompt, limits=Limits(max_tokens=20))
    assert "draft" in {e.drafter for e in events if isinstance(e, Step)}
    assert draft.tokens and draft.tokens == (prompt + tokens)[: len(draft.tokens)]


def test_a_cache_that_drifted_from_the_history_is_caught_in_debug_mode(load, prompt):
    from localspec.errors import EngineError

    target = load("target")

    class Saboteur(NoDrafter):
        kind = DrafterKind.NGRAM  # asked to draft every step

        def propose(self, history, k):
            target.truncate(len(history) - 2)  # loses a cached token behind the loop's back
            return super().propose(history, k)

    with pytest.raises(EngineError, match="KV cache drifted"):
        run(target, Saboteur(), prompt, limits=Limits(max_tokens=5))
    target.prefill([1, 5, 6])
    target.check_holds([1, 5, 6])
    with pytest.raises(EngineError, match="drifted"):
        target.check_holds([1, 5, 7])


def interrupted(*args):
    raise KeyboardInterrupt


def test_cache_reuse_shifts_the_runs_held_past_a_change_into_place(tiny, monkeypatch):
    """llama-server's --cache-reuse N: what a prompt keeps of the cache past a cut (text deleted, the oldest turn
    dropped) is shifted into place rather than read again, runs shorter than N read again; the cache then holds the
    prompt at its positions, and the next token's logits are a fresh reading's (to the rounding of a K shift, and of
    the kept text having read the cut text once)."""
    model = Model(tiny["target"])
    contexts = [Context(model, 256, 64, threads=2, max_outputs=64, cache_reuse=reuse) for reuse in (0, 8, 60)]
    head, middle, tail = (model.tokenize(text, add_special=False, parse_special=False) for text in (
        "the cat sat on the mat", ". then it slept", ". the dog ran after the ball in the park all day long"))
    head = [1, *head]
    cut = head + tail
    try:
        fresh, reusing, too_long = contexts
        fresh.prefill(cut, logits="last")
        for context in (reusing, too_long):
            context.prefill(head + middle + tail)
        assert reusing.prefill(cut, logits="last") == len(cut) - 1  # (the last token read again for its logits)
        reusing.check_holds(cut)
        assert np.argmax(reusing.logits(-1)) == np.argmax(fresh.logits(-1))
        alike = next(i for i, (a, b) in enumerate(zip(middle, tail)) if a != b)  # (". the" and ". then")
        assert too_long.prefill(cut, logits="last") == len(head) + alike  # the tail's run is shorter than 60
        too_long.check_holds(cut)
        # two runs, each to its own place; new text after them is read
        turns = head + middle + tail
        reusing.prefill(turns)
        later = head + middle[5:] + tail + [5, 6]
        assert reusing.prefill(later) == len(later) - 2
        reusing.check_holds(later)
        # Ctrl-C while cells are moved: the next reading starts from an empty cache rather than a wrong one
        reusing.prefill(turns)
        with monkeypatch.context() as patched:
            patched.setattr(rollback.llama, "llama_memory_seq_add", interrupted)
            with pytest.raises(KeyboardInterrupt):
                reusing.prefill(cut)
        assert reusing.prefill(cut) == 0
        reusing.check_holds(cut)
    finally:
        for context in contexts:
            context.close()
        model.close()
