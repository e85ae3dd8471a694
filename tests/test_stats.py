import json
import pytest

from localspec.events import Candidate, Done, Logprobs, Prefill, Reading, Step, Token, from_wire, to_wire
from localspec.stats import INTERRUPTED, Recorder, record


def fold(events, decode_seconds=1.0):
    """The summary of a generation of these events that decoded for decode_seconds."""
    return record([*events, Done("length", "", decode_seconds)]).summary()


def test_summary_is_a_fold_over_events():
    events = [
        Prefill(12, 4, 0.5),
        Step("draft", 3, 2, 0.01, 0.02), Token(1, "a", True), Token(2, "b", True), Token(3, "c", False),
        Step("draft", 2, 0, 0.01, 0.02), Token(4, "d", False),
        Step("draft", 0, 0, 0.0, 0.02), Token(5, "e", False),
    ]
    s = fold(events, decode_seconds=2.5)
    assert (s.tokens, s.steps, s.drafted, s.accepted) == (5, 3, 5, 2)
    assert s.acceptance_rate == pytest.approx(0.4)
    assert s.mean_accepted_length == pytest.approx(5 / 3)
    assert s.per_position_acceptance == [0.5, 0.5, 0.0]
    assert s.tokens_per_second == pytest.approx(2.0)
    assert (s.prompt_tokens, s.reused_prompt_tokens, s.prefill_seconds) == (12, 4, 0.5)
    assert s.draft_seconds == pytest.approx(0.02) and s.verify_seconds == pytest.approx(0.06)
    # the plain step's target pass took 0.02 s, so 5 plain tokens: 0.10 s instead of the 0.08 s spent
    assert s.estimated_speedup == pytest.approx(0.10 / 0.08)


def test_an_answer_that_ends_inside_its_draft_settles_no_own_token_on_its_last_step():
    """The engine records such a step with accepted = what the answer took and own_taken False: tau counts what was
    settled (CI read 1.1 from a real run where every step's own token counted would have said 1.2)."""
    events = [Step("ngram", 0, 0, 0.0, 0.02), Token(1, "a", False),
              Step("ngram", 4, 2, 0.0, 0.02, own_taken=False), Token(2, "b", True), Token(3, ".", True)]
    s = fold(events)
    assert (s.tokens, s.steps, s.accepted) == (3, 2, 2)
    assert s.mean_accepted_length == pytest.approx(3 / 2)


def test_a_plain_run_is_estimated_at_exactly_one():
    # the second step settled the end-of-generation token: no Token event
    events = [Step("plain", 0, 0, 0.0, 0.05), Token(1, "a", False), Step("plain", 0, 0, 0.0, 0.05)]
    assert fold(events, 0.1).estimated_speedup == pytest.approx(1.0)


def test_empty_summary_has_no_division_by_zero():
    s = Recorder().summary()
    assert s.acceptance_rate == 0.0 and s.mean_accepted_length == 0.0 and s.tokens_per_second == 0.0
    assert s.estimated_speedup is None


def test_acceptance_by_position_range_groups_long_drafts_by_doubling_ranges():
    rows = fold([Step("ngram", drafted=20, accepted=10, draft_seconds=0.0, verify_seconds=0.1),
                 Step("ngram", drafted=6, accepted=6, draft_seconds=0.0, verify_seconds=0.1)]).acceptance_by_position_range()
    assert [positions for positions, _ in rows] == ["1", "2", "3", "4", "5-8", "9-16", "17-20"]
    assert rows[4][1] == pytest.approx((4 + 2) / (4 + 2))  # positions 5-8: 4 of the long draft, 2 of the short
    assert rows[5][1] == pytest.approx(2 / 8) and rows[6][1] == 0.0


def test_each_drafter_has_its_own_steps_and_probes_and_what_lost_probes_cost():
    plain = 0.05  # what a plain step was expected to cost when each probe was made
    s = fold([
        Step("ngram", 4, 4, 0.0, 0.10, probe=True, plain_seconds=plain),  # 5 tokens for 0.10 s: paid
        Step("ngram", 3, 0, 0.0, 0.09, probe=True, plain_seconds=plain),  # 1 token for 0.09 s: lost 0.04 s
        Step("ngram", 8, 8, 0.0, 0.20),  # a sure draft
        Step("draft", 2, 1, 0.03, 0.07, catch_up_seconds=0.01, probe=True, plain_seconds=plain),  # lost 0.0 s
        Step("plain", 0, 0, 0.0, 0.05),
    ])
    ngram, draft = s.drafters["ngram"], s.drafters["draft"]
    assert set(s.drafters) == {"ngram", "draft"}  # plain steps are no drafter's
    assert (ngram.steps, ngram.drafted, ngram.accepted, ngram.probes, ngram.probes_lost) == (3, 15, 12, 2, 1)
    assert ngram.probe_lost_seconds == pytest.approx(0.04) and ngram.seconds == pytest.approx(0.39)
    assert (draft.steps, draft.probes, draft.probes_lost, draft.catch_up_seconds) == (1, 1, 0, 0.01)
    assert s.probe_lost_seconds == pytest.approx(0.04)
    as_json = s.as_dict()
    assert as_json["drafters"]["ngram"]["probes_lost"] == 1 and as_json["probe_lost_seconds"] == pytest.approx(0.04)


