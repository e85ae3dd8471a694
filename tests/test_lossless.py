"""Speculative sampling reproduces the target's distribution (statistically, on real llama.cpp).

For each setting we draw N seeded generations of the first LENGTH tokens and
compare the counts of each token sequence with the exact probabilities,
computed by walking the target's own transformed distributions over every
prefix, each row read as generation reads it (decoded_row). Sequences that end early (end-of-generation) are outcomes of their own.
Pearson's chi-square test at ALPHA = 1e-4: each test raises a false alarm
once in ten thousand runs (about 0.5% for the 55 together). The seeds are
fixed, so on one machine the outcome is the same every run. The last test shows the check has power: a verifier
that accepts every draft token fails it.
"""

from collections import Counter
from dataclasses import replace

import pytest
import numpy as np
from scipy.stats import chisquare

import localspec.engine.speculative as speculative
from localspec.config import Limits, Sampling, Speculation
from localspec.engine.drafters import ModelDrafter, NgramDrafter, NoDrafter, PredictionDrafter, SuffixDrafter
from localspec.engine.suffix import SuffixCache
from localspec.engine.devices import supports_gpu_offload
from localspec.engine.adjustments import Adjustments
from localspec.engine.sampling import Dist, mirostat_kept, mirostat_moved, mirostat_start, softmax, transform
from localspec.events import Token
from localspec.stats import record

from native_samplers import chain_survivors, dry_row

ALPHA = 1e-4
SAMPLES = 1500
LENGTH = 3
FLOOR = 2e-4  # sequences rarer than this are pooled into one "other" outcome
MIN_EXPECTED = 5.0  # Pearson's rule of thumb; cells expected less often join "other"
OTHER = ("other",)

SETTINGS = {
    "temperature 0.7": Sampling(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0),
    "top-k 5": Sampling(temperature=1.0, top_k=5, top_p=1.0, min_p=0.0),
    "top-p 0.8": Sampling(temperature=0.9, top_k=0, top_p=0.8, min_p=0.0),
    "min-p 0.1": Sampling(temperature=1.0, top_k=0, top_p=1.0, min_p=0.1),
    "llama.cpp defaults": Sampling(),
    # XTC's chance falls at half the rows: each verified row draws its own, and p is the row's after it
    "xtc": Sampling(temperature=1.0, top_k=5, top_p=1.0, min_p=0.0, xtc_probability=0.5, xtc_threshold=0.15),
    # llama.cpp's own samplers in the chain, each a function of its row: the exact distribution is its chain's
    "typical 0.6": Sampling(temperature=1.0, top_k=8, top_p=1.0, min_p=0.0, typical_p=0.6),
    "dynamic temperature": Sampling(temperature=0.9, top_k=6, top_p=1.0, min_p=0.0, dynatemp_range=0.6,
                                    dynatemp_exponent=1.5),
    "top-n-sigma 1": Sampling(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, top_n_sigma=1.0),
    # mirostat's mu moves a lot a token (eta 1) from a low start (2 tau): each row's cut depends on the tokens
    # before it, drafted ones among them
    "mirostat 2": Sampling(temperature=1.0, mirostat=2, mirostat_tau=1.5, mirostat_eta=1.0),
    "mirostat 1": Sampling(temperature=1.0, mirostat=1, mirostat_tau=2.5, mirostat_eta=1.0),
}
# How far a row may be from plain decoding's own when it was computed in a batch of another shape (a
# verification's, or a cache read in other pieces): on an Intel Xeon about 1e-5 in the logits, on an AMD EPYC
# (2026-11-27) 1.3e-4 in a logprob; on an H200 (2026-11-27, `accelerator-report --tests`) 1e-3 in a row's
# probabilities and 3e-3 in a logprob, as CUDA's kernels sum in another order for another batch (the same cause
# as the top-k 5 test's near-tie there).
ROW_TOLERANCE = 1e-2 if supports_gpu_offload() else 1e-3
# every penalty, boosting what was seen (OpenAI's penalties go down to -2): over a prompt that ends in
# the target's own likeliest tokens, a verifier that leaves drafted rows unpenalised is caught at once
PENALISED = Sampling(temperature=1.0, top_k=10, top_p=1.0, min_p=0.0, repeat_penalty=1.2, frequency_penalty=-1.0,
                     presence_penalty=-1.0, repeat_last_n=8)
