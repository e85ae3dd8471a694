"""The auto policy: its choices on synthetic costs (pure logic), and calibration on a tiny model."""

import pytest

from localspec.config import Sampling
from localspec.engine.drafters import Draft, NgramDrafter
from localspec.engine.policy import (
    PROBE_SHARE,
    AutoDrafter,
    Belief,
    Choice,
    Costs,
    Option,
    calibrate,
)
from localspec.events import Step


class FakeModel:
    name = "draft"

    def __init__(self):
        self.asked = []

    def begin(self, prompt, sampling, rng):
        pass

    def behind(self, history):
        return 1

    def propose(self, history, k):
        self.asked.append(k)
        return Draft([7] * k, source="draft")


def costs(verify: dict[int, float], draft_per_token: float) -> Costs:
    level = verify[1]
    return Costs(level, {n: s / level for n, s in verify.items()}, draft_per_token / level, draft_per_token / 4 / level)


GPU_LIKE = {1: 0.020, 9: 0.022}  # verifying 8 more tokens costs almost nothing
CPU_LIKE = {1: 0.066, 2: 0.097, 4: 0.113, 8: 0.201, 16: 0.252, 32: 0.436}  # the 2-core dev box, Qwen 1.5B
# another 2-core box (AMD EPYC): a batch of 2 costs 1.7 single tokens, so a draft pays only at high acceptance
EPYC_LIKE = {1: 0.037, 2: 0.064, 4: 0.110, 8: 0.268, 16: 0.311, 32: 0.459}
COPIED = list(range(100, 140)) + list(range(100, 116))  # the answer has repeated 16 tokens of its input so far


def policy(verify, draft_per_token, model=True):
    auto = AutoDrafter(NgramDrafter(2, 4), FakeModel() if model else None, costs(verify, draft_per_token))
    auto.begin([1, 2, 3], Sampling(), None)
    return auto


def evidence_of(history) -> str:
    ngram = NgramDrafter(2, 4)
    ngram.begin(history, Sampling(), None)
    return ngram.propose(history, 32).evidence


def believe(auto, drafter, evidence, rates, weight=10.0):
    auto.beliefs[(drafter, evidence)] = [Belief(r * weight, (1 - r) * weight) for r in rates]


def play(auto, history, k, accepted, verify):
    """One step as the engine runs it: propose, then report how the draft fared."""
    draft = auto.propose(history, k)
    n = len(draft.tokens)
    kept = min(accepted, n)
    step = Step(draft.source, n, kept, 0.0, verify[n + 1] if n + 1 in verify else auto.costs.verify_seconds(n + 1),
                probe=draft.probe, plain_seconds=draft.plain_seconds)
    auto.observe(step)
    return step


def test_expected_tokens_is_one_plus_the_chain_of_acceptances():
    auto = policy(CPU_LIKE, 0.04)
    believe(auto, "draft", "", [0.9, 0.5])
    assert auto.expected_tokens(Option("draft", "", 2)) == pytest.approx([1 + 0.9, 1 + 0.9 + 0.45])


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
    believe(auto, "draft", "", [0.99] * 8)
    draft = auto.propose([1, 2, 3, 4], 8)
    assert len(draft.tokens) == 8 and not draft.probe


def test_expensive_verification_and_drafting_fall_back_to_plain_decoding_and_never_probe_the_model():
    auto = policy(CPU_LIKE, 0.040)
    choices = [auto.propose([1, 2, 3, 4], 8) for _ in range(300)]
    assert all(c.tokens == [] for c in choices)
    assert auto.model.asked == []  # even perfect acceptance would barely pay: not worth a probe


def test_an_ngram_match_is_used_when_verifying_it_pays():
    auto = policy(CPU_LIKE, 0.040)
    history = [5, 6, 7, 8, 9, 10, 11, 12, 13, 5, 6, 7]
    believe(auto, "ngram", evidence_of(history), [0.95] * 8)
    draft = auto.propose(history, 8)
    assert draft.source == "ngram" and draft.tokens == [8, 9, 10, 11, 12, 13, 5, 6][: len(draft.tokens)]
    assert len(draft.tokens) >= 3


def test_ngram_evidence_names_how_far_the_match_runs_and_whether_earlier_occurrences_agree():
    assert evidence_of(COPIED) == "run 16+, seen once"
    assert evidence_of([1, 2, 3, 9, 9, 1, 2]) == "run 2-3, seen once"
    assert evidence_of([1, 2, 3, 9, 1, 2, 4, 8, 1, 2]) == "run 2-3, earlier differ"
    assert evidence_of([1, 2, 3, 9, 1, 2, 3, 9, 7, 1, 2, 3]) == "run 2-3, earlier agree"
    assert evidence_of([4, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5]) == "run 4-7, seen once"


def test_observations_move_acceptance_and_costs_for_positions_actually_tried():
    auto = policy(CPU_LIKE, 0.040)
    auto.chosen = Choice(0.0, Option("draft", "", 8), 4)
    auto.observe(Step("draft", drafted=4, accepted=1, draft_seconds=0.2, verify_seconds=0.13))
    rates = [b.mean for b in auto.beliefs[("draft", "")]]
    assert len(rates) == 2  # positions 3 and 4 were never reached
    assert rates[0] > 1 / 3 > rates[1]  # position 1 accepted, position 2 rejected
    # a batch of 5 was observed: its estimate now exists and moved from the interpolated 0.135 s toward 0.13 s
    assert 5 in auto.costs.verify and 0.13 < auto.costs.verify_seconds(5) < 0.135
    assert auto.costs.draft_seconds(4) < 0.2


