"""The auto policy: its choices on synthetic costs (pure logic), and calibration on a tiny model."""

import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localspec.store import calibration
from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
from localspec.engine import costs as costs_module
from localspec.engine.drafters import (
    Agreement,
    Draft,
    Evidence,
    NgramDrafter,
    RunClass,
    SuffixDrafter,
)
from localspec.engine.costs import Costs, DraftCosts, _time, calibrate
from localspec.engine.belief import MEAN, SURE, Belief
from localspec.engine.policy import AutoDrafter, Choice, Option
from localspec.engine.suffix import SuffixCache
from localspec.events import Step
from localspec.request import Request
from localspec.session import Session


class FakeModel:
    kind = DrafterKind.DRAFT

    def __init__(self):
        self.asked = []

    def begin(self, prompt, sampling, rng):
        pass

    def prepare(self, sampling, rng):
        pass

    def behind(self, history):
        return 1

    def propose(self, history, k):
        self.asked.append(k)
        return Draft([7] * k, source=self.kind)


def costs(verify: dict[int, float], draft_per_token: float) -> Costs:
    level = verify[1]
    return Costs(level, {n: s / level for n, s in verify.items()},
                 {DrafterKind.DRAFT: DraftCosts(draft_per_token / level, draft_per_token / 4 / level)})


GPU_LIKE = {1: 0.020, 9: 0.022}  # verifying 8 more tokens costs almost nothing
CPU_LIKE = {1: 0.066, 2: 0.097, 4: 0.113, 8: 0.201, 16: 0.252, 32: 0.436}  # the 2-core dev box, Qwen 1.5B
# another 2-core box (AMD EPYC): a batch of 2 costs 1.7 single tokens, so a draft pays only at high acceptance
EPYC_LIKE = {1: 0.037, 2: 0.064, 4: 0.110, 8: 0.268, 16: 0.311, 32: 0.459}
COPIED = list(range(100, 140)) + list(range(100, 116))  # the answer has repeated 16 tokens of its input so far


def policy(verify, draft_per_token, model=True):
    auto = AutoDrafter(NgramDrafter(2, 4), [FakeModel()] if model else [], costs(verify, draft_per_token))
    auto.begin([1, 2, 3], Sampling(), None)
    return auto


def evidence_of(history) -> Evidence:
    ngram = NgramDrafter(2, 4)
    ngram.begin(history, Sampling(), None)
    return ngram.propose(history, 32).evidence


def believe(auto, drafter, evidence, rates, weight=10.0):
    auto.beliefs[(drafter, evidence)] = [Belief(r * weight, (1 - r) * weight) for r in rates]


def probe_of(draft) -> dict:
    """What the loop reports of the auto policy's probe in the Step it makes of a draft."""
    return {"probe": draft.probe is not None, "plain_seconds": draft.probe.plain_seconds if draft.probe else 0.0}


def write(auto, text, start, k, verify, steps=10_000):
    """The engine writing a known (greedy) text from text[:start]: each step keeps the draft's
    agreeing prefix and the target's own next token. Returns the steps."""
    history, done = list(text[:start]), []
    while len(history) < len(text) and len(done) < steps:
        draft = auto.propose(history, min(k, len(text) - len(history) - 1))
        ahead = text[len(history) :]
        kept = next((i for i, (a, b) in enumerate(zip(draft.tokens, ahead)) if a != b), len(draft.tokens))
        n = len(draft.tokens)
        step = Step(draft.source, n, kept, 0.0, verify[n + 1] if n + 1 in verify else auto.costs.verify_seconds(n + 1),
                    **probe_of(draft))
        auto.observe(step)
        history += ahead[: kept + 1]
        done.append(step)
    return done


PASSAGE = list(range(100, 300))
COPY = PASSAGE + [7, 8] + PASSAGE  # a long passage, then the answer repeats it
# Chance matches everywhere: every 2-token context from an alphabet of three occurred before, and
# what follows it is as likely to be anything.
CHANCE = random.Random(0).choices([1, 2, 3], k=600)


def test_expected_tokens_is_one_plus_the_chain_of_acceptances():
    auto = policy(CPU_LIKE, 0.04)
    believe(auto, "draft", None, [0.9, 0.5])
    assert auto.expected_tokens(Option("draft", None, 2)) == pytest.approx([1 + 0.9, 1 + 0.9 + 0.45])


def test_beliefs_start_doubtful_and_an_optimistic_view_is_above_the_mean():
    prior = Belief(1.0, 2.0)
    assert prior.mean == pytest.approx(1 / 3) and prior.view(1) > 0.5 and prior.view(-1) < 0.1
    sure = Belief(95.0, 5.0)
    assert sure.view(1) - sure.mean < 0.03  # many observations: little room for hope or doubt
    sure.observe(False)
    assert sure.mean < 0.95  # each observation moves it; old ones fade
    assert Belief(95.0, 5.0).held_to(4.0).weight == pytest.approx(4.0)


def test_cheap_verification_drafts_with_the_draft_model_from_the_start():
    auto = policy(GPU_LIKE, 0.002)
    draft = auto.propose([1, 2, 3, 4], 8)
    # hope pays at once when 8 more tokens cost almost nothing to verify
    assert draft.source == "draft" and len(draft.tokens) >= 1 and draft.probe
    believe(auto, "draft", None, [0.99] * 8)
    draft = auto.propose([1, 2, 3, 4], 8)
    assert len(draft.tokens) == 8 and not draft.probe


def test_expensive_verification_and_drafting_fall_back_to_plain_decoding_and_never_probe_the_model():
    auto = policy(CPU_LIKE, 0.040)
    choices = [auto.propose([1, 2, 3, 4], 8) for _ in range(300)]
    assert all(c.tokens == [] for c in choices)
    assert auto.costly[DrafterKind.DRAFT].asked == []  # even perfect acceptance would barely pay: not worth a probe