# DRY on every token seen before (allowed length 0), the harder the longer the repeat it would extend, no
# breakers: at allowed length 1 the tiny target's own continuation repeats too little for a verifier that leaves
# drafted rows alone to be caught (p 0.3); at 0 it is at once (p 1e-21)
DRIED = Sampling(temperature=1.0, top_k=10, top_p=1.0, min_p=0.0, dry_multiplier=2.0, dry_base=1.75,
                 dry_allowed_length=0, dry_sequence_breakers=())
ADJUSTED = {"penalties": PENALISED, "dry": DRIED}
# the drafters whose drafts verification keeps under each: DRY rejects what the n-gram drafter proposes (the next
# token of a repeat, which is what DRY penalises), so no draft of its survives to show a verifier's fault
DRAFTED_UNDER = [("draft model", "penalties"), ("ngram", "penalties"), ("draft model", "dry")]


def decoded_row(target, prompt, prefix):
    """The target's logits after prompt + prefix as generation reads them: the prompt but its last token
    at once, then one token at a time. On a GPU a row computed within a prefill differs from the same row
    decoded after it by up to 0.01 in its logits (an H200, 2026-11-26: enough to swap top-k 5's fifth and
    sixth tokens and fail this test), so the reference is read the way generation reads its rows."""
    target.truncate(0)
    if len(prompt) > 1:
        target.decode(prompt[:-1], logits="none")
    for token in [prompt[-1], *prefix]:
        target.decode([token], logits="last")
    return target.logits(-1)


def penalised(row, before, sampling, model=None):
    """llama.cpp's logit-bias sampler, then its penalties sampler over a row, token by token as its C loops
    go, then its own DRY sampler in model's vocabulary (the references the engine's vectorised Adjustments are
    held to)."""
    row = row.copy()
    for token, bias in sampling.logit_bias:
        row[token] += bias
    if sampling.penalized:
        window = list(before)[-sampling.repeat_last_n:] if sampling.repeat_last_n > 0 else list(before)
        for token, count in Counter(window).items():
            logit = float(row[token])
            logit = logit * sampling.repeat_penalty if logit <= 0 else logit / sampling.repeat_penalty
            row[token] = logit - count * sampling.frequency_penalty - sampling.presence_penalty
    return dry_row(model, sampling, list(before), row) if sampling.dry else row


def with_xtc(row, sampling):
    """The chain's distribution over a row, XTC's mixture where it is on: as it is, or (with XTC's
    probability) as llama.cpp's own chain leaves it when XTC's chance falls."""
    if sampling.typical_p < 1 or sampling.dynatemp_range > 0 or sampling.top_n_sigma > 0:
        # (transform() is top-k, top-p, min-p alone)
        native = chain_survivors(sampling, row, xtc_probability=0.0)
        return Dist(np.array(list(native)), np.array(list(native.values())))
    p = transform(row, sampling)
    if not sampling.xtc:
        return p
    fallen = chain_survivors(sampling, row)
    mixed = (1 - sampling.xtc_probability) * p.probs + sampling.xtc_probability * np.array(
        [fallen.get(token, 0.0) for token in p.ids.tolist()])
    return Dist(p.ids, mixed)


def exact_distribution(target, prompt, sampling, ties: dict | None = None) -> dict[tuple, float]:
    """Each sequence's probability, over every prefix's row; under mirostat each row is cut at the mu the
    prefix leaves (mirostat_kept and mirostat_moved, held to llama.cpp's own mirostat in test_mirostat.py).
    ties (where given) gets each prefix whose row's top-k cut is tied (tied_at_the_cut)."""
    probabilities: dict[tuple, float] = {}

    def walk(prefix: list[int], mass: float, mu: float) -> None:
        row = decoded_row(target, prompt, prefix)
        tied = tied_at_the_cut(row, sampling) if ties is not None else None
        if tied:
            ties[tuple(prefix)] = tied
        if sampling.adjusted:
            row = penalised(row, prompt + prefix, sampling, target.model)
        if sampling.mirostat:
            p = mirostat_kept(softmax(np.arange(len(row)), row / sampling.temperature), sampling.mirostat, mu,
                              len(row))
        else:
            p = with_xtc(row, sampling)
        for token, p_token in zip(p.ids.tolist(), p.probs.tolist()):
            reach = mass * p_token
            if reach < FLOOR:
                continue
            if target.model.is_eog(token):
                probabilities[tuple(prefix)] = reach
            elif len(prefix) + 1 == LENGTH:
                probabilities[tuple(prefix + [token])] = reach
            else:
                walk(prefix + [token], reach, mirostat_moved(mu, p_token, sampling.mirostat_tau, sampling.mirostat_eta))

    walk([], 1.0, mirostat_start(sampling))
    return probabilities


