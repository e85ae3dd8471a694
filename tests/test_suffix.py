import numpy as np
import pytest

from localspec.engine import suffix
from localspec.engine.suffix import NO_DRAFT, SuffixCache
from localspec.request import Request


def cache_of(*generations, **settings):
    cache = SuffixCache(**settings)
    for generation in generations:
        cache.add(generation)
    return cache


def test_an_empty_cache_proposes_nothing_and_holds_next_to_nothing():
    cache = SuffixCache()
    assert cache.propose([1, 2, 3]) == NO_DRAFT
    assert cache.propose([]) == NO_DRAFT
    assert cache.tokens == 0
    assert cache.nbytes < 1024


def test_the_longest_match_wins_over_shorter_ones():
    # "3" alone was followed by 4 more often, but "2 3" was followed only by 9
    cache = cache_of([3, 4, 0], [3, 4, 0], [3, 4, 0], [2, 3, 9, 0])
    draft = cache.propose([7, 2, 3])
    assert (draft.tokens[0], draft.match, draft.support) == (9, 2, 1)
    shorter = cache.propose([7, 5, 3])
    assert (shorter.tokens[0], shorter.match, shorter.support) == (4, 1, 4)
    assert shorter.probabilities[0] == 0.75


def test_a_match_shorter_than_asked_drafts_nothing_but_says_how_far_it_matched():
    """Most tails of a text match a token or so of a large cache by chance: such a match costs no walk (on
    20 random generations of 300 tokens a lookup took 41 us, 13 us with the one-token matches cut short)."""
    cache = cache_of([3, 4, 0], [3, 4, 0], [3, 4, 0], [2, 3, 9, 0])
    assert cache.propose([7, 5, 3], shortest=2) == suffix.SuffixDraft([], [], 1, 4)
    assert cache.propose([7, 2, 3], shortest=2).tokens[0] == 9


def test_frequency_decides_between_continuations():
    cache = cache_of(*[[1, 2, 3, 10, 11]] * 3, [1, 2, 3, 20, 21])
    draft = cache.propose([0, 1, 2, 3])
    assert draft.tokens == [10, 11]
    assert draft.probabilities == [0.75, 1.0]
    assert (draft.match, draft.support) == (3, 4)
    assert draft.reach == [0.75, 0.75]


def test_equal_counts_go_to_the_most_recent_continuation():
    assert cache_of([1, 2, 5], [1, 2, 6]).propose([1, 2]).tokens[0] == 6
    assert cache_of([1, 2, 6], [1, 2, 5]).propose([1, 2]).tokens[0] == 5


def test_the_draft_stops_before_its_estimated_probability_falls_below_the_threshold():
    # after "1 2 3": 10 then 11 (4 of 5), then 12 or 13 half and half: 0.8 x 0.5 = 0.4
    generations = [[1, 2, 3, 10, 11, 12, 14]] * 2 + [[1, 2, 3, 10, 11, 13, 14]] * 2 + [[1, 2, 3, 20]]
    bold = cache_of(*generations, min_probability=0.3).propose([1, 2, 3])
    assert bold.tokens == [10, 11, 13, 14]  # a tie goes to the most recent
    assert bold.reach == pytest.approx([0.8, 0.8, 0.4, 0.4])
    cautious = cache_of(*generations, min_probability=0.45).propose([1, 2, 3])
    assert cautious.tokens == [10, 11]
    assert cautious.probabilities == [0.8, 1.0]


def test_the_draft_is_capped_by_alpha_times_the_match_and_by_the_hard_and_the_callers_limits():
    cache = cache_of(list(range(100)), alpha=2.0, max_draft=6)
    assert cache.propose([7, 50, 51]).tokens == [52, 53, 54, 55]  # match 2 -> 4 tokens
    assert cache.propose([49, 50, 51]).tokens == [52, 53, 54, 55, 56, 57]  # match 3 -> 6, the hard cap
    assert cache.propose([49, 50, 51], limit=2).tokens == [52, 53]
    assert cache.propose([49, 50, 51], limit=0) == suffix.SuffixDraft([], [], match=3, support=1)
    assert len(cache_of(list(range(100)), alpha=1.5).propose([48, 49, 50, 51]).tokens) == 6


def test_the_match_is_at_most_depth_tokens_long():
    draft = cache_of(list(range(100)), depth=5).propose(list(range(40)))
    assert (draft.match, draft.tokens[:2]) == (5, [40, 41])