def test_an_ngram_match_is_used_when_verifying_it_pays():
    auto = policy(CPU_LIKE, 0.040)
    history = [5, 6, 7, 8, 9, 10, 11, 12, 13, 5, 6, 7]
    believe(auto, "ngram", evidence_of(history), [0.95] * 8)
    draft = auto.propose(history, 8)
    assert draft.source == "ngram" and draft.tokens == [8, 9, 10, 11, 12, 13, 5, 6][: len(draft.tokens)]
    assert len(draft.tokens) >= 3


def test_ngram_evidence_names_how_far_the_match_runs_and_whether_earlier_occurrences_agree():
    assert evidence_of(COPIED) == Evidence(RunClass.FROM_16, Agreement.SEEN_ONCE)
    assert evidence_of([1, 2, 3, 9, 9, 1, 2]) == Evidence(RunClass.UNDER_4, Agreement.SEEN_ONCE)
    assert evidence_of([1, 2, 3, 9, 1, 2, 4, 8, 1, 2]) == Evidence(RunClass.UNDER_4, Agreement.DIFFER)
    assert evidence_of([1, 2, 3, 9, 1, 2, 3, 9, 7, 1, 2, 3]) == Evidence(RunClass.UNDER_4, Agreement.AGREE)
    assert evidence_of([4, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5]) == Evidence(RunClass.FROM_4, Agreement.SEEN_ONCE)
    assert str(evidence_of(COPIED)) == "run 16+, seen once"  # as reports name it


def test_weaker_evidence_is_the_same_agreement_one_run_class_shorter():
    assert Evidence(RunClass.FROM_16, Agreement.AGREE).weaker() == Evidence(RunClass.FROM_8, Agreement.AGREE)
    assert Evidence(RunClass.FROM_4, Agreement.DIFFER).weaker() == Evidence(RunClass.UNDER_4, Agreement.DIFFER)
    assert Evidence(RunClass.UNDER_4, Agreement.SEEN_ONCE).weaker() is None


def test_observations_move_acceptance_and_costs_for_positions_actually_tried():
    auto = policy(CPU_LIKE, 0.040)
    auto.chosen = Choice(0.0, Option("draft", None, 8), 4)
    auto.observe(Step("draft", drafted=4, accepted=1, draft_seconds=0.2, verify_seconds=0.13))
    rates = [b.mean for b in auto.beliefs[("draft", None)]]
    assert len(rates) == 2  # positions 3 and 4 were never reached
    assert rates[0] > 1 / 3 > rates[1]  # position 1 accepted, position 2 rejected
    # a batch of 5 was observed: its estimate now exists and moved from the interpolated 0.135 s toward 0.13 s
    assert 5 in auto.costs.verify and 0.13 < auto.costs.verify_seconds(5) < 0.135
    assert auto.costs.draft_seconds(DrafterKind.DRAFT, 4) < 0.2


def test_a_probe_is_made_when_only_hope_says_drafting_pays_and_stops_once_it_fails():
    middling = {1: 0.066, 2: 0.070, 4: 0.075}  # verification cheap, the draft model not
    auto = policy(middling, 0.030)
    first = auto.propose([1, 2, 3, 4], 8)
    assert first.source == "draft" and first.probe and first.probe.plain_seconds == pytest.approx(0.066)
    auto.observe(Step("draft", len(first.tokens), 0, 0.03 * len(first.tokens), 0.070, probe=True,
                      plain_seconds=first.probe.plain_seconds))
    later = [auto.propose([1, 2, 3, 4], 8) for _ in range(100)]
    assert all(d.tokens == [] for d in later)  # the failed probe moved the belief below hope


def plain_share(steps, verify) -> float:
    """Tokens per second against plain decoding."""
    return sum(step.accepted + 1 for step in steps) * verify[1] / sum(step.verify_seconds for step in steps)


def test_chance_matches_in_a_long_text_are_found_out_without_drafting_them():
    for verify in (EPYC_LIKE, CPU_LIKE):
        auto = policy(verify, 0.040, model=False)
        steps = write(auto, CHANCE, 50, 8, verify)
        assert sum(step.drafted > 0 for step in steps) <= len(steps) / 100
        assert plain_share(steps, verify) >= 0.99
        assert len(auto.beliefs) >= 4  # every plain step's lookup was scored, whatever its evidence


def test_a_lookup_is_scored_once_the_text_decides_it():
    auto = policy(CPU_LIKE, 0.040, model=False)
    history = [5, 6, 7, 8, 9, 10, 11, 5, 6, 7]
    key = ("ngram", evidence_of(history))
    auto.propose(history, 4)  # proposes 8 9 10 11, not drafted
    auto.propose(history + [8, 9], 4)  # right so far: positions 1-2 held
    assert [round(b.mean, 2) for b in auto.beliefs[key]] == [0.51, 0.69]
    auto.propose(history + [8, 9, 4], 4)  # wrong at the third token; the fourth was never reached
    assert [round(b.mean, 2) for b in auto.beliefs[key]] == [0.51, 0.69, 0.44]


def test_what_other_texts_taught_yields_to_this_generations_evidence_within_a_few_steps():
    auto = policy(CPU_LIKE, 0.040, model=False)
    believe(auto, "ngram", evidence_of(CHANCE[:60]), [0.9] * 8, weight=100.0)  # learned on copied text
    auto.begin(CHANCE[:60], Sampling(), None)
    carried = auto.carried[("ngram", evidence_of(CHANCE[:60]))]
    # only the first position carries over, as a prior worth a couple of observations
    assert carried.weight == pytest.approx(2.0) and carried.mean == pytest.approx(0.9) and auto.beliefs == {}
    drafted = [step.drafted > 0 for step in write(auto, CHANCE, 60, 8, CPU_LIKE, steps=40)]
    assert drafted[0] and sum(drafted) <= 5  # acted on once, then every plain step's lookup teaches


