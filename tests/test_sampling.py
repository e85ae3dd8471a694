"""The logits transform and the rejection rule, on small arrays."""

import numpy as np
import pytest

from localspec.config import Sampling
from localspec.engine.adjustments import Adjustments
from localspec.engine.sampling import Dist, accept, one_hot, residual, softmax, transform
from localspec.errors import UsageError


def reference(logits, s: Sampling) -> np.ndarray:
    """Dense, obvious version of llama.cpp's chain: top-k, top-p, min-p, then temperature."""
    order = np.argsort(-logits, kind="stable")
    keep = len(logits) if s.top_k == 0 else s.top_k
    kept = order[:keep]
    probs = np.exp(logits[kept] - logits[kept].max())
    probs /= probs.sum()
    if s.top_p < 1:
        cut = next(i for i, c in enumerate(np.cumsum(probs)) if c >= s.top_p) + 1
        kept, probs = kept[:cut], probs[:cut]
    if s.min_p > 0:
        survive = probs >= s.min_p * probs[0]
        kept = kept[survive]
    dense = np.zeros(len(logits))
    weights = np.exp((logits[kept] - logits[kept].max()) / s.temperature)
    dense[kept] = weights / weights.sum()
    return dense


def dense(dist: Dist, n: int) -> np.ndarray:
    out = np.zeros(n)
    out[dist.ids] = dist.probs
    return out