def test_no_match_or_continuation_runs_across_generations():
    cache = cache_of([5, 6, 7], [8, 9, 1])
    # "7 8" never occurred inside one generation; "8" alone did
    draft = cache.propose([7, 8])
    assert (draft.match, draft.tokens) == (1, [9, 1])
    # what followed "6 7" was the end of its generation, not the next one's start
    assert cache.propose([6, 7]).tokens == []
    assert cache.propose([6, 7]).match == 2


def test_the_oldest_generations_are_dropped_past_the_cap_and_memory_is_reported():
    cache = SuffixCache(max_tokens=32)
    cache.add([1, 2, 3, 4] + [0] * 6)
    cache.add([50, 51, 52, 53] + [0] * 6)
    cache.add([60, 61, 62, 63] + [0] * 6)
    assert cache.tokens == 30
    assert cache.propose([1, 2]).tokens == [3, 4, 0, 0]
    held = cache.nbytes
    cache.add([70, 71, 72, 73] + [0] * 6)  # 40 > 32: down to 30 (15/16 of the cap), the oldest first
    assert cache.tokens == 30
    assert cache.propose([1, 2]) == NO_DRAFT
    assert cache.propose([50, 51]).tokens[:2] == [52, 53]
    assert cache.propose([70, 71]).tokens[:2] == [72, 73]
    assert 0 < cache.nbytes <= held + 1024


def test_memory_stays_bounded_over_many_generations():
    rng = np.random.default_rng(1)
    cache = SuffixCache(max_tokens=5_000)
    sizes = []
    for _ in range(200):
        cache.add(rng.integers(0, 1000, size=int(rng.integers(1, 300))).tolist())
        assert cache.tokens <= 5_000
        sizes.append(cache.nbytes)
    assert max(sizes) < 5_000 * (cache.width + 8 + 4) * 3


def test_a_generation_longer_than_the_cap_keeps_its_end():
    cache = SuffixCache(max_tokens=10)
    cache.add(list(range(100)))
    assert cache.tokens == 10
    assert cache.propose([92, 93]).tokens == [94, 95, 96, 97]
    assert cache.propose([80, 81]) == NO_DRAFT


def test_token_ids_outside_the_key_encoding_are_refused():
    with pytest.raises(ValueError):
        SuffixCache().add([1, -1])
    with pytest.raises(ValueError):
        SuffixCache().add([suffix.MAX_TOKEN_ID + 1])
    SuffixCache().add([suffix.MAX_TOKEN_ID, 262_143])


def test_keys_order_tokens_by_id_whatever_their_bytes():
    # ids whose +1 has zero bytes inside (255 -> 00 01 00) must still match only themselves
    cache = cache_of([255, 0, 65535, 7], [0, 255, 65535, 8])
    assert cache.propose([0, 65535]).tokens == [7]
    assert cache.propose([255, 65535]).tokens == [8]


def small_vocabulary_generations(rng, count):
    """Generations from a few templates with changes, so matches are long, branch and repeat."""
    templates = [rng.integers(0, 6, size=int(rng.integers(5, 40))) for _ in range(4)]
    generations = []
    for _ in range(count):
        generation = templates[int(rng.integers(len(templates)))].copy()
        changed = rng.random(len(generation)) < 0.15
        generation[changed] = rng.integers(0, 6, size=int(changed.sum()))
        generations.append(generation.tolist())
    return generations


@pytest.mark.parametrize("seed", range(3))
def test_adding_one_by_one_answers_exactly_as_one_bulk_build(seed, monkeypatch):
    # A tiny recent tier makes the one-by-one cache merge into its sealed tier many times.
    monkeypatch.setattr(suffix, "RECENT_ENTRIES", 50)
    rng = np.random.default_rng(seed)
    generations = small_vocabulary_generations(rng, 120)
    settings = {"depth": 6, "sample": 4, "min_probability": 0.05}
    growing = SuffixCache(**settings)
    probes = [rng.integers(0, 6, size=int(rng.integers(1, 10))).tolist() for _ in range(60)]
    recent_in_play = 0
    for done, generation in enumerate(generations, start=1):
        growing.add(generation)
        if done % 20 == 0:
            bulk = SuffixCache(**settings)
            bulk.extend(generations[:done])
            assert len(growing.sealed) and len(bulk.sealed) == bulk.tokens
            recent_in_play += bool(len(growing.recent))
            for context in probes + [g[: int(rng.integers(1, len(g)))] for g in generations[:done:7]]:
                assert growing.propose(context) == bulk.propose(context), context
    assert recent_in_play  # both of the growing cache's tiers answered


def occurrences(generations, tail):
    """What followed each occurrence of tail inside one generation (None: its end)."""
    n = len(tail)
    return [g[i + n] if i + n < len(g) else None
            for g in generations for i in range(len(g) - n + 1) if g[i : i + n] == tail]


