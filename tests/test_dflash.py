"""DFlash drafting (a block-diffusion drafter reading the target's hidden states, llama.cpp's draft-dflash)
on a tiny llama target and a tiny dflash drafter: the output is the target's, greedy and sampled."""

import json
from dataclasses import replace

import pytest

from localspec import compat, gguf_meta
from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
from localspec.engine.backend import Context, Model
from localspec.engine.drafters import DFlashDrafter, NoDrafter
from localspec.engine.speculative import generate
from localspec.events import Step, Token
from localspec.session import Session
from localspec.stats import record

import test_lossless as lossless

GREEDY = Sampling(temperature=0)
SPECULATION = Speculation(draft_max=3, p_min=0.0)


@pytest.fixture(scope="module")
def dflash(tiny):
    """(target context keeping the layers' inputs the drafter reads, DFlashDrafter)."""
    model, drafter_model = Model(tiny["markov_target"]), Model(tiny["dflash"])
    target = Context(model, 512, 64, 2, max_outputs=64, keep_hidden=drafter_model.target_layers)
    context = Context(drafter_model, 512, 64, 2, max_outputs=64, beside=target)
    yield target, DFlashDrafter(target, context, 0.0)
    context.close()
    target.close()
    model.close()
    drafter_model.close()


def tokens_of(events) -> list[int]:
    return [e.id for e in events if isinstance(e, Token)]


def test_the_drafter_reads_its_block_size_and_mask_from_its_file(dflash, tiny):
    _, drafter = dflash
    assert (drafter.block, drafter.mask) == (4, 0)
    assert gguf_meta.read(tiny["dflash"]).target_layers == (0, 1)
    target, drafter = gguf_meta.read(tiny["markov_target"]), gguf_meta.read(tiny["dflash"])
    report = compat.check(target, drafter)
    assert report.compatible and "the inputs of target layers 0, 1" in {rule.detail for rule in report.rules}
    # DSpark (a Markov head) and DFlash2 (a selector) draft otherwise, and are refused; so is a drafter with no mask
    dspark = replace(drafter, tensor_names=drafter.tensor_names | {"markov_w1.weight"})
    dflash2 = replace(drafter, metadata={**drafter.metadata, "dflash.selector_top_k": 8})
    unmasked = replace(drafter, metadata={k: v for k, v in drafter.metadata.items() if "mask_token" not in k})
    for refused, why in ((dspark, "DSpark or DFlash2"), (dflash2, "DSpark or DFlash2"), (unmasked, "no mask token")):
        assert why in compat.check(target, refused).summary()


def test_greedy_dflash_drafts_are_checked_by_the_target_and_the_output_is_plain_decodings(dflash, prompt):
    """The autouse fixture checks both caches after every step, as LOCALSPEC_DEBUG=1 does."""
    target, drafter = dflash
    limits = Limits(max_tokens=80)
    plain = tokens_of(generate(target, NoDrafter(), prompt, GREEDY, SPECULATION, limits))
    events = list(generate(target, drafter, prompt, GREEDY, SPECULATION, limits))
    assert tokens_of(events) == plain
    steps = [e for e in events if isinstance(e, Step)]
    assert {s.drafter for s in steps if s.drafted} == {DrafterKind.DFLASH}
    summary = record(events).summary()
    assert 0 < summary.accepted < summary.drafted
    assert any(s.accepted == s.drafted == 3 for s in steps)


def test_a_draft_is_never_longer_than_the_block_allows(dflash, prompt):
    target, drafter = dflash
    events = list(generate(target, drafter, prompt, GREEDY, Speculation(draft_max=8, p_min=0.0), Limits(40)))
    assert max(e.drafted for e in events if isinstance(e, Step)) == 3


@pytest.mark.parametrize("setting", ["temperature 0.7", "llama.cpp defaults"])
def test_sampled_dflash_drafts_follow_the_target_distribution(dflash, prompt, setting):
    target, drafter = dflash
    sampling = lossless.SETTINGS[setting]
    counts = lossless.sample_counts(target, drafter, prompt, sampling)
    assert lossless.chi_square_p_value(counts, lossless.exact_distribution(target, prompt, sampling)) > lossless.ALPHA


def test_a_verifier_that_accepts_every_dflash_draft_fails_the_check(dflash, prompt, monkeypatch):
    monkeypatch.setattr(lossless.speculative, "accept", lambda token, p, q, rng: True)
    target, drafter = dflash
    sampling = lossless.SETTINGS["temperature 0.7"]
    counts = lossless.sample_counts(target, drafter, prompt, sampling)
    assert lossless.chi_square_p_value(counts, lossless.exact_distribution(target, prompt, sampling)) < lossless.ALPHA


def test_a_dflash_file_given_as_the_draft_drafts_with_dflash_fixed_or_under_auto(tiny, localspec):
    runtime = Runtime(ctx_size=512)
    with Session(tiny["markov_target"], None, runtime, Speculation(DrafterKind.PLAIN)) as plain:
        prompt = plain.tokenize("the cat sat", raw=True)
        expected = record(plain.generate(prompt, GREEDY, Limits(40))).text
    fixed = Speculation(DrafterKind.DRAFT, draft_max=3, p_min=0.0)  # what --spec fixed makes of a draft file
    with Session(tiny["markov_target"], tiny["dflash"], runtime, fixed) as session:
        assert session.mode == DrafterKind.DFLASH and "DFlash (dflash-target.gguf)" in session.describe()
        drafted = record(session.generate(prompt, GREEDY, Limits(40)))
        assert drafted.text == expected and drafted.drafters[DrafterKind.DFLASH].accepted > 0
        session.use(DrafterKind.AUTO)
        assert record(session.generate(prompt, GREEDY, Limits(40))).text == expected
    done = localspec("run", tiny["markov_target"], "--draft", tiny["dflash"], "--spec", "fixed", "--p-min", "0",
                     "--temp", "0", "-p", "the cat sat", "--raw", "-n", "40", "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["text"] == expected and summary["stats"]["drafters"]["dflash"]["accepted"] > 0
    assert summary["placement"]["drafting"] == "dflash"