def test_a_long_copy_in_one_text_does_not_earn_long_drafts_in_the_next():
    auto = policy(CPU_LIKE, 0.021, model=False)
    assert max(step.drafted for step in write(auto, COPY, len(PASSAGE) + 4, 32, CPU_LIKE)) >= 15
    # A retrieval answer quotes a few tokens of its document and goes its own way: what another text
    # showed about the first position may be acted on, but not how far that text's copies ran.
    quote = PASSAGE[:40] + [7, 8] + PASSAGE[:20] + [9] * 30
    auto.begin(quote[:44], Sampling(), None)
    steps = write(auto, quote, 44, 32, CPU_LIKE)
    first = next(step for step in steps if step.drafted)
    assert first.drafted <= 2
    assert max(step.drafted for step in steps) >= 8  # as this text's own copy goes on, it earns them


def test_a_draft_position_no_text_has_scored_is_never_sure():
    # A retrieval answer's quotes have held for four draft positions each so far; a match that runs
    # back 8 tokens offers 27. Beyond the scored positions the copy must earn each further token:
    # the rule of succession doubts a copy that has held 8 + 4 tokens more than one that has held 36.
    auto = policy(EPYC_LIKE, 0.021, model=False)
    evidence = evidence_of(PASSAGE[:20] + [7, 8] + PASSAGE[:10])
    believe(auto, "ngram", evidence, [1.0] * 4)
    quote, copy = (Option(DrafterKind.NGRAM, evidence, 27, run=run) for run in (8, 32))
    assert auto.expected_tokens(quote, SURE)[3] == pytest.approx(5.0)
    assert auto.expected_tokens(quote, SURE)[-1] < 10 < auto.expected_tokens(copy, SURE)[-1] < 28
    assert auto.expected_tokens(quote, MEAN)[-1] < auto.expected_tokens(copy, MEAN)[-1]


def test_an_ngram_draft_stops_where_this_texts_copies_stop():
    # A math answer copies a number or phrase of its question and departs: positions past 3 scored as
    # rarely accepted, or never reached by any lookup. Either way the draft stops by position 4, on the
    # curves of both 2-core machines (CPU_LIKE verifies 16 tokens for little more than 8).
    history = PASSAGE[:40] + [7, 8] + PASSAGE[:20]  # the match runs back 16+ tokens
    for verify in (EPYC_LIKE, CPU_LIKE):
        for rates in ([0.9, 0.9, 0.9] + [0.1] * 12, [0.9, 0.9, 0.9]):
            auto = policy(verify, 0.021, model=False)
            believe(auto, DrafterKind.NGRAM, evidence_of(history), rates)
            assert 1 <= len(auto.propose(history, 32).tokens) <= 4


def test_costs_follow_a_machine_that_gets_busier():
    auto = policy(CPU_LIKE, 0.040)
    before = auto.costs.verify_seconds(16)
    for _ in range(60):
        auto.observe(Step("plain", 0, 0, 0.0, 2 * CPU_LIKE[1]))  # plain steps now take twice as long
    assert auto.costs.verify_seconds(1) == pytest.approx(2 * CPU_LIKE[1], rel=0.05)
    assert auto.costs.verify_seconds(16) == pytest.approx(2 * before, rel=0.05)
    auto.observe(Step("plain", 0, 0, 0.0, 100.0))  # one stall moves the level by a bounded amount
    assert auto.costs.verify_seconds(1) < 2.2 * CPU_LIKE[1]


def test_calibration_times_powers_of_two_and_leaves_the_caches_empty(load):
    target, draft = load("target"), load("same")
    target.prefill([1, 2, 3])
    costs = calibrate(target, {DrafterKind.DRAFT: draft}, max_batch=33)
    assert sorted(costs.verify) == [1, 2, 4, 8, 16, 32] and costs.verify[1] == 1.0
    measured = costs.drafts[DrafterKind.DRAFT]
    assert costs.level > 0 and measured.token > 0 and measured.prefill_token > 0
    assert target.tokens == [] and draft.tokens == []
    assert costs.verify_seconds(33) == pytest.approx(costs.verify_seconds(32) * 33 / 32)


def test_calibration_keeps_no_timing_of_a_shape_just_changed():
    # on a GPU the first decode of a new batch shape runs without the captured graph: slow, and unlike the next
    calls = []

    class Context:
        def truncate(self, n_keep):
            pass

    def decode():
        calls.append(None)
        if len(calls) == 1:
            time.sleep(0.05)

    assert _time(decode, Context(), repeats=2) < 0.01 and len(calls) == 3


def test_copied_text_earns_long_ngram_drafts_within_a_few_plain_steps():
    for verify in (EPYC_LIKE, CPU_LIKE):
        auto = policy(verify, 0.021, model=False)
        steps = write(auto, COPY, len(PASSAGE) + 4, 32, verify)
        first = next(i for i, step in enumerate(steps) if step.drafted)
        assert first <= 12 and not any(step.probe for step in steps)
        assert max(step.drafted for step in steps) >= 15
        assert len(steps) <= len(PASSAGE) / 3  # three tokens or more a step
        assert all(step.accepted == step.drafted for step in steps)


def test_a_copy_that_keeps_breaking_earns_shorter_drafts():
    auto = policy(CPU_LIKE, 0.040, model=False)
    write(auto, COPY, len(PASSAGE) + 4, 32, CPU_LIKE)
    # the same passage again, but with every fourth token changed: the copy breaks at position 3 or 4
    broken = [t if i % 4 else 1000 + i for i, t in enumerate(PASSAGE)]
    text = COPY + [7, 8] + broken
    steps = write(auto, text, len(COPY) + 3, 32, CPU_LIKE)
    assert max(step.drafted for step in steps[-10:]) <= 4