def test_the_match_and_the_first_frequency_follow_a_brute_force_count():
    rng = np.random.default_rng(7)
    generations = small_vocabulary_generations(rng, 30)
    cache = cache_of(*generations, depth=8, sample=10_000, min_probability=0.0, alpha=1.0)
    contexts = [rng.integers(0, 6, size=int(rng.integers(1, 12))).tolist() for _ in range(60)]
    contexts += [g[: int(rng.integers(1, len(g)))] + rng.integers(0, 6, size=int(rng.integers(0, 3))).tolist()
                 for g in generations]
    for context in contexts:
        draft = cache.propose(context)
        match = draft.match
        if match < min(8, len(context)):
            assert not occurrences(generations, context[-match - 1 :]), context
        if not match:
            assert draft == NO_DRAFT
            continue
        followers = occurrences(generations, context[-match:])
        assert draft.support == len(followers)
        if draft.tokens:
            counts = {t: followers.count(t) for t in set(followers) - {None}}
            assert counts[draft.tokens[0]] == max(counts.values())
            assert draft.probabilities[0] == counts[draft.tokens[0]] / len(followers)


def test_the_drafter_names_its_evidence_as_ngram_lookup_does():
    from localspec.config import DrafterKind
    from localspec.engine.drafters import Agreement, RunClass, SuffixDrafter

    cache = SuffixCache()
    for ending in ([20, 21], [20, 21], [20, 22]):
        cache.add(list(range(1, 11)) + ending)
    drafter = SuffixDrafter(cache)
    draft = drafter.propose([50, 51] + list(range(1, 11)), 4)
    assert draft.source == DrafterKind.SUFFIX and draft.tokens[:1] == [20] and draft.run == 10
    assert draft.evidence.run == RunClass.FROM_8 and draft.evidence.agreement == Agreement.AGREE
    assert drafter.propose([50, 9, 10], 4).evidence.agreement == Agreement.AGREE
    cache.add([60, 61, 62])
    assert drafter.propose([5, 60, 61], 4).evidence.agreement == Agreement.SEEN_ONCE
    assert drafter.propose([5, 6, 99, 61], 4).tokens == []  # a one-token match is chance


def test_a_session_drafts_an_answer_again_from_its_earlier_generation_and_says_the_same(tiny):
    from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
    from localspec.session import Session
    from localspec.stats import record

    def twice(suffix_cache: bool):
        speculation = Speculation(drafting=DrafterKind.AUTO, suffix_cache=suffix_cache)
        with Session(tiny["target"], None, Runtime(ctx_size=512), speculation) as session:
            tokens = session.prompts.tokenize("the cat sat", raw=True)
            return [record(session.generate(Request(Sampling(temperature=0), Limits(max_tokens=48), prompt=tokens)))
                    for _ in range(2)]

    first, again = twice(suffix_cache=True)
    assert again.text == first.text
    assert DrafterKind.SUFFIX not in first.summary().drafters  # nothing earlier to draft from
    assert again.summary().drafters[DrafterKind.SUFFIX].accepted >= 24
    off = twice(suffix_cache=False)
    assert off[1].text == first.text and DrafterKind.SUFFIX not in off[1].summary().drafters


def test_bench_gives_each_mode_its_own_earlier_generations(tiny):
    from localspec import bench
    from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
    from localspec.session import Session

    prompt = bench.Prompt([{"role": "user", "content": "the cat sat"}])
    with Session(tiny["target"], None, Runtime(ctx_size=512), Speculation(drafting=DrafterKind.AUTO)) as session:
        def rows(prompts):
            found = bench.run(session, {"set": prompts}, [DrafterKind.PLAIN, DrafterKind.AUTO, "auto-no-suffix"],
                              Sampling(temperature=0), Limits(max_tokens=32), lambda text: None)
            return {row["mode"]: row for row in found}

        assert DrafterKind.SUFFIX not in rows([prompt])["auto"]["drafters"]  # plain's answer just before is not auto's
        # a prompt again: auto drafts it from its own first answer; auto-no-suffix, beside it, from nothing earlier
        again = rows([prompt, prompt])
        assert again["auto"]["drafters"][DrafterKind.SUFFIX]["accepted"] >= 16
        assert again["auto"]["accepted_shares"][DrafterKind.SUFFIX] > 0.5
        assert DrafterKind.SUFFIX not in again["auto-no-suffix"]["drafters"]
        assert again["auto-no-suffix"]["tokens"] == again["auto"]["tokens"] == 64
