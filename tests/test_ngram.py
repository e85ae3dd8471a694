from hypothesis import given, settings
from hypothesis import strategies as st

from localspec.config import Sampling
from localspec.engine.drafters import MIN_OFFER, Agreement, NgramDrafter


def started(n_min=1, n_max=3, prompt=()):
    drafter = NgramDrafter(n_min, n_max)
    drafter.begin(list(prompt), Sampling(), None)
    return drafter


def test_copies_what_followed_the_latest_earlier_match():
    history = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert started().propose(history, 3).tokens == [7, 8, 5]


def test_prefers_the_longest_matching_suffix():
    # "3" alone last occurred before 6; "2 3" last occurred before 4
    history = [2, 3, 4, 5, 3, 6, 2, 3]
    assert started(1, 2).propose(history, 1).tokens == [4]
    assert started(1, 1).propose(history, 1).tokens == [6]


def test_never_matches_the_suffix_itself_and_stops_at_the_end_of_history():
    assert started().propose([1, 2, 3], 4).tokens == []
    assert started().propose([5, 6, 5], 4).tokens == [6, 5]


def test_no_match_proposes_nothing_and_draft_is_capped_at_k():
    assert started(2, 3).propose([1, 2, 3, 4], 4).tokens == []
    assert started().propose([1, 2, 3, 4, 5, 1, 2], 2).tokens == [3, 4]


def test_a_generation_copies_only_its_new_tokens():
    drafter = started(2, 2)
    history = list(range(1000)) + [10, 11]
    assert drafter.propose(history, 2).tokens == [12, 13]
    history += [12, 13]  # the accepted continuation
    copied = drafter._text
    assert drafter.propose(history, 2).tokens == [14, 15]
    assert drafter._text is copied  # (room to grow: the 1,002 tokens held were not copied again)


def occurrences_by_definition(history: list[int], n: int) -> list[int]:
    """Where each earlier occurrence of the last n tokens ends, a token following it."""
    return [end for end in range(n, len(history)) if len(history) >= n and history[end - n : end] == history[-n:]]


@given(st.lists(st.integers(0, 3), max_size=80), st.sampled_from([(1, 1), (1, 3), (2, 4), (3, 6)]))
@settings(max_examples=300, deadline=None)
def test_the_search_finds_every_earlier_occurrence_of_each_n_gram(history, shape):
    drafter = started(*shape)
    found = drafter._occurrences(history, drafter._copy(history))
    for n in range(shape[0], shape[1] + 1):
        assert found.get(n, []) == occurrences_by_definition(history, n)


def test_a_match_offers_as_many_tokens_as_it_already_runs_back():
    drafter = NgramDrafter(2, 4)
    drafter.begin([], None, None)
    chance = [9, 1, 2, 10, 11, 12, 13, 14, 15, 16, 17, 3, 1, 2]  # "1 2" matched by chance
    assert drafter.propose(chance, 8).tokens == [10, 11, 12, 13][:MIN_OFFER]
    drafter.begin([], None, None)
    copied = list(range(20, 40)) + list(range(20, 30))  # ten tokens of a run repeated so far
    assert drafter.propose(copied, 8).tokens == list(range(30, 38))
    assert drafter.propose(copied, 32).tokens == list(range(30, 40))  # capped by the run length: 10


def test_agreement_of_earlier_occurrences_is_part_of_the_evidence():
    assert started(2, 2).propose([1, 2, 3, 1, 2], 1).evidence.agreement == Agreement.SEEN_ONCE
    assert started(2, 2).propose([1, 2, 3, 1, 2, 3, 1, 2], 1).evidence.agreement == Agreement.AGREE
    assert started(2, 2).propose([1, 2, 3, 1, 2, 4, 1, 2], 1).evidence.agreement == Agreement.DIFFER


# A chat's next turn, or an agent's next request, goes on from the text the drafter searched last; any other prompt
# (a shorter one, another conversation on the sequence) is another text: each proposes what a new drafter would.
@given(st.lists(st.tuples(st.sampled_from(["goes on", "edited", "shorter", "another"]),
                          st.lists(st.integers(0, 5), max_size=40), st.lists(st.integers(0, 5), max_size=30)),
                min_size=1, max_size=6),
       st.sampled_from([(1, 3, 0, False), (2, 4, 2, False), (1, 4, 2, True)]))
@settings(max_examples=200, deadline=None)
def test_a_drafter_used_before_proposes_what_a_new_one_would(requests, shape):
    kept, history = NgramDrafter(*shape), []
    for how, added, generated in requests:
        if how == "edited" and len(history) > 1:  # (the last token indexed, the one before the last step's, changed)
            history[-2] = (history[-2] + 1) % 6
        prompt = (history + added if how in ("goes on", "edited") else history[: len(history) // 2]
                  if how == "shorter" else added) or [0]
        fresh = NgramDrafter(*shape)
        for drafter in (kept, fresh):
            drafter.begin(list(prompt), Sampling(), None)
        history = list(prompt)
        for token in [*generated, 0]:  # (a step a token: proposals at every length of the generation)
            assert kept.propose(history, 6) == fresh.propose(history, 6)
            history.append(token)