def test_the_recorder_folds_text_finish_and_several_generations():
    recorder = Recorder()
    first = [Prefill(3, 0, 0.1), Step("ngram", 2, 2, 0.0, 0.1), Token(1, "Hel", True), Token(2, "lo", True),
             Token(3, "", False), Done("stop", " you", 0.5)]
    for event in first:
        recorder.add(event)
    assert (recorder.text, recorder.finish_reason) == ("Hello you", "stop")
    for event in [Prefill(9, 3, 0.2), Step("plain", 0, 0, 0.0, 0.1), Token(4, "Hi", False), Done("length", "", 0.25)]:
        recorder.add(event)
    s = recorder.summary()
    # text and finish reason are the latest generation's; counts and times add up over both
    assert (recorder.text, recorder.finish_reason) == ("Hi", "length")
    assert (s.tokens, s.steps, s.prompt_tokens, s.reused_prompt_tokens) == (4, 2, 12, 3)
    assert s.decode_seconds == pytest.approx(0.75) and s.prefill_seconds == pytest.approx(0.3)


def test_an_interrupted_generation_ends_where_it_got_and_its_time_stops_counting():
    recorder = Recorder()
    for event in [Prefill(3, 0, 0.1), Step("ngram", 1, 1, 0.0, 0.1), Token(1, "a", True)]:
        recorder.add(event)
    assert recorder.finish_reason is None and recorder.summary().decode_seconds > 0  # still running
    recorder.interrupt()
    stopped_at = recorder.summary().decode_seconds
    assert (recorder.text, recorder.finish_reason) == ("a", INTERRUPTED)
    assert recorder.summary().decode_seconds == stopped_at and recorder.summary().tokens == 1


def test_tree_steps_are_counted_by_their_depth_and_the_branch_they_kept():
    events = [
        Step("ngram", 7, 3, 0.0, 0.05, branches=3, depth=4, rank=2), Token(1, "a", True), Token(2, "b", True),
        Token(3, "c", True), Token(4, "d", False),
        Step("ngram", 5, 1, 0.0, 0.05, branches=2, depth=3, rank=1), Token(5, "e", True), Token(6, "f", False),
        Step("ngram", 3, 3, 0.0, 0.05), Token(7, "g", True), Token(8, "h", True), Token(9, "i", True),
        Token(10, "j", False),
    ]
    s = fold(events)
    assert (s.trees.steps, s.trees.nodes, s.trees.depth, s.trees.branches, s.trees.accepted) == (2, 12, 7, 5, 4)
    assert s.trees.wins == {2: 1, 1: 1} and s.trees.off_the_bet == 1
    # a tree's positions are its depth, not its size: position 4 was reached by the first tree alone
    assert s.per_position_drafted == [3, 3, 3, 1] and s.per_position_acceptance == [1.0, 2 / 3, 2 / 3, 0.0]
    assert s.as_dict()["trees"]["off_the_bet"] == 1


def test_a_prefills_prompt_logprobs_go_over_the_wire_and_back():
    """serve's own stream carries an echoed prompt's logprobs to a remote run, the first's None."""
    prefill = Prefill(3, 0, 0.5, (Logprobs(Candidate(1, b"a", None)),
                                  Logprobs(Candidate(2, b"\xe2\x82", -0.5), (Candidate(2, b"\xe2\x82", -0.5),))))
    assert from_wire(json.loads(json.dumps(to_wire(prefill)))) == prefill
    assert from_wire({"event": "prefill", "prompt_tokens": 3, "reused_tokens": 0, "seconds": 0.5}).logprobs == ()


def test_a_long_prompts_reading_and_an_answers_end_token_go_over_the_wire_and_back():
    """(a remote run shows the reading as a local one does) and a Recorder keeps the ids and the ending token."""
    events = [Reading(64, 100, 10, 0.5), Prefill(100, 10, 0.8), Token(7, "a", False), Token(8, "b", True),
              Done("stop", "", 0.1, end_token=2)]
    assert [from_wire(json.loads(json.dumps(to_wire(event)))) for event in events] == events
    recorder = record(events)
    assert (recorder.ids, recorder.end_token, recorder.prompt_tokens) == ([7, 8], 2, 100)