def test_a_probe_is_made_when_only_hope_says_drafting_pays_and_stops_once_it_fails():
    middling = {1: 0.066, 2: 0.070, 4: 0.075}  # verification cheap, the draft model not
    auto = policy(middling, 0.030)
    first = auto.propose([1, 2, 3, 4], 8)
    assert first.source == "draft" and first.probe and first.plain_seconds == pytest.approx(0.066)
    auto.observe(Step("draft", len(first.tokens), 0, 0.03 * len(first.tokens), 0.070, probe=True,
                      plain_seconds=first.plain_seconds))
    later = [auto.propose([1, 2, 3, 4], 8) for _ in range(100)]
    assert all(d.tokens == [] for d in later)  # the failed probe moved the belief below hope


def test_probes_that_keep_failing_lose_at_most_the_budget():
    # A long document full of chance matches: every n-gram draft is rejected at once.
    auto = policy(CPU_LIKE, 0.040, model=False)
    history = [1, 2, 3, 4] * 50
    spent = lost = 0.0
    for _ in range(500):
        step = play(auto, history, 8, accepted=0, verify=CPU_LIKE)
        spent += step.verify_seconds
        lost += step.lost_seconds if step.probe else 0.0
        assert not step.drafted or step.probe  # never drafted as a sure thing
    assert lost <= CPU_LIKE[1] + PROBE_SHARE * spent
    assert 500 * CPU_LIKE[1] / spent >= 0.97  # against plain decoding


def test_what_other_texts_taught_yields_to_this_generations_evidence_within_a_few_steps():
    auto = policy(CPU_LIKE, 0.040, model=False)
    history = [5, 6, 7, 8, 9, 10, 11, 12, 13, 5, 6, 7]
    believe(auto, "ngram", evidence_of(history), [0.9] * 8, weight=100.0)  # learned on copied text
    auto.begin(history, Sampling(), None)
    steps = [play(auto, history, 8, accepted=0, verify=CPU_LIKE) for _ in range(20)]
    sure = [s.drafted > 0 for s in steps if not s.probe]
    # A miss at the first position weighs against deep positions still believed: a few misses convince it.
    assert sure[:4] == [True] * sure.index(False) + [False] * (4 - sure.index(False)) and not any(sure[4:])
    assert sum(s.drafted > 0 for s in steps) <= 6  # and probes are rare


def test_costs_follow_a_machine_that_gets_busier():
    auto = policy(CPU_LIKE, 0.040)
    before = auto.costs.verify_seconds(16)
    for _ in range(60):
        auto.observe(Step("none", 0, 0, 0.0, 2 * CPU_LIKE[1]))  # plain steps now take twice as long
    assert auto.costs.verify_seconds(1) == pytest.approx(2 * CPU_LIKE[1], rel=0.05)
    assert auto.costs.verify_seconds(16) == pytest.approx(2 * before, rel=0.05)
    auto.observe(Step("none", 0, 0, 0.0, 100.0))  # one stall moves the level by a bounded amount
    assert auto.costs.verify_seconds(1) < 2.2 * CPU_LIKE[1]


def test_calibration_times_powers_of_two_and_leaves_the_caches_empty(load):
    target, draft = load("target"), load("same")
    target.prefill([1, 2, 3])
    costs = calibrate(target, draft, max_batch=33)
    assert sorted(costs.verify) == [1, 2, 4, 8, 16, 32] and costs.verify[1] == 1.0
    assert costs.level > 0 and costs.draft_token > 0 and costs.draft_prefill_token > 0
    assert target.tokens == [] and draft.tokens == []
    assert costs.verify_seconds(33) == pytest.approx(costs.verify_seconds(32) * 33 / 32)


def test_what_was_never_seen_is_probed_even_where_only_high_acceptance_would_pay():
    auto = policy(EPYC_LIKE, 0.021, model=False)
    first = play(auto, COPIED, 32, accepted=32, verify=EPYC_LIKE)
    assert first.probe and first.drafted >= 1
    lengths = [play(auto, COPIED, 32, accepted=32, verify=EPYC_LIKE).drafted for _ in range(12)]
    assert lengths[-1] >= 15  # the copy was found and earns long drafts
    auto = policy(EPYC_LIKE, 0.021, model=False)
    missed = [play(auto, COPIED, 32, accepted=0, verify=EPYC_LIKE) for _ in range(100)]
    assert 1 <= sum(s.drafted > 0 for s in missed) <= 3  # a miss or two rule this kind of match out


def test_copied_text_earns_long_ngram_drafts_once_the_first_positions_hold():
    auto = policy(CPU_LIKE, 0.040, model=False)
    first = play(auto, COPIED, 32, accepted=32, verify=CPU_LIKE)
    assert first.probe and first.drafted <= 8  # nothing known yet: a short probe
    lengths = [play(auto, COPIED, 32, accepted=32, verify=CPU_LIKE).drafted for _ in range(12)]
    # each accepted probe of deeper positions makes them sure; a batch of 16 costs no more than one of 12 here
    assert lengths == sorted(lengths) and lengths[-1] >= 15
    misses = [play(auto, COPIED, 32, accepted=2, verify=CPU_LIKE).drafted for _ in range(8)]
    # The copy now breaks at position 3. While the positions after it are believed, a long draft is
    # still worth its chance; after a few misses the drafts shrink.
    assert misses[-1] <= 8
