"""Predicted outputs: the text the user expects drafts wherever the output follows it."""

import pytest

from localspec.config import DrafterKind, Limits, Sampling, Speculation
from localspec.engine.backend import Context
from localspec.engine.drafters.spec import check_mode
from localspec.engine.drafters import (EDIT_MATCH, EDIT_REACH, MIN_OFFER, PREDICTION_MIN_MATCH, Draft, NoDrafter,
                                       PredictionDrafter)
from localspec.engine.model import Model
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
            check_mode(Speculation(drafting=kind).drafting)


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


def test_where_an_edit_seen_once_could_come_again_both_sides_are_drafted_as_a_tree():
    old, new = [70, 71], [80]
    line = [10, 11, 12, 13]
    prediction = (line + old + [20, 21, 22, 23]) * 4
    drafter = PredictionDrafter(prediction, Fallback(), 3, forks=1)
    drafter.begin(PROMPT, Sampling(), None)
    history = PROMPT + line + new + [20, 21, 22, 23] + line  # the edit made once, then the line again
    drafter.propose(PROMPT + line + new + [20, 21], 32)  # (the output found again past the edit)
    draft = drafter.propose(history, 8)
    assert draft.tokens == old + [20, 21, 22, 23, 10, 11]  # the prediction as it stands: the chain
    (other,) = draft.alternatives  # the edit made again, from the fork on
    assert (other.fork, other.tokens) == (0, (80, 20, 21, 22, 23, 10, 11, 12))  # as many as offered
    assert draft.tree is not None and len(draft.tree.leaves()) == 2 and max(draft.tree.depths()) == 7
    assert started(prediction).propose(history, 8).tree is None  # no forks asked for


def test_a_prediction_fork_keeps_greedy_output_the_targets(load, prompt):
    target = load("target")
    plain = [e.id for e in generate(target, NoDrafter(), prompt, Sampling(temperature=0.0), Speculation(),
                                     Limits(max_tokens=32)) if isinstance(e, Token)]
    # the answer with a token it writes twice "renamed" in both places: the answer's first occurrence
    # shows the edit once, and at the second the tree holds both sides
    first, second = next((i, j) for i in range(2, len(plain)) for j in range(i + 4, len(plain) - 2)
                         if plain[i] == plain[j])
    renamed = list(plain)
    renamed[first] = renamed[second] = 5 if plain[first] != 5 else 6
    model = Model(target.model.path)
    branching = Context(model, 256, 64, threads=2, max_outputs=64, branches=2)
    try:
        events = list(generate(branching, PredictionDrafter(renamed, NoDrafter(), 0, forks=1), prompt,
                               Sampling(temperature=0.0), Speculation(), Limits(max_tokens=32)))
    finally:
        branching.close()
        model.close()
    assert [e.id for e in events if isinstance(e, Token)] == plain
    assert any(e.rank == 2 for e in events if isinstance(e, Step))  # the edited side was the target's