SETTINGS = [
    Sampling(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
    Sampling(temperature=0.5, top_k=0, top_p=1.0, min_p=0.0),
    Sampling(temperature=1.3, top_k=3, top_p=1.0, min_p=0.0),
    Sampling(temperature=1.0, top_k=0, top_p=0.7, min_p=0.0),
    Sampling(temperature=0.8, top_k=0, top_p=1.0, min_p=0.2),
    Sampling(temperature=0.8, top_k=6, top_p=0.9, min_p=0.05),
]


@pytest.mark.parametrize("s", SETTINGS)
def test_transform_matches_the_dense_reference(s):
    rng = np.random.default_rng(0)
    for _ in range(20):
        logits = (rng.standard_normal(50) * 2).astype(np.float32)
        np.testing.assert_allclose(dense(transform(logits, s), 50), reference(logits.astype(np.float64), s), atol=1e-12)


def test_top_p_keeps_the_token_that_crosses_the_threshold():
    logits = np.log(np.array([0.5, 0.3, 0.2], dtype=np.float32))
    dist = transform(logits, Sampling(temperature=1.0, top_k=0, top_p=0.6, min_p=0.0))
    assert sorted(dist.ids.tolist()) == [0, 1]


def test_sampling_from_a_distribution_hits_its_probabilities():
    dist = Dist(np.array([4, 9, 2]), np.array([0.2, 0.5, 0.3]))
    rng = np.random.default_rng(1)
    draws = np.array([dist.sample(rng) for _ in range(20000)])
    for token, p in zip([4, 9, 2], [0.2, 0.5, 0.3]):
        assert abs((draws == token).mean() - p) < 0.015


def test_probability_lookups():
    dist = Dist(np.array([7, 3, 5]), np.array([0.5, 0.3, 0.2]))
    assert dist.prob(3) == 0.3 and dist.prob(4) == 0.0
    np.testing.assert_allclose(dist.probs_of(np.array([5, 8, 7, 0])), [0.2, 0.0, 0.5, 0.0])
    wide = Dist(np.arange(1000, 0, -1), np.full(1000, 0.001))  # (past a list search's few dozen: numpy's)
    assert (wide.at(1), wide.at(1000), wide.at(0)) == (999, 0, None) and wide.prob(500) == 0.001


def test_residual_is_the_normalised_positive_part_of_p_minus_q():
    p = Dist(np.array([0, 1, 2]), np.array([0.5, 0.3, 0.2]))
    q = Dist(np.array([0, 2, 3]), np.array([0.7, 0.1, 0.2]))
    r = residual(p, q)
    np.testing.assert_allclose(dense(r, 4), np.array([0.0, 0.3, 0.1, 0.0]) / 0.4)


def test_residual_of_a_one_hot_draft_removes_that_token():
    p = Dist(np.array([0, 1, 2]), np.array([0.5, 0.3, 0.2]))
    np.testing.assert_allclose(dense(residual(p, one_hot(1)), 3), [0.5 / 0.7, 0.0, 0.2 / 0.7])
    np.testing.assert_allclose(dense(residual(p, one_hot(9)), 3), [0.5, 0.3, 0.2])  # (p(9) = 0: no rejection)


def test_accept_probability_is_min_one_p_over_q():
    rng = np.random.default_rng(2)
    p = Dist(np.array([0, 1]), np.array([0.2, 0.8]))
    q = Dist(np.array([0, 1]), np.array([0.8, 0.2]))
    assert np.mean([accept(0, p, q, rng) for _ in range(20000)]) == pytest.approx(0.25, abs=0.015)
    assert all(accept(1, p, q, rng) for _ in range(1000))
    assert not any(accept(5, p, q, rng) for _ in range(100))


def test_accept_then_residual_reproduces_p_exactly():
    # One draft position, exact arithmetic: P(out = x) = q(x) min(1, p/q) + P(reject) r(x) = p(x).
    p = np.array([0.1, 0.4, 0.3, 0.2])
    q = np.array([0.4, 0.1, 0.3, 0.2])
    accepted = q * np.minimum(1, p / q)
    rejected = 1 - accepted.sum()
    r = np.maximum(p - q, 0) / np.maximum(p - q, 0).sum()
    np.testing.assert_allclose(accepted + rejected * r, p)


def test_softmax_of_surviving_candidates():
    dist = softmax(np.array([9, 4, 7]), np.log(np.array([0.6, 0.3, 0.1], dtype=np.float32)) / 0.5)
    np.testing.assert_allclose(dist.probs, np.array([0.36, 0.09, 0.01]) / 0.46, rtol=1e-6)
    assert dist.ids.tolist() == [9, 4, 7]


@pytest.mark.parametrize(
    "kwargs", [dict(temperature=-1), dict(top_k=-2), dict(top_p=0.0), dict(top_p=1.5), dict(min_p=1.0)]
)
def test_invalid_sampling_values_are_refused(kwargs):
    with pytest.raises(UsageError):
        Sampling(**kwargs)


@pytest.mark.parametrize("size", [40, 49152, 152064, 151936 + 7])
@pytest.mark.parametrize("k", [1, 5, 10, 40])
def test_the_top_k_superset_holds_the_k_highest_and_all_tied_with_the_kth(size, k):
    from localspec.engine.chain import top_k_superset

    rng = np.random.default_rng(size + k)
    rows = [rng.normal(0, 3, size).astype(np.float32),
            np.round(rng.normal(0, 2, size)).astype(np.float32),  # many ties, at the k-th too
            np.full(size, -np.inf, np.float32)]
    few = min(size, k + 3)
    rows[2][rng.choice(size, few, replace=False)] = rng.normal(size=few)  # masked tokens but a few
    rows.append(np.sort(rows[0]))  # the highest entries all in the tail end of the row
    for row in rows:
        ids = top_k_superset(row, k)
        if ids is None:
            assert size // 2 < 4 * k
            continue
        kth = np.sort(row)[-k]
        assert set(np.flatnonzero(row >= kth)) <= set(ids.tolist())
        assert len(set(ids.tolist())) == len(ids)  # each entry once: the chain must not see duplicates
        assert len(ids) < max(size // 8, 4 * k) or (row == kth).sum() > k  # and few others


def test_no_top_k_means_no_superset():
    from localspec.engine.chain import top_k_superset

    assert top_k_superset(np.zeros(152064, np.float32), 0) is None


def penalised_reference(logits, before, s: Sampling) -> np.ndarray:
    """llama.cpp's penalties sampler, token by token over its window."""
    out = logits.astype(np.float64).copy()
    window = list(before) if s.repeat_last_n < 0 else list(before)[max(0, len(before) - s.repeat_last_n):]
    for token in set(window):
        count = window.count(token)
        out[token] = out[token] * s.repeat_penalty if out[token] <= 0 else out[token] / s.repeat_penalty
        out[token] -= count * s.frequency_penalty + s.presence_penalty
    return out


@pytest.mark.parametrize("s", [
    Sampling(repeat_penalty=1.3, repeat_last_n=4),
    Sampling(frequency_penalty=0.7, presence_penalty=-0.4, repeat_last_n=6),
    Sampling(repeat_penalty=0.8, frequency_penalty=-1.0, presence_penalty=2.0, repeat_last_n=-1),
])
def test_penalties_match_llama_cpps_over_the_window_the_drafted_tokens_end(s):
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 2, 20).astype(np.float32)
    history, drafted = [3, 5, 5, 0, 19, 5, 7], [7, 3]
    row = logits.copy()
    Adjustments(s).apply(row, history, drafted)
    assert np.allclose(row, penalised_reference(logits, history + drafted, s), atol=1e-5)


def test_penalties_leave_tokens_outside_a_shorter_vocabulary_alone():
    row = np.zeros(4, np.float32)
    Adjustments(Sampling(presence_penalty=1.0)).apply(row, [1, 9], [])  # a draft model's row: 9 is past its end
    assert row.tolist() == [0, -1, 0, 0]


def test_a_logit_bias_comes_before_the_penalties_as_in_llama_cpps_chain():
    s = Sampling(logit_bias=[(2, 1.0), (3, -np.inf), (9, 4.0), (2, 0.5)], repeat_penalty=2.0, repeat_last_n=-1)
    row = np.array([1.0, 1.0, -1.0, 5.0], np.float32)
    Adjustments(s).apply(row, [2], [])  # 2 is biased twice to 0.5, then halved; 9 is past a draft's vocabulary
    assert row.tolist() == [1.0, 1.0, 0.25, -np.inf]


def test_ignore_eos_bans_the_models_ends_over_any_bias_on_them():
    row = np.zeros(5, np.float32)
    Adjustments(Sampling(ignore_eos=True, logit_bias=((4, 9.0), (1, 2.0))), eog=(0, 4)).apply(row, [], [])
    assert row.tolist() == [-np.inf, 2.0, 0.0, 0.0, -np.inf]


def test_a_logit_bias_is_pairs_of_a_token_and_a_number_or_minus_infinity():
    assert Sampling(logit_bias={7: -2}).logit_bias == ((7, -2.0),) and Sampling(logit_bias=[(7, 1)]).adjusted
    assert Sampling(ignore_eos=True).adjusted and not Sampling(logit_bias=()).adjusted
    assert Sampling(logit_bias={"Hello": -1}).logit_bias == (("Hello", -1.0),)  # a text, resolved by a session
    # llama-server's (JSON's) spellings: a key of digits is an id, false bans
    assert Sampling(logit_bias={"15": 2, "x1": False}).logit_bias == ((15, 2.0), ("x1", -np.inf))
    for wrong in ([(-1, 1.0)], {"-1": 1}, [(3, np.inf)], [(3, np.nan)], [(3, "2")], [("", 1.0)], [(7.0, 1.0)],
                  [(3, True)], [3], ["abc"], 5):
        with pytest.raises(UsageError) as refused:
            Sampling(logit_bias=wrong)
        assert refused.value.setting == "logit_bias"


def test_only_penalties_that_change_a_logit_count():
    assert not Sampling().penalized and Adjustments.of(Sampling()) is None
    assert not Sampling(repeat_penalty=1.5, repeat_last_n=0).penalized
    assert Sampling(presence_penalty=0.1).penalized
    for wrong in ({"repeat_penalty": 0}, {"repeat_last_n": -2}, {"frequency_penalty": float("nan")}):
        with pytest.raises(UsageError):
            Sampling(**wrong)