# Acceptance by draft position of the real Qwen2.5-Coder 1.5B + 0.5B pair (greedy, fixed 3-token
# drafts, BENCHMARKS.md): HumanEval, where the draft nearly always agrees, and MT-Bench, where it
# often does not. Deeper positions are taken to keep the last rate.
QWEN_PAIR_STREAMS = {"humaneval": [0.97, 0.95, 0.91], "mtbench": [0.77, 0.62, 0.52]}
# verify(k) about verify(1) up to k = 16 and a draft token 5-10% of a target token (an NVIDIA GPU);
# a gentler rise with a small draft beside a big target (Apple Silicon, a 32B target and a 0.5B draft)
ACCELERATORS = {"gpu": ({1: 0.020, 16: 0.021, 32: 0.026}, 0.0015), "apple": ({1: 0.100, 4: 0.104, 8: 0.112, 16: 0.130, 32: 0.180}, 0.008)}


def rate(truth: Costs, rates: list[float], k: int) -> float:
    """E(k) / T(k): expected tokens per second of drafting k tokens, T(k) = k draft tokens + verify(k + 1)."""
    expected, reach = 1.0, 1.0
    for position in range(1, k + 1):
        reach *= rates[min(position, len(rates)) - 1]
        expected += reach
    return expected / (truth.draft_seconds(DrafterKind.DRAFT, k) + truth.verify_seconds(k + 1))


@pytest.mark.parametrize("accelerator", ACCELERATORS)
@pytest.mark.parametrize("stream", QWEN_PAIR_STREAMS)
def test_where_verifying_is_nearly_free_the_draft_model_drafts_long_near_the_optimum(accelerator, stream):
    verify, draft_token = ACCELERATORS[accelerator]
    rates = QWEN_PAIR_STREAMS[stream]
    truth = costs(verify, draft_token)
    auto = policy(verify, draft_token)
    rng = random.Random(1)
    chosen = []
    for _ in range(300):
        draft = auto.propose([1, 2, 3, 4], 32)
        n = len(draft.tokens)
        accepted = 0
        while accepted < n and rng.random() < rates[min(accepted + 1, len(rates)) - 1]:
            accepted += 1
        auto.observe(Step(draft.source, n, accepted, truth.draft_seconds(DrafterKind.DRAFT, n),
                          truth.verify_seconds(n + 1), **probe_of(draft)))
        chosen.append((draft.source, n))
    best = max(rate(truth, rates, k) for k in range(33))
    assert best >= 1.5 * rate(truth, rates, 0)  # the premise: drafting pays a lot here
    settled = chosen[100:]
    assert all(source == "draft" for source, _ in settled)
    # each length it drafts must beat a plain step on the doubtful side of its beliefs, so it may stop a little short
    mean_rate = sum(rate(truth, rates, n) for _, n in settled) / len(settled)
    assert mean_rate >= 0.94 * best


@pytest.fixture
def calibrations(monkeypatch) -> list:
    """The arguments of every calibration the costs module makes from here on."""
    made = []
    measure = costs_module.calibrate

    def counted(*args):
        made.append(args)
        return measure(*args)

    monkeypatch.setattr(costs_module, "calibrate", counted)
    return made


def open_auto(target, draft, threads=1) -> Session:
    return Session(target, draft, Runtime(ctx_size=256, threads=threads), Speculation())


def test_auto_calibrates_once_per_model_files_and_settings_and_starts_from_what_the_last_session_learned(
        tiny, calibrations, monkeypatch):
    with open_auto(tiny["target"], tiny["partial"]) as first:
        calibrated = first.costs()
        tokens = first.prompts.tokenize("the cat sat on the mat", raw=True)
        for _ in first.generate(Request(Sampling(temperature=0), Limits(max_tokens=12), prompt=tokens)):
            pass
        learned = first.costs()
    assert len(calibrations) == 1 and learned != calibrated  # each step's timing moves the level
    with open_auto(tiny["target"], tiny["partial"]) as second:
        assert second.costs() == learned  # real steps' corrections included
    assert len(calibrations) == 1
    with open_auto(tiny["target"], None) as no_draft_model:  # other costs to know: measured
        assert not no_draft_model.costs()["drafts"]
    assert len(calibrations) == 2
    monkeypatch.setenv("LOCALSPEC_RECALIBRATE", "1")
    open_auto(tiny["target"], tiny["partial"]).close()
    assert len(calibrations) == 3


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two CPUs for two thread counts")
def test_another_thread_count_is_calibrated_anew(tiny, calibrations):
    for threads in (1, 2, 1):
        open_auto(tiny["target"], None, threads).close()
    assert [made[0].model.path for made in calibrations] == [tiny["target"]] * 2


def test_a_model_file_written_again_is_calibrated_anew(tiny, calibrations, tmp_path):
    target = shutil.copy(tiny["target"], tmp_path / "target.gguf")
    open_auto(target, None).close()
    open_auto(target, None).close()
    assert len(calibrations) == 1
    os.utime(target, ns=(0, os.stat(target).st_mtime_ns + 1_000_000_000))
    open_auto(target, None).close()
    assert len(calibrations) == 2


@pytest.mark.parametrize("content", ["{not json", json.dumps({"version": -1, "entries": []}),
                                     json.dumps({"version": calibration.VERSION, "entries": [{"key": 1}]})])
def test_an_unreadable_or_foreign_calibration_file_is_measured_anew_and_replaced(tiny, calibrations, content):
    calibration.path().write_text(content)
    open_auto(tiny["target"], None).close()
    open_auto(tiny["target"], None).close()
    assert len(calibrations) == 1
    assert json.loads(calibration.path().read_text())["version"] == calibration.VERSION


