"""EAGLE-3 drafting (a drafter reading the target's hidden states, llama.cpp's draft-eagle3) on a tiny
llama target and a tiny eagle3 drafter: the output is the target's, greedy and sampled."""

import pytest

from localspec import compat, gguf_meta
from localspec.config import DrafterKind, Limits, Sampling, Speculation
from localspec.engine.backend import Context, Model
from localspec.engine.drafters import Eagle3Drafter, NoDrafter
from localspec.engine.speculative import generate
from localspec.events import Step, Token
from localspec.stats import record

import test_lossless as lossless

GREEDY = Sampling(temperature=0)
SPECULATION = Speculation(draft_max=3, p_min=0.0)


@pytest.fixture(scope="module")
def eagle3(tiny):
    """(target context keeping the layers' inputs the drafter reads, Eagle3Drafter)."""
    model, drafter_model = Model(tiny["eagle3_target"]), Model(tiny["eagle3"])
    target = Context(model, 512, 64, 2, max_outputs=64, keep_hidden=Eagle3Drafter.layers_read(model, drafter_model))
    context = Context(drafter_model, 512, 64, 2, max_outputs=64, beside=target)
    yield target, Eagle3Drafter(target, context, 0.0)
    context.close()
    target.close()
    model.close()
    drafter_model.close()


def tokens_of(events) -> list[int]:
    return [e.id for e in events if isinstance(e, Token)]


def test_the_header_and_llama_cpp_agree_on_the_layers_read(tiny):
    assert gguf_meta.read(tiny["eagle3"]).target_layers == (0, 1, 1) == Model(tiny["eagle3"]).target_layers
    assert gguf_meta.read(tiny["target"]).target_layers == ()
    report = compat.check(gguf_meta.read(tiny["eagle3_target"]), gguf_meta.read(tiny["eagle3"]))
    assert report.compatible, report.summary()
    refused = compat.check(gguf_meta.read(tiny["mtp_trunk"]), gguf_meta.read(tiny["eagle3"]))
    assert "'qwen35' graph does not hand out the layer inputs" in refused.summary()


def test_greedy_eagle3_drafts_are_checked_by_the_target_and_the_output_is_plain_decodings(eagle3, prompt):
    """The autouse fixture checks both caches after every step, as LOCALSPEC_DEBUG=1 does."""
    target, drafter = eagle3
    limits = Limits(max_tokens=80)
    plain = tokens_of(generate(target, NoDrafter(), prompt, GREEDY, SPECULATION, limits))
    events = list(generate(target, drafter, prompt, GREEDY, SPECULATION, limits))
    assert tokens_of(events) == plain
    steps = [e for e in events if isinstance(e, Step)]
    assert {s.drafter for s in steps if s.drafted} == {DrafterKind.EAGLE3}
    summary = record(events).summary()
    assert 0 < summary.accepted < summary.drafted
    assert any(s.accepted == s.drafted == 3 for s in steps)  # a whole draft kept: the next one starts past it


@pytest.mark.parametrize("setting", ["temperature 0.7", "llama.cpp defaults"])
def test_sampled_eagle3_drafts_follow_the_target_distribution(eagle3, prompt, setting):
    target, drafter = eagle3
    sampling = lossless.SETTINGS[setting]
    counts = lossless.sample_counts(target, drafter, prompt, sampling)
    assert lossless.chi_square_p_value(counts, lossless.exact_distribution(target, prompt, sampling)) > lossless.ALPHA


def test_a_verifier_that_accepts_every_eagle3_draft_fails_the_check(eagle3, prompt, monkeypatch):
    monkeypatch.setattr(lossless.speculative, "accept", lambda token, p, q, rng: True)
    target, drafter = eagle3
    sampling = lossless.SETTINGS["temperature 0.7"]
    counts = lossless.sample_counts(target, drafter, prompt, sampling)
    assert lossless.chi_square_p_value(counts, lossless.exact_distribution(target, prompt, sampling)) < lossless.ALPHA