def tied_at_the_cut(row, sampling) -> set[int]:
    """The tokens on either side of top-k's cut whose logits lie within ROW_TOLERANCE of the k-th's, where the
    next one does: which of them the chain keeps is then the hardware's rounding, which another batch's shape
    moves, not the sampler's (an H200, 2026-11-29: the tiny target's 5th and 6th logits 0.002 apart after
    "abcabcabcabc" and two tokens; with n-gram drafting top-k 5 and XTC failed, p 7e-7 and 5e-22)."""
    k = sampling.top_k
    if not 0 < k < len(row):
        return set()
    order = np.argsort(row)[::-1]
    kth = row[order[k - 1]]
    if kth - row[order[k]] >= ROW_TOLERANCE:
        return set()
    return {int(token) for token in order[: 2 * k] if abs(row[token] - kth) < ROW_TOLERANCE}


def pooled(outcomes: dict, ties: dict[tuple, set[int]]) -> dict:
    """Outcomes (probabilities or counts) with every one that takes a tied token at a tied cut counted as one
    outcome of that prefix: the test then holds all it can tell on this hardware."""
    out: dict = {}
    for outcome, value in outcomes.items():
        key = next((outcome[:i] + ("tied",) for i in range(len(outcome)) if outcome[i] in ties.get(outcome[:i], ())),
                   outcome)
        out[key] = out.get(key, 0) + value
    return out


def sample_counts(target, drafter, prompt, sampling) -> Counter:
    counts = Counter()
    speculation = Speculation(draft_max=3, p_min=0.0)
    for seed in range(SAMPLES):
        events = speculative.generate(
            target, drafter, prompt, replace(sampling, seed=seed), speculation, Limits(max_tokens=LENGTH)
        )
        counts[tuple(e.id for e in events if isinstance(e, Token))] += 1
    return counts


def chi_square_p_value(counts: Counter, exact: dict[tuple, float]) -> float:
    expected = {outcome: p * SAMPLES for outcome, p in exact.items() if p * SAMPLES >= MIN_EXPECTED}
    expected[OTHER] = SAMPLES - sum(expected.values())
    observed = {outcome: counts.get(outcome, 0) for outcome in expected}
    observed[OTHER] = SAMPLES - sum(n for outcome, n in observed.items() if outcome != OTHER)
    if expected[OTHER] < 1e-6:  # every outcome is a cell of its own (a cut as mirostat's leaves few)
        if observed[OTHER]:
            return 0.0  # an outcome that cannot happen happened
        del expected[OTHER], observed[OTHER]
    cells = list(expected)
    assert len(cells) >= 5, "too few outcomes for the test to mean anything"
    return chisquare([observed[c] for c in cells], [expected[c] for c in cells]).pvalue


# `target` and `prompt` ("the cat sat on the mat") are the fixtures of tests/conftest.py.


@pytest.fixture(scope="module")
def repetitive_prompt(target):
    # the n-gram drafter needs earlier occurrences to draft from
    return target.model.tokenize("abcabcabcabc", add_special=True, parse_special=False)


def drafter_for(kind, load, target):
    if kind == "draft model":
        draft = load("partial")
        return ModelDrafter(draft, 0.0, target.model.n_vocab)
    return NgramDrafter(1, 3) if kind == "ngram" else NoDrafter()