@contextmanager
def busy_cores():
    """Every core of the machine kept busy by other processes."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(0.2)
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def test_costs_measured_while_other_processes_took_the_cores_serve_their_session_but_are_not_kept(tiny, calibrations):
    threads = os.cpu_count() or 1
    with busy_cores(), open_auto(tiny["target"], None, threads):
        time.sleep(0.3)  # long enough for the CPU times to tell
    assert not calibration.path().exists()
    open_auto(tiny["target"], None, threads).close()  # a quiet machine: measured again, and kept
    open_auto(tiny["target"], None, threads).close()
    assert len(calibrations) == 2


def test_costs_measured_on_a_quiet_machine_are_kept_at_once_for_a_session_that_lives_on(tiny, calibrations,
                                                                                        monkeypatch):
    # serve's session lives for days: kept only at a close on a machine quiet all along, its costs were
    # measured again at every start
    measure = costs_module.calibrate
    monkeypatch.setattr(costs_module, "calibrate", lambda *args: (time.sleep(0.3), measure(*args))[1])  # as long
    threads = os.cpu_count() or 1  # as a real model's calibration takes, for the CPU times to tell
    with open_auto(tiny["target"], None, threads):
        assert calibration.path().exists()  # kept as soon as measured
        with busy_cores():
            time.sleep(0.3)
    open_auto(tiny["target"], None, threads).close()  # the next start reads them
    assert len(calibrations) == 1


def test_an_earlier_generation_earns_suffix_drafts_where_this_text_has_nothing_to_copy():
    """The passage was the answer to an earlier request: this text holds no copy of it for n-gram
    lookup, but the suffix cache does, and its proposals are learned from the text for free."""
    cache = SuffixCache()
    cache.add([7, 8] + PASSAGE)
    for verify in (EPYC_LIKE, CPU_LIKE):
        auto = AutoDrafter(NgramDrafter(2, 4), [], costs(verify, 0.021), SuffixDrafter(cache))
        auto.begin([1, 2, 3], Sampling(), None)
        steps = write(auto, [1, 2, 3, 7, 8] + PASSAGE, 5, 32, verify)
        assert {step.drafter for step in steps if step.drafted} == {DrafterKind.SUFFIX}
        assert len(steps) <= len(PASSAGE) / 3 and all(step.accepted == step.drafted for step in steps)
        assert not any(step.probe for step in steps)


def test_without_a_suffix_drafter_the_same_text_is_decoded_plainly():
    auto = policy(CPU_LIKE, 0.021, model=False)
    steps = write(auto, [1, 2, 3, 7, 8] + PASSAGE, 5, 32, CPU_LIKE)
    assert not any(step.drafted for step in steps)


def test_a_block_drafter_costs_one_pass_over_its_block_and_learns_that_pass_from_what_it_took():
    costs = Costs(0.010, {1: 1.0, 2: 1.5, 4: 2.0, 8: 3.0},
                  {DrafterKind("dflash"): DraftCosts(0.2, 0.1), DrafterKind.DRAFT: DraftCosts(0.2, 0.1)})
    assert costs.draft_seconds(DrafterKind.DRAFT, 3) == pytest.approx(0.010 * 0.2 * 3)
    assert costs.draft_seconds(DrafterKind("dflash"), 3) == pytest.approx(0.010 * 0.2 * 2.0)  # a pass of 4 positions
    for kind in (DrafterKind.DRAFT, DrafterKind("dflash"), DrafterKind.NGRAM):
        assert costs.draft_table(kind, 9) == pytest.approx([costs.draft_seconds(kind, k) for k in range(1, 10)])
    costs.observe_draft(DrafterKind("dflash"), 3, 0.010 * 0.3 * 2.0)  # the pass took 0.3 where 0.2 was expected
    assert 0.2 < costs.drafts[DrafterKind("dflash")].token < 0.3


def batched_policy(verify, rows: int, sequences: int) -> AutoDrafter:
    """Auto on one of several sequences, the others bringing `rows` rows of `sequences` sequences a step."""
    auto = AutoDrafter(NgramDrafter(2, 4), [], costs(verify, 0.021), alongside=lambda: (rows, sequences))
    auto.begin([1, 2, 3], Sampling(), None)
    return auto


# (On EPYC_LIKE, where a batch of 4 costs 3 single rows, a 16-token copy beside three plain rows is at
# break-even: the next test's territory.)
@pytest.mark.parametrize("verify", [GPU_LIKE, CPU_LIKE], ids=["gpu", "cpu"])
def test_beside_other_sequences_a_good_copy_is_still_drafted(verify):
    history = list(range(5, 30)) + [5, 6, 7]  # the text goes on copying 22 tokens
    for rows, sequences in ((0, 0), (3, 3), (48, 3)):
        auto = batched_policy(verify, rows, sequences)
        believe(auto, "ngram", evidence_of(history), [0.99] * 16)
        assert len(auto.propose(history, 16).tokens) >= 3, (rows, sequences)


# A compute-bound machine whose every row costs the same beyond a fixed part of a pass: a draft pays alone
# only for the fixed part it shares, which a batch of several sequences shares already.
ROW_BY_ROW = {n: 0.025 + 0.025 * n for n in (1, 2, 4, 8, 16, 32)}


def test_a_doubtful_draft_that_pays_alone_pays_less_the_more_sequences_share_the_step():
    history = [5, 6, 7, 8, 9, 10, 11, 12, 13, 5, 6, 7]
    drafted = {}
    for sequences in (0, 3, 7, 15):
        auto = batched_policy(ROW_BY_ROW, sequences, sequences)  # the others decoding plainly, a row each
        believe(auto, "ngram", evidence_of(history), [0.8] * 8)
        drafted[sequences] = len(auto.propose(history, 8).tokens)
    assert drafted[0] >= 1 and drafted[15] == 0
    assert list(drafted.values()) == sorted(drafted.values(), reverse=True)


def test_the_whole_batch_is_what_a_step_is_observed_to_cost():
    auto = batched_policy(CPU_LIKE, 12, 3)
    before = auto.costs.verify_seconds(16)
    auto.observe(Step(DrafterKind.NGRAM, 3, 3, 0.0, 2 * before, batch_rows=12))
    assert auto.costs.verify_seconds(16) > before  # the step's 16 rows, not its own 4, took the time


# An H200 with a 1.5B target: verify(1) 1.7 ms and verify(4) 2.7 ms where the batch's size holds, each
# about 1.7 ms more just after a batch of another size (run kernel by kernel, a CUDA graph captured next).
GPU_SHAPED = {1: 0.0017, 2: 0.0021, 4: 0.0027, 8: 0.0038}


def test_a_draft_that_pays_only_where_the_batch_keeps_its_size_is_taken_only_there():
    history = [5, 6, 7, 8, 9, 10, 11, 12, 13, 5, 6, 7]
    drafted = {}
    for reshape, sizes in ((0.0, (1, 1)), (1.0, (1, 1)), (1.0, (4, 4))):
        auto = policy(GPU_SHAPED, 0.0, model=False)
        auto.costs.reshape, auto.sizes = reshape, sizes
        believe(auto, "ngram", evidence_of(history), [0.8] * 3)
        drafted[reshape, sizes] = len(auto.propose(history, 3).tokens)
    # 2.5 tokens doubtfully expected of 4 rows beat a plain step, unless the change of size costs as much again
    assert drafted == {(0.0, (1, 1)): 3, (1.0, (1, 1)): 0, (1.0, (4, 4)): 3}


def test_after_plain_steps_a_free_draft_is_charged_its_share_of_the_way_back():
    """On a GPU a lone draft after held plain steps pays a reshape, and the plain steps after it a reshape and
    a recapture. Weighed by its own reshape alone, chance n-gram and suffix-cache drafts in math answers were
    taken wherever their tokens paid and cost more than they made (auto at 0.95-0.97x plain on gsm8k, predicted
    for an H200). The way back is charged as often as runs of drafts with the drafter have ended at once: not
    where changes of size cost nothing, nor where the last step drafted (the way back is owed either way), and
    little where runs have gone on."""
    history = [5, 6, 7, 8, 9, 10, 11, 12, 13, 5, 6, 7]
    drafted = {}
    for change, sizes, ended in ((0.0, (1, 1), 0.9), (0.4, (1, 1), 0.9), (0.4, (4, 4), 0.9), (0.4, (1, 1), 0.1)):
        auto = policy(GPU_SHAPED, 0.0, model=False)
        auto.costs.reshape = auto.costs.recapture = change
        auto.sizes, auto.endings[DrafterKind.NGRAM] = sizes, Belief(10 * ended, 10 * (1 - ended))
        believe(auto, "ngram", evidence_of(history), [0.8] * 3)
        drafted[change, sizes, ended] = len(auto.propose(history, 3).tokens)
    assert drafted == {(0.0, (1, 1), 0.9): 3, (0.4, (1, 1), 0.9): 0, (0.4, (4, 4), 0.9): 3, (0.4, (1, 1), 0.1): 3}


def test_how_often_a_run_of_free_drafts_ends_at_once_is_learned_from_the_steps():
    auto = policy(GPU_SHAPED, 0.0, model=False)
    for drafter, drafted in ((DrafterKind.NGRAM, 3), (DrafterKind.PLAIN, 0), (DrafterKind.NGRAM, 3),
                             (DrafterKind.NGRAM, 2), (DrafterKind.PLAIN, 0)):
        auto.observe(Step(drafter, drafted, drafted, 0.0, 0.0017))
    ending = auto.endings[DrafterKind.NGRAM]  # ended, went on, ended: from an even prior
    assert ending.mean > 0.5 and ending.weight < 5
    auto.begin([1, 2, 3], Sampling(), None)
    auto.observe(Step(DrafterKind.PLAIN, 0, 0, 0.0, 0.0017))  # a new generation's first step ends no run
    assert auto.endings[DrafterKind.NGRAM] == ending
    auto.forget()
    assert not auto.endings


def test_a_step_teaches_the_curve_without_what_its_change_of_batch_size_cost():
    auto = policy(GPU_SHAPED, 0.0, model=False)
    auto.costs.reshape, auto.costs.recapture = 1.0, 0.5
    level = auto.costs.level
    for drafted, seconds in ((3, 0.0027 + 0.0017),  # 4 rows after the prompt: run kernel by kernel
                             (3, 0.0027 + 0.00085),  # 4 again: a graph captured
                             (3, 0.0027),  # and replayed
                             (0, 0.0017 + 0.0017)):  # 1 row after 4
        auto.observe(Step(DrafterKind.NGRAM, drafted, drafted, 0.0, seconds))
    assert auto.costs.level == pytest.approx(level) and auto.costs.verify_seconds(4) == pytest.approx(0.0027)
    assert auto.sizes == (4, 1)
    assert [round(s / level, 2) for s in auto.costs.verify_table(4, auto.sizes)] == [1.5, 2.24, 2.41, 2.59]


class ShapedContext:
    """Decodes that take 2 ms a row on a clock of its own, 3 ms more where the batch's size differs from the
    last one's, and 1 ms more in the next decode of that size (capturing a graph)."""

    def __init__(self, changing: bool):
        self.changing, self.sizes, self.now = changing, [None, None], 0.0

    def clock(self) -> float:
        return self.now

    def decode(self, tokens, logits):
        n = len(tokens)
        extra = 0.003 if n != self.sizes[-1] else 0.001 if n != self.sizes[-2] else 0.0
        self.now += 0.002 * n + extra * self.changing
        self.sizes = [self.sizes[-1], n]

    def truncate(self, n_keep):
        pass


