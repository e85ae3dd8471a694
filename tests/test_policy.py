"""The auto policy: its choices on synthetic costs (pure logic), and calibration on a tiny model."""

import pytest

from localspec.config import Sampling
from localspec.engine.drafters import Draft, NgramDrafter
from localspec.engine.policy import LONGER_AFTER, AutoDrafter, Costs, Estimate, calibrate
from localspec.events import Step


class FakeModel:
    name = "draft"

    def __init__(self):
        self.asked = []

    def begin(self, prompt, sampling, rng):
        pass

    def catch_up(self, history):
        pass

    def propose(self, history, k):
        self.asked.append(k)
        return Draft([7] * k, source="draft")


def costs(verify: dict[int, float], draft_per_token: float) -> Costs:
    return Costs(verify={n: Estimate(s) for n, s in verify.items()}, draft={1: Estimate(draft_per_token)})


GPU_LIKE = {1: 0.020, 9: 0.022}  # verifying 8 more tokens costs almost nothing
CPU_LIKE = {1: 0.066, 2: 0.097, 4: 0.113, 8: 0.201, 16: 0.252, 32: 0.436}  # the 2-core dev box, Qwen 1.5B


def policy(verify, draft_per_token, model=True):
    auto = AutoDrafter(NgramDrafter(2, 4), FakeModel() if model else None, costs(verify, draft_per_token))
    auto.begin([1, 2, 3], Sampling(), None)
    return auto


def test_expected_tokens_is_one_plus_the_chain_of_acceptances():
    auto = policy(CPU_LIKE, 0.04)
    auto.acceptance["draft"] = [Estimate(0.9), Estimate(0.5)]
    assert auto.expected_tokens("draft", 2) == pytest.approx([1 + 0.9, 1 + 0.9 + 0.45])


def test_cheap_verification_drafts_several_tokens_with_the_draft_model():
    auto = policy(GPU_LIKE, 0.002)
    draft = auto.propose([1, 2, 3, 4], 8)
    # prior acceptance 0.8: the expected gain per extra token shrinks geometrically, the cost does not
    assert draft.source == "draft" and 4 <= len(draft.tokens) <= 8
    auto.acceptance["draft"] = [Estimate(0.99) for _ in range(8)]
    assert len(auto.propose([1, 2, 3, 4], 8).tokens) == 8


def test_expensive_verification_and_drafting_fall_back_to_plain_decoding():
    auto = policy(CPU_LIKE, 0.040)
    assert auto.propose([1, 2, 3, 4], 8).tokens == []
    assert auto.model.asked == []


def test_an_ngram_match_is_used_when_verifying_it_pays():
    auto = policy(CPU_LIKE, 0.040)
    auto.acceptance["ngram"] = [Estimate(0.95) for _ in range(8)]
    history = [5, 6, 7, 8, 9, 10, 11, 12, 13, 5, 6, 7]
    draft = auto.propose(history, 8)
    assert draft.source == "ngram" and draft.tokens == [8, 9, 10, 11, 12, 13, 5, 6][: len(draft.tokens)]
    assert len(draft.tokens) >= 3


def test_observations_move_acceptance_and_costs_for_positions_actually_tried():
    auto = policy(CPU_LIKE, 0.040)
    auto.observe(Step("draft", drafted=4, accepted=1, draft_seconds=0.2, verify_seconds=0.13))
    rates = [e.value for e in auto.acceptance["draft"]]
    assert rates[0] > 0.8 and rates[1] < 0.8  # position 1 accepted, position 2 rejected
    assert rates[2:] == [] or all(r == 0.8 for r in rates[2:])  # positions 3 and 4 were never reached
    # n=5 was observed: its estimate now exists and moved from the interpolated 0.135 s toward 0.13 s
    assert 5 in auto.costs.verify and 0.13 < auto.costs.verify_seconds(5) < 0.135
    assert auto.costs.draft_seconds(4) < 0.2


def test_a_long_plain_streak_triggers_a_short_exploration_of_the_draft_model():
    auto = policy(CPU_LIKE, 0.040)
    choices = [auto.propose([1, 2, 3, 4], 8).source for _ in range(300)]
    assert choices.count("draft") == 1 and auto.model.asked == [3]


def test_an_ngram_match_passed_over_repeatedly_is_tried_again():
    auto = policy(CPU_LIKE, 0.040, model=False)
    auto.acceptance["ngram"] = [Estimate(0.1) for _ in range(8)]  # after a bad patch
    history = [5, 6, 7, 8, 9, 10, 11, 12, 13, 5, 6, 7]
    sources = [auto.propose(history, 8).source for _ in range(8)]
    assert sources == ["none"] * 7 + ["ngram"]


def test_calibration_times_powers_of_two_and_leaves_the_caches_empty(load):
    target, draft = load("target"), load("same")
    target.prefill([1, 2, 3])
    costs = calibrate(target, draft, max_batch=33)
    assert sorted(costs.verify) == [1, 2, 4, 8, 16, 32] and list(costs.draft) == [1]
    assert all(e.value > 0 for e in costs.verify.values())
    assert target.tokens == [] and draft.tokens == []
    assert costs.verify_seconds(33) == pytest.approx(costs.verify[32].value * 33 / 32)


def test_copied_text_earns_long_ngram_drafts_once_the_first_positions_hold():
    auto = policy(CPU_LIKE, 0.040, model=False)
    text = list(range(100, 140))
    history = text + text[:16]  # the answer has repeated 16 tokens of its input so far
    assert len(auto.propose(history, 32).tokens) <= 8  # prior 0.5 per position: short drafts only
    for _ in range(6):  # a few fully accepted short drafts
        auto.observe(Step("ngram", drafted=3, accepted=3, draft_seconds=0.0, verify_seconds=0.113))
    # positions never tried are taken to be as good as the deepest tried one
    assert len(auto.propose(history, 32).tokens) == 15  # a batch of 16 costs no more than one of 12 here
    auto.observe(Step("ngram", drafted=15, accepted=2, draft_seconds=0.0, verify_seconds=0.252))
    assert len(auto.propose(history, 32).tokens) <= 7  # the miss at position 3 counts


def test_a_long_match_cut_short_repeatedly_is_tried_longer_to_recheck_big_batch_costs():
    misjudged = {**CPU_LIKE, 16: 1.0, 32: 2.0}  # as if big batches were timed on a busy machine
    auto = policy(misjudged, 0.040, model=False)
    auto.acceptance["ngram"] = [Estimate(0.97) for _ in range(8)]
    text = list(range(100, 140))
    history = text + text[:16]
    lengths = [len(auto.propose(history, 32).tokens) for _ in range(LONGER_AFTER)]
    assert lengths[:-1] == [lengths[0]] * (LONGER_AFTER - 1) and 4 <= lengths[0] <= 8
    assert lengths[-1] == 2 * lengths[0]
    auto.acceptance["ngram"] = [Estimate(0.97)] * 4 + [Estimate(0.05)] * 28  # deep positions learned elsewhere
    lengths = [len(auto.propose(history, 32).tokens) for _ in range(LONGER_AFTER)]
    assert lengths[-1] == 2 * lengths[0] and lengths[0] <= 4
    auto.acceptance["ngram"] = [Estimate(0.5) for _ in range(8)]  # not copying: no such tries
    assert all(len(auto.propose(history, 32).tokens) <= 8 for _ in range(2 * LONGER_AFTER))