@pytest.mark.parametrize("kind", ["draft model", "ngram", "plain"])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_output_follows_the_target_distribution(load, target, prompt, repetitive_prompt, setting, kind):
    sampling = SETTINGS[setting]
    tokens = repetitive_prompt if kind == "ngram" else prompt
    drafter = drafter_for(kind, load, target)
    counts = sample_counts(target, drafter, tokens, sampling)
    ties: dict[tuple, set[int]] = {}
    exact = exact_distribution(target, tokens, sampling, ties)
    assert chi_square_p_value(Counter(pooled(counts, ties)), pooled(exact, ties)) > ALPHA


@pytest.mark.parametrize("kind", ["draft model", "plain"])
@pytest.mark.parametrize("setting", ["llama.cpp defaults", "temperature 0.7"])
def test_sampling_on_the_backend_follows_the_target_distribution(load, target, prompt, setting, kind):
    # Both models' chains run inside llama.cpp's decode graph; only the survivors come back.
    sampling = SETTINGS[setting]
    on_backend = load("target", backend_sampling=True)
    drafter = (ModelDrafter(load("partial", backend_sampling=True), 0.0, target.model.n_vocab)
               if kind == "draft model" else NoDrafter())
    counts = sample_counts(on_backend, drafter, prompt, sampling)
    assert chi_square_p_value(counts, exact_distribution(target, prompt, sampling)) > ALPHA


@pytest.mark.parametrize("kind", ["draft model", "ngram"])
@pytest.mark.parametrize("setting", ["llama.cpp defaults", "temperature 0.7"])
def test_a_hybrid_target_follows_its_distribution(load, prompt, repetitive_prompt, setting, kind):
    """LFM2 keeps a recurrent state: every rejected draft is taken back out of it from snapshots (the
    target) or a checkpoint (a hybrid draft model), and each sample reads its prompt from scratch."""
    sampling = SETTINGS[setting]
    hybrid = load("hybrid")
    tokens = repetitive_prompt if kind == "ngram" else prompt
    drafter = (ModelDrafter(load("hybrid_partial"), 0.0, hybrid.model.n_vocab) if kind == "draft model"
               else NgramDrafter(1, 3))
    counts = sample_counts(hybrid, drafter, tokens, sampling)
    assert chi_square_p_value(counts, exact_distribution(hybrid, tokens, sampling)) > ALPHA
    # the premise: in these settings drafts were both kept and taken back
    events = list(speculative.generate(hybrid, drafter, tokens, replace(SETTINGS["temperature 0.7"], seed=1),
                                       Speculation(draft_max=3, p_min=0.0), Limits(max_tokens=200)))
    summary = record(events).summary()
    assert summary.accepted > 0 and summary.accepted < summary.drafted


def predicted(target, prompt) -> PredictionDrafter:
    """A prediction of the greedy text: at T > 0 the samples follow it for a while and then leave it."""
    events = speculative.generate(target, NoDrafter(), prompt, Sampling(temperature=0), Speculation(),
                                  Limits(max_tokens=LENGTH + 8))
    return PredictionDrafter([e.id for e in events if isinstance(e, Token)], NoDrafter(), 0)


def from_earlier(target, prompt) -> SuffixDrafter:
    """The suffix cache holding an earlier greedy answer to the same prompt."""
    cache = SuffixCache()
    cache.add(prompt + predicted(target, prompt).prediction)
    return SuffixDrafter(cache)


@pytest.mark.parametrize("kind", ["prediction", "suffix"])
@pytest.mark.parametrize("setting", ["llama.cpp defaults", "temperature 0.7"])
def test_a_prediction_and_an_earlier_answer_keep_the_target_distribution(target, prompt, setting, kind):
    sampling = SETTINGS[setting]
    drafter = predicted(target, prompt) if kind == "prediction" else from_earlier(target, prompt)
    counts = sample_counts(target, drafter, prompt, sampling)
    assert chi_square_p_value(counts, exact_distribution(target, prompt, sampling)) > ALPHA