@pytest.mark.parametrize("changing", [False, True])
def test_calibration_measures_what_a_change_of_batch_size_costs(changing, monkeypatch):
    context = ShapedContext(changing)
    monkeypatch.setattr(costs_module, "perf_counter", context.clock)
    costs = calibrate(context, {}, max_batch=4)
    assert costs.verify[2] == pytest.approx(2.0)  # each size timed held
    assert (costs.reshape, costs.recapture) == ((pytest.approx(1.5), pytest.approx(0.5)) if changing else (0.0, 0.0))
    kept = Costs.from_dict(dataclasses.asdict(costs))  # kept between runs
    assert (kept.reshape, kept.recapture) == (costs.reshape, costs.recapture)


class ReadingModel:
    """A draft model that knows the text: its catch-up is what it has not read, the prompt at begin() or all
    of it at its first draft."""

    kind = DrafterKind.DRAFT

    def __init__(self, text):
        self.text, self.read = text, 0

    def begin(self, prompt, sampling, rng):
        self.read = len(prompt)

    def prepare(self, sampling, rng):
        self.read = 0

    def behind(self, history):
        return len(history) - self.read

    def propose(self, history, k):
        self.read = len(history)
        return Draft(self.text[len(history) : len(history) + k], source=self.kind)


# The costs an H200 measured for a Llama-3.1-8B-shaped target and a 0.5B-shaped draft (0.32 of a target token)
H200_8B = {1: 0.00355, 2: 0.00407, 4: 0.00546, 8: 0.00830, 16: 0.00808, 32: 0.01039}


