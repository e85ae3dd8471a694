"""Predicted outputs: the text the user expects drafts wherever the output follows it."""

import pytest

from localspec.config import DrafterKind, Limits, Sampling, Speculation
from localspec.engine.drafters import (EDIT_MATCH, EDIT_REACH, MIN_OFFER, PREDICTION_MIN_MATCH, Draft, NoDrafter,
                                       PredictionDrafter)
from localspec.engine.speculative import generate
from localspec.errors import UsageError
from localspec.events import Step, Token
from localspec.stats import record

PROMPT = [1, 2, 3]


class Fallback:
    """The generation's own drafter: proposes a marker, and remembers what it was shown."""

    kind = DrafterKind.NGRAM

    def begin(self, prompt, sampling, rng):
        self.observed = []

    def propose(self, history, k):
        return Draft([99] * min(k, 1), source=self.kind)

    def observe(self, step):
        self.observed.append(step)


def started(prediction, then=None, limit=3):
    drafter = PredictionDrafter(prediction, then or Fallback(), limit)
    drafter.begin(PROMPT, Sampling(), None)
    return drafter


def test_from_the_start_it_offers_the_prediction_and_longer_drafts_as_the_output_keeps_following():
    prediction = list(range(10, 60))
    drafter = started(prediction)
    assert drafter.propose(PROMPT, 32).tokens == prediction[:MIN_OFFER]
    history = PROMPT + prediction[:12]  # twelve tokens followed it
    assert drafter.propose(history, 32).tokens == prediction[12:24]
    assert drafter.propose(history, 5).tokens == prediction[12:17]  # k caps it
    assert drafter.propose(PROMPT + prediction, 32).tokens == [99]  # its end: the generation's own drafter


def test_after_an_edit_two_tokens_just_past_it_are_enough_to_go_on():
    prediction = list(range(10, 60))
    drafter = started(prediction)
    history = PROMPT + prediction[:5] + [7, 7]  # tokens 15 and 16 replaced
    assert drafter.propose(history, 32).tokens == [99]
    history += prediction[7:8]  # one token of the text after the edit: not yet enough
    assert drafter.propose(history, 32).tokens == [99]
    history += prediction[8:9]
    assert drafter.propose(history, 32).tokens == prediction[9 : 9 + MIN_OFFER]


def test_further_away_it_waits_for_a_longer_match_then_goes_on_from_there():
    prediction = list(range(10, 60))
    drafter = started(prediction)
    far = 5 + EDIT_REACH + EDIT_MATCH + 1  # beyond the reach of an edit's short match
    history = PROMPT + prediction[:5] + [7, 7]
    history += prediction[far : far + PREDICTION_MIN_MATCH - 1]
    assert drafter.propose(history, 32).tokens == [99]
    history += prediction[far + PREDICTION_MIN_MATCH - 1 : far + PREDICTION_MIN_MATCH]
    at = far + PREDICTION_MIN_MATCH
    assert drafter.propose(history, 32).tokens == prediction[at : at + PREDICTION_MIN_MATCH]


def test_a_repeated_passage_is_found_again_after_the_departure_not_before():
    passage = [50, 51, 52, 53]
    prediction = passage + [1] + list(range(20, 30)) + passage + [2]
    drafter = started(prediction)
    history = PROMPT + prediction[:12] + [7] + passage  # departs at 12, then writes the passage
    assert drafter.propose(history, 32).tokens == [2]


def test_the_generations_own_drafter_learns_from_its_own_steps_only():
    fallback = Fallback()
    drafter = started([10, 11, 12], fallback)
    drafter.observe(Step(DrafterKind.PREDICTION, 3, 3, 0.0, 0.0))
    drafter.observe(Step(DrafterKind.NGRAM, 1, 0, 0.0, 0.0))
    assert [step.drafter for step in fallback.observed] == [DrafterKind.NGRAM]


def test_a_prediction_is_no_mode_of_its_own():
    for kind in (DrafterKind.PREDICTION, DrafterKind.SUFFIX):
        with pytest.raises(UsageError, match="is not a way to draft on its own"):
            Speculation(drafting=kind)


def greedy(target, drafter, prompt, max_tokens=40):
    events = list(generate(target, drafter, prompt, Sampling(temperature=0), Speculation(p_min=0.0),
                           Limits(max_tokens=max_tokens)))
    return [e.id for e in events if isinstance(e, Token)], record(events).summary()


def test_the_output_is_the_targets_with_a_right_a_wrong_and_an_edited_prediction(target, prompt):
    plain, _ = greedy(target, NoDrafter(), prompt)
    right, summary = greedy(target, PredictionDrafter(plain, NoDrafter(), 0), prompt)
    assert right == plain
    taken = summary.drafters[DrafterKind.PREDICTION]
    assert taken.accepted == taken.drafted and summary.steps <= len(plain) // 3  # drafts grow as it holds
    wrong = [(token + 7) % target.model.n_vocab for token in plain]
    assert greedy(target, PredictionDrafter(wrong, NoDrafter(), 0), prompt)[0] == plain
    edited = plain[:10] + wrong[10:14] + plain[14:]
    tokens, summary = greedy(target, PredictionDrafter(edited, NoDrafter(), 0), prompt)
    assert tokens == plain and summary.drafters[DrafterKind.PREDICTION].accepted > 20


def test_an_edit_seen_twice_is_made_in_the_rest_of_the_prediction():
    old, new = [70, 71], [80]
    line = [10, 11, 12, 13]
    prediction = (line + old + [20, 21, 22, 23]) * 4
    drafter = started(prediction)
    history = list(PROMPT)
    for _ in range(2):  # the answer makes the edit twice
        history += line + new + [20, 21, 22, 23]
        drafter.propose(history, 32)
    assert drafter.propose(history, 32).tokens == line  # as far as the answer has followed it: four tokens
    history += line
    assert drafter.propose(history, 32).tokens[:5] == new + [20, 21, 22, 23]  # the third occurrence, edited
    assert old[0] not in drafter.prediction[drafter.at :]