def test_speculation_actually_drafted_in_these_settings(load, target, prompt, repetitive_prompt):
    # Without accepted drafts the tests above would only exercise plain sampling.
    for kind, tokens in [("draft model", prompt), ("ngram", repetitive_prompt)]:
        events = list(
            speculative.generate(
                target, drafter_for(kind, load, target), tokens, replace(SETTINGS["temperature 0.7"], seed=1),
                Speculation(draft_max=3, p_min=0.0), Limits(max_tokens=200),
            )
        )
        summary = record(events).summary()
        assert summary.accepted > 0 and summary.accepted < summary.drafted, kind
    for kind, drafter in [("prediction", predicted(target, prompt)), ("suffix", from_earlier(target, prompt))]:
        drafted = accepted = 0
        for seed in range(50):  # samples that keep to the earlier text and samples that leave it
            summary = record(speculative.generate(target, drafter, prompt, replace(SETTINGS["temperature 0.7"], seed=seed),
                                                  Speculation(), Limits(max_tokens=LENGTH))).summary()
            drafted, accepted = drafted + summary.drafted, accepted + summary.accepted
        assert 0 < accepted < drafted, kind


def test_a_verifier_that_accepts_every_draft_token_fails_the_check(load, target, prompt, monkeypatch):
    monkeypatch.setattr(speculative, "accept", lambda token, p, q, rng: True)
    sampling = SETTINGS["temperature 0.7"]
    counts = sample_counts(target, drafter_for("draft model", load, target), prompt, sampling)
    assert chi_square_p_value(counts, exact_distribution(target, prompt, sampling)) < ALPHA


def test_the_check_tells_xtcs_distribution_from_the_rows_own(load, target, prompt):
    sampling = SETTINGS["xtc"]
    counts = sample_counts(target, drafter_for("draft model", load, target), prompt, replace(sampling, xtc_probability=0))
    assert chi_square_p_value(counts, exact_distribution(target, prompt, sampling)) < ALPHA


@pytest.mark.parametrize("setting", ["mirostat 2", "mirostat 1"])
def test_the_check_tells_mirostats_distribution_from_the_rows_own(load, target, prompt, setting):
    sampling = SETTINGS[setting]
    counts = sample_counts(target, drafter_for("draft model", load, target), prompt, replace(sampling, mirostat=0))
    assert chi_square_p_value(counts, exact_distribution(target, prompt, sampling)) < ALPHA


@pytest.mark.parametrize("setting", ["mirostat 2", "mirostat 1"])
def test_a_verifier_whose_mu_drafted_tokens_leave_alone_fails_the_check(load, target, prompt, setting, monkeypatch):
    """Every row of a step cut at the mu before the step: only the target's own tokens move it, as they
    would in plain decoding, where every token is its own."""
    monkeypatch.setattr(speculative.Choice, "follow", lambda self, token: None)  # (Choice.committed still moves it)
    sampling = SETTINGS[setting]
    counts = sample_counts(target, drafter_for("draft model", load, target), prompt, sampling)
    assert chi_square_p_value(counts, exact_distribution(target, prompt, sampling)) < ALPHA
    plain = sample_counts(target, drafter_for("plain", load, target), prompt, sampling)
    assert chi_square_p_value(plain, exact_distribution(target, prompt, sampling)) > ALPHA  # (the fault is drafting's)


def test_a_verifier_that_rejects_every_draft_token_fails_the_check(load, target, prompt, monkeypatch):
    # Every token then comes from norm(max(0, p - q)), which is not p.
    monkeypatch.setattr(speculative, "accept", lambda token, p, q, rng: False)
    sampling = SETTINGS["temperature 0.7"]
    counts = sample_counts(target, drafter_for("draft model", load, target), prompt, sampling)
    p_value = chi_square_p_value(counts, exact_distribution(target, prompt, sampling))
    assert p_value < ALPHA


def own_continuation(target, tokens: list[int], length: int = 6) -> list[int]:
    """tokens and the target's greedy continuation of them: a penalty window of tokens it is likely to say."""
    events = speculative.generate(target, NoDrafter(), tokens, Sampling(temperature=0), Speculation(),
                                  Limits(max_tokens=length))
    return tokens + [e.id for e in events if isinstance(e, Token)]


@pytest.mark.parametrize("adjusted", list(ADJUSTED))
@pytest.mark.parametrize("kind", ["draft model", "ngram", "plain"])
def test_penalties_keep_the_target_distribution(load, target, prompt, repetitive_prompt, kind, adjusted):
    """Each verified row is penalised for the drafted tokens before it as well as the committed ones."""
    tokens = own_continuation(target, repetitive_prompt if kind == "ngram" else prompt)
    counts = sample_counts(target, drafter_for(kind, load, target), tokens, ADJUSTED[adjusted])
    assert chi_square_p_value(counts, exact_distribution(target, tokens, ADJUSTED[adjusted])) > ALPHA