def test_a_draft_model_that_would_pay_reads_the_prompt_with_the_target_and_is_tried_after_a_long_one():
    """A catch-up of a 300-token prompt costs more than the probe bucket ever holds: left to the first draft,
    a draft model that is always right was never tried on such costs."""
    prompt, answer = list(range(1000, 1300)), list(range(2000, 2100))  # nothing for n-gram lookup to copy
    model = ReadingModel(prompt + answer)
    auto = AutoDrafter(NgramDrafter(2, 4), [model], costs(H200_8B, 0.32 * H200_8B[1]))
    auto.begin(prompt, Sampling(), None)
    assert model.read == len(prompt)
    steps = write(auto, prompt + answer, len(prompt), 8, H200_8B)
    assert sum(step.drafted for step in steps if step.drafter == DrafterKind.DRAFT) >= len(answer) / 2
    assert len(steps) <= len(answer) / 2
    # where earlier generations found it seldom right, or on a machine where it cannot pay, it reads nothing
    auto.lasting[DrafterKind.DRAFT] = Belief(1.0, 9.0)
    auto.begin(prompt, Sampling(), None)
    assert model.read == 0
    slow = AutoDrafter(NgramDrafter(2, 4), [model], costs(EPYC_LIKE, 0.65 * EPYC_LIKE[1]))
    slow.begin(prompt, Sampling(), None)
    assert model.read == 0


class BehindModel(FakeModel):
    """A costly drafter of a kind, some way behind the text, proposing tokens the text never has."""

    def __init__(self, kind, behind):
        super().__init__()
        self.kind, self.lag = kind, behind

    def behind(self, history):
        return self.lag


# a curve that dips, as the H200's did at 16 (H200_8B), more deeply
DIPPING = {1: 0.020, 2: 0.024, 4: 0.030, 8: 0.060, 16: 0.032, 32: 0.070}


def screened_scenario(seed: int) -> tuple[AutoDrafter, list[int], int]:
    """Auto on a random machine, with a random costly drafter's beliefs, catch-up and probe bucket, the last
    batches' sizes, and a history with chance n-gram matches: (auto, history, k)."""
    rng = random.Random(seed)
    verify = rng.choice([GPU_LIKE, CPU_LIKE, EPYC_LIKE, H200_8B, {1: 0.066, 2: 0.070, 4: 0.075}, DIPPING])
    kind = rng.choice([DrafterKind.DRAFT, DrafterKind("dflash")])
    level = verify[1]
    machine = Costs(level, {n: s / level for n, s in verify.items()},
                    {kind: DraftCosts(rng.uniform(0.02, 1.0), rng.uniform(0.005, 0.3))})
    auto = AutoDrafter(NgramDrafter(2, 4), [BehindModel(kind, rng.choice([0, 1, 5, 50, 400, 3000]))], machine)
    auto.begin([1, 2, 3], Sampling(), None)
    believe(auto, kind, None, [rng.random() for _ in range(rng.randint(0, 6))], weight=rng.uniform(0.5, 30))
    auto.bucket.seconds = rng.uniform(0, 4) * level
    # on a GPU a change of batch size costs more (costs.py): the last two batches' sizes say which
    machine.reshape, machine.recapture = rng.choice([(0.0, 0.0), (0.8, 0.3), (1.4, 0.5), (0.2, 1.0)])
    auto.sizes = rng.choice([(None, None), (1, 1), (1, 5), (5, 1), (9, 9), (3, 9), (9, 3), (17, 17)])
    return auto, [rng.randrange(100, 110) for _ in range(40)], rng.choice([4, 8, 16])