@pytest.mark.parametrize("kind, adjusted", DRAFTED_UNDER)
def test_a_verifier_that_leaves_drafted_steps_unpenalised_fails_the_check(load, target, prompt, repetitive_prompt,
                                                                         kind, adjusted, monkeypatch):
    def plain_steps_only(self, rows, history, drafted):
        if not drafted:
            self.apply(rows(0), history)

    monkeypatch.setattr(Adjustments, "apply_rows", plain_steps_only)
    tokens = own_continuation(target, repetitive_prompt if kind == "ngram" else prompt)
    counts = sample_counts(target, drafter_for(kind, load, target), tokens, ADJUSTED[adjusted])
    assert chi_square_p_value(counts, exact_distribution(target, tokens, ADJUSTED[adjusted])) < ALPHA


def verified_rows(target, prompt, draft: list[int]) -> list:
    """The p the rejection rule reads at each row of one step that verifies `draft` (a prediction drafts it)."""
    seen = []

    def kept_all(token, p, q, rng):
        seen.append(p)
        return True

    drafter = PredictionDrafter(draft, NoDrafter(), 0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(speculative, "accept", kept_all)
        list(speculative.generate(target, drafter, prompt, replace(PENALISED, seed=0), Speculation(draft_max=len(draft)),
                                  Limits(max_tokens=len(draft) + 1)))
    assert len(seen) >= len(draft)  # the first step verified the whole draft
    return seen[: len(draft)]


def test_each_verified_row_is_penalised_for_the_drafted_tokens_before_it(target, prompt):
    """Exactly, row by row: the drafted tokens repeat the window's, so every count moves (a verifier that
    penalised each row for the committed tokens alone reads other rows here, as the last lines show)."""
    tokens = own_continuation(target, prompt)
    draft = tokens[-4:-1]  # tokens already in the window: each drafted one changes the next row's counts
    for i, p in enumerate(verified_rows(target, tokens, draft)):
        expected = transform(penalised(decoded_row(target, tokens, draft[:i]), tokens + draft[:i], PENALISED), PENALISED)
        assert sorted(p.ids.tolist()) == sorted(expected.ids.tolist())
        assert np.allclose(p.probs_of(expected.ids), expected.probs, atol=ROW_TOLERANCE)

    def committed_only(self, rows, history, drafted):
        for i in range(len(drafted) + 1):
            self.apply(rows(i), history)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Adjustments, "apply_rows", committed_only)
        wrong = verified_rows(target, tokens, draft)[1]
    right = transform(penalised(decoded_row(target, tokens, draft[:1]), tokens + draft[:1], PENALISED), PENALISED)
    assert not np.allclose(wrong.probs_of(right.ids), right.probs, atol=ROW_TOLERANCE)


def greedy_text(target, drafter, tokens, sampling) -> tuple[list[int], object]:
    """24 tokens after `tokens` drafted by drafter: their ids and the summary of the run."""
    events = list(speculative.generate(target, drafter, tokens, sampling, Speculation(draft_max=3, p_min=0.0),
                                       Limits(max_tokens=24)))
    return [e.id for e in events if isinstance(e, Token)], record(events).summary()


@pytest.mark.parametrize("kind, adjusted", DRAFTED_UNDER)
def test_greedy_under_penalties_is_plain_greedy_under_them(load, target, prompt, repetitive_prompt, kind, adjusted):
    greedy = replace(ADJUSTED[adjusted], temperature=0)
    tokens = own_continuation(target, repetitive_prompt if kind == "ngram" else prompt)
    plain, _ = greedy_text(target, NoDrafter(), tokens, greedy)
    drafted, summary = greedy_text(target, drafter_for(kind, load, target), tokens, greedy)
    assert drafted == plain and summary.accepted > 0
    assert greedy_text(target, NoDrafter(), tokens, Sampling(temperature=0))[0] != plain  # the penalties changed it