def test_a_costly_drafter_the_screen_passes_over_is_one_the_full_weighing_would_not_choose(monkeypatch):
    """The screen spares the weighing of every length a step, so it must never change a choice: on random
    machines (one whose curve dips), beliefs, catch-ups (a draft model that did not read the prompt falls a
    token behind a step), changes of batch size and probe buckets, auto proposes the same with its screens
    as with screens that pass everything. Blind to a catch-up and a change of batch size, the screen had a
    draft model that could not pay weighed in full every step and never chosen."""
    from localspec.engine.screens import Screen

    def proposed(seed: int):
        auto, history, k = screened_scenario(seed)
        draft = auto.propose(history, k)
        return draft.source, draft.tokens, draft.probe

    chosen = [proposed(seed) for seed in range(600)]
    monkeypatch.setattr(Screen, "may_be_sure", lambda *args: True)
    monkeypatch.setattr(Screen, "may_probe", lambda *args: True)
    assert [proposed(seed) for seed in range(600)] == chosen
    drafted = {(source, probe is not None) for source, tokens, probe in chosen if tokens}
    assert {(DrafterKind.DRAFT, True), (DrafterKind.DRAFT, False), (DrafterKind("dflash"), True)} <= drafted
    assert sum(not tokens for _, tokens, _ in chosen) > 100


def test_a_draft_model_too_far_behind_for_any_draft_to_repay_its_catch_up_is_not_weighed(monkeypatch):
    """The floor on an H200: a draft model that did not read the prompt falls a token behind every plain step,
    and after plain steps a draft's batch pays a reshape; once no draft could repay those, it is passed over
    at the price of a look-up (blind to them, the screen had it weighed length by length and never chosen)."""
    weighed = []
    rates = AutoDrafter._rates
    monkeypatch.setattr(AutoDrafter, "_rates", lambda auto, option, *args, **kwargs: (
        weighed.append(option.drafter), rates(auto, option, *args, **kwargs))[1])
    for lag, reshape, weighs in ((0, 0.0, True), (3000, 0.0, False), (20, 1.4, False)):
        machine = costs(H200_8B, 0.32 * H200_8B[1])
        machine.reshape = reshape
        auto = AutoDrafter(NgramDrafter(2, 4), [BehindModel(DrafterKind.DRAFT, lag)], machine)
        auto.begin([1, 2, 3], Sampling(), None)
        auto.sizes, auto.bucket.seconds = (1, 1), auto.bucket.limit  # plain steps before, a full bucket
        weighed.clear()
        draft = auto.propose(list(range(100, 140)), 8)
        assert (DrafterKind.DRAFT in weighed) == weighs, (lag, reshape)
        assert draft.tokens == [] or weighs


def test_a_draft_model_that_missed_twice_in_one_generation_is_still_tried_in_the_next():
    """A draft model right 95% of the time whose first two drafts of a generation missed (auto drafted no more
    there) carried 0.4 into the next generation: on an H200 it then read no prompt, its first draft's catch-up
    was more than any probe may risk, and it was never tried again (predicted gsm8k on an 8B-shaped target:
    the last 5 of 16 answers at plain speed). What it carries is what the session's generations showed."""
    auto = AutoDrafter(NgramDrafter(2, 4), [FakeModel()], costs(H200_8B, 0.31 * H200_8B[1]))
    drafting = Option(DrafterKind.DRAFT, None, 4)
    for generation in range(12):
        auto.begin([1, 2, 3], Sampling(), None)
        for accepted in ([0, 0] if generation == 11 else [4] * 9 + [3, 0]):
            auto.chosen = Choice(1.0, drafting, 4)
            auto.observe(Step(DrafterKind.DRAFT, 4, accepted, 0.001, 0.005))
    auto.begin([1, 2, 3], Sampling(), None)
    assert auto.carried[DrafterKind.DRAFT, None].mean > 0.8
    assert auto._would_pay(DrafterKind.DRAFT)


@pytest.mark.parametrize("sizes", [None, (None, None), (1, 1), (1, 5), (5, 1), (9, 9), (3, 40)])
def test_the_verify_table_is_each_sizes_cost_after_the_last_batches(sizes):
    machine = costs(H200_8B, 0.001)
    machine.reshape, machine.recapture = 0.8, 0.3
    level = machine.level
    expected = [level * relative + (machine.changing(n, sizes) if sizes else 0.0)
                for n, relative in enumerate(machine.relative(20)[:20], start=1)]
    assert machine.verify_table(20, sizes) == pytest.approx(expected)
    assert [machine.verify_seconds(n, sizes) for n in range(1, 21)] == pytest.approx(expected)


def test_a_screen_reads_its_lengths_cheapest_first_where_the_curve_dips():
    """On a curve that dips (a batch of 16 costing less than one of 8), a longer draft can cost less and make
    more: the screen's probe must be the cheapest that may pay, and a dearer one making no more never is."""
    from localspec.engine.screens import front

    units, tokens = [1.2, 3.0, 2.1], [1.9, 2.4, 2.6]  # drafts of 1, 8 and 16 tokens, in verify(1)s and tokens
    assert front(units, tokens, best_plain=1.5) == [(1.2, 1.9), (2.1, 2.6)]


@given(st.lists(st.tuples(st.floats(0.6, 1.8), st.floats(1, 8)), max_size=8),
       st.lists(st.tuples(st.sampled_from([1.0, 1.2, 1.5]), st.sampled_from([0.0, 0.3, 1.0]), st.floats(0, 40),
                          st.floats(0, 2)), min_size=1, max_size=30))
@settings(max_examples=500, deadline=None)
def test_a_screen_that_remembers_a_step_no_length_beat_answers_as_one_asked_afresh(lengths, steps):
    from localspec.engine.screens import Screen, Weighing

    front = sorted((ratio * tokens, tokens) for ratio, tokens in lengths)  # (u, E): u near E, so steps differ
    kept = Screen(Option(DrafterKind.DRAFT, None, 8), [], 0, 0.5, front, front, {})
    for plain, change, catch_up, bucket in steps:
        step = Weighing(0.01, plain, change)
        fresh = Screen(Option(DrafterKind.DRAFT, None, 8), [], 0, 0.5, front, front, {})
        assert kept.may_be_sure(step, catch_up) == fresh.may_be_sure(step, catch_up)
        assert kept.may_probe(step, catch_up, bucket) == fresh.may_probe(step, catch_up, bucket)