def biased_against_its_own_text(target, tokens: list[int]) -> Sampling:
    """A bias that bans the target's two likeliest next tokens after `tokens` and lifts its third, with
    penalties beside it (applied after the bias, as llama.cpp's chain does)."""
    row = decoded_row(target, tokens, [])
    first, second, third = np.argsort(-row)[:3].tolist()
    return replace(PENALISED, logit_bias=((first, -np.inf), (second, -np.inf), (third, 2.5)))


@pytest.mark.parametrize("kind", ["draft model", "ngram"])
def test_a_logit_bias_keeps_the_target_distribution(load, target, prompt, repetitive_prompt, kind):
    """Every verified row is biased as plain decoding's: the samples follow the target's biased distribution."""
    tokens = own_continuation(target, repetitive_prompt if kind == "ngram" else prompt)
    sampling = biased_against_its_own_text(target, tokens)
    counts = sample_counts(target, drafter_for(kind, load, target), tokens, sampling)
    banned = {token for token, bias in sampling.logit_bias if bias == -np.inf}
    assert not any(outcome[0] in banned for outcome in counts if outcome)
    assert chi_square_p_value(counts, exact_distribution(target, tokens, sampling)) > ALPHA


@pytest.mark.parametrize("kind", ["draft model", "ngram"])
def test_greedy_under_a_logit_bias_is_plain_greedy_under_it(load, target, prompt, repetitive_prompt, kind):
    tokens = own_continuation(target, repetitive_prompt if kind == "ngram" else prompt)
    biased = replace(biased_against_its_own_text(target, tokens), temperature=0, repeat_last_n=0)
    plain, _ = greedy_text(target, NoDrafter(), tokens, biased)
    drafted, summary = greedy_text(target, drafter_for(kind, load, target), tokens, biased)
    assert drafted == plain and summary.accepted > 0
    assert greedy_text(target, NoDrafter(), tokens, Sampling(temperature=0))[0][0] != plain[0]  # the bias changed it


@pytest.mark.parametrize("kind", ["draft model", "plain"])
def test_ignore_eos_writes_on_where_the_model_would_have_stopped(load, target, prompt, kind):
    eos = target.model.eog_tokens
    assert eos and all(target.model.is_eog(token) for token in eos)
    ending = Sampling(temperature=0, logit_bias=((eos[0], 100.0),))  # the model's first choice is to stop

    def generated(sampling):
        events = list(speculative.generate(target, drafter_for(kind, load, target), prompt, sampling,
                                           Speculation(draft_max=3, p_min=0.0), Limits(max_tokens=12)))
        return [e.id for e in events if isinstance(e, Token)], events[-1].finish_reason

    assert generated(ending) == ([], "stop")
    tokens, finish = generated(replace(ending, ignore_eos=True))
    assert finish == "length" and len(tokens) == 12 and not any(target.model.is_eog(t) for t in tokens)
    assert tokens == generated(replace(ending, ignore_eos=True, logit_bias=()))[0]  # the bias on eos went with it


@pytest.mark.parametrize("kind", ["draft model", "ngram"])
def test_logprobs_are_the_targets_own_rows_whatever_drafted_them(load, target, prompt, repetitive_prompt, kind):
    """Each token's log probability and its row's likeliest tokens, read from the verification row that chose it,
    are plain decoding's: the model's own softmax, before penalties (as llama-server reports it)."""
    tokens = own_continuation(target, repetitive_prompt if kind == "ngram" else prompt)
    accepted = 0
    for sampling in (Sampling(temperature=0, logprobs=3), replace(PENALISED, temperature=0, logprobs=3)):
        def run(drafter):
            events = list(speculative.generate(target, drafter, tokens, sampling, Speculation(draft_max=3, p_min=0.0),
                                               Limits(max_tokens=12)))
            return [e for e in events if isinstance(e, Token)], record(events).summary()

        plain, _ = run(NoDrafter())
        drafted, summary = run(drafter_for(kind, load, target))
        accepted += summary.accepted
        assert [t.id for t in drafted] == [t.id for t in plain]
        for i, (alone, verified) in enumerate(zip(plain, drafted)):
            row = decoded_row(target, tokens, [t.id for t in plain[:i]]).astype(np.float64)
            normaliser = row.max() + np.log(np.exp(row - row.max()).sum())
            for reported in (alone.logprobs, verified.logprobs):
                assert reported.chosen.id == alone.id and reported.chosen.piece == target.model.piece(alone.id)
                assert reported.chosen.logprob == pytest.approx(row[alone.id] - normaliser, abs=ROW_TOLERANCE)
                assert [c.id for c in reported.top] == np.argsort(-row, kind="stable")[:3].tolist()
                assert [c.logprob for c in reported.top] == pytest.approx(np.sort(row)[::-1][:3] - normaliser, abs=ROW_TOLERANCE)
    assert accepted > 0  # rows of verifications that kept drafted tokens were read


def test_prompt_logprobs_are_the_models_own_rows_of_each_prefix_and_change_no_token(load, target, prompt):
    """Each prompt token's log probability given those before it (OpenAI's echo: what lm-eval's loglikelihood
    tasks read), the first's None, read in pieces where the prompt's rows do not fit one batch (64 here);
    the generation after it is the one without them, drafted or not."""
    tokens = (prompt * 12)[:80]
    asked = Sampling(temperature=0, prompt_logprobs=2)

    def run(drafter, sampling):
        events = list(speculative.generate(target, drafter, tokens, sampling, Speculation(draft_max=3, p_min=0.0),
                                           Limits(max_tokens=8)))
        return record(events)

    plain = run(NoDrafter(), Sampling(temperature=0))
    for drafter in (NoDrafter(), drafter_for("draft model", load, target)):
        scored = run(drafter, asked)
        assert scored.text == plain.text and scored.prompt_logprobs and not plain.prompt_logprobs
    first, *rest = scored.prompt_logprobs
    assert (first.chosen.id, first.chosen.logprob, first.top) == (tokens[0], None, ())
    assert len(rest) == len(tokens) - 1 > target.max_rows
    # (a row computed in a batch of 64 differs from one decoded alone: by up to 1.2e-3 on this CPU)
    tolerance = 5 * ROW_TOLERANCE
    for i, reported in enumerate(rest, start=1):
        row = decoded_row(target, tokens[:i], []).astype(np.float64)
        normaliser = row.max() + np.log(np.exp(row - row.max()).sum())
        assert reported.chosen.id == tokens[i] and reported.chosen.piece == target.model.piece(tokens[i])
        assert reported.chosen.logprob == pytest.approx(row[tokens[i]] - normaliser, abs=tolerance)
        assert [c.logprob for c in reported.top] == pytest.approx(list(np.sort(row)[::-1][:2] - normaliser),
                                                                  abs=tolerance)


@pytest.mark.parametrize("kind", ["draft model", "plain"])
def test_sampled_logprobs_are_of_the_distribution_each_token_was_chosen_from(load, target, prompt, kind):
    """llama-server's post_sampling_probs: each token's probability and its row's likeliest in p, the chain's
    distribution over the row (here top-k 5 at temperature 1: all five), drafted tokens' from the verification
    row that kept them."""
    sampling = replace(SETTINGS["top-k 5"], logprobs=5, logprobs_sampled=True, seed=3)
    events = list(speculative.generate(target, drafter_for(kind, load, target), prompt, sampling,
                                       Speculation(draft_max=3, p_min=0.0), Limits(max_tokens=12)))
    tokens = [e for e in events if isinstance(e, Token)]
    assert kind == "plain" or any(t.from_draft for t in tokens)
    for i, token in enumerate(tokens):
        p = transform(decoded_row(target, prompt, [t.id for t in tokens[:i]]), sampling)
        reported = {c.id: np.exp(c.logprob) for c in token.logprobs.top}
        assert sorted(reported) == sorted(p.ids.tolist())
        assert all(abs(reported[id] - p.prob(id)) < ROW_TOLERANCE for id in reported)
        assert abs(np.exp(token.logprobs.chosen.logprob) - p.prob(token.id)) < ROW_TOLERANCE
    greedy = speculative.generate(target, drafter_for(kind, load, target), prompt,
                                  Sampling(temperature=0, logprobs=3, logprobs_sampled=True), Speculation(),
                                  Limits(max_tokens=6))
    for token in (e for e in greedy if isinstance(e, Token)):  # greedy chooses from its argmax alone
        assert token.logprobs.chosen.logprob == 0.0 and [c.id for c in token.logprobs.top] == [token.id]
