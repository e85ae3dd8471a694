"""The drafters published beside a target, each on tiny GGUFs of its architecture: the target's own MTP
block (embedded, or in a sidecar file), an EAGLE-3 drafter, a DFlash drafter and Gemma 4's assistant. For
each, the output is the target's: greedy text identical to plain decoding (every cache checked after every
step, as LOCALSPEC_DEBUG=1 does), and sampled drafts that follow the target's distribution, a test shown
able to fail by a verifier that accepts every draft."""

import json

import pytest

from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
from localspec.engine.backend import Context
from localspec.engine.hidden import LAST_HIDDEN
from localspec.engine.model import Model
from localspec.engine.drafters import AssistantDrafter, DFlashDrafter, Eagle3Drafter, MtpDrafter, NoDrafter
from localspec.engine.speculative import generate
from localspec.events import Step, Token
from localspec.request import Request
from localspec.session import Session
from localspec.stats import record

import test_lossless as lossless

GREEDY = Sampling(temperature=0)
SPECULATION = Speculation(draft_max=3, p_min=0.0)


def _mtp(tiny, target_name, block_name):
    model = Model(tiny[target_name], load_mtp=block_name is None)
    block_model = model if block_name is None else Model(tiny[block_name], load_mtp=True)
    target = Context(model, 512, 64, 2, max_outputs=64, keep_hidden=(LAST_HIDDEN,))
    return target, MtpDrafter(target, Context(block_model, 512, 64, 2, max_outputs=64, mtp=True), 0.0)


def _eagle3(tiny):
    model, drafter_model = Model(tiny["markov_target"]), Model(tiny["eagle3"])
    target = Context(model, 512, 64, 2, max_outputs=64, keep_hidden=Eagle3Drafter.layers_read(model, drafter_model))
    return target, Eagle3Drafter(target, Context(drafter_model, 512, 64, 2, max_outputs=64, beside=target), 0.0)


def _dflash(tiny):
    model, drafter_model = Model(tiny["markov_target"]), Model(tiny["dflash"])
    target = Context(model, 512, 64, 2, max_outputs=64, keep_hidden=drafter_model.target_layers)
    return target, DFlashDrafter(target, Context(drafter_model, 512, 64, 2, max_outputs=64, beside=target), 0.0)


def _assistant(tiny):
    model, assistant_model = Model(tiny["gemma4"]), Model(tiny["gemma4_assistant"])
    target = Context(model, 512, 64, 2, max_outputs=64, keep_hidden=(LAST_HIDDEN,))
    context = Context(assistant_model, 512, 64, 2, max_outputs=64, mtp=True, beside=target)
    return target, AssistantDrafter(target, context, 0.0)


DRAFTERS = {
    "mtp embedded": lambda tiny: _mtp(tiny, "mtp", None),
    "mtp sidecar": lambda tiny: _mtp(tiny, "mtp_trunk", "mtp_sidecar"),
    "eagle3": _eagle3,
    "dflash": _dflash,
    "gemma4 assistant": _assistant,
}


@pytest.fixture(scope="module", params=list(DRAFTERS))
def beside(tiny, request):
    """(target context keeping what the drafter reads, the drafter)."""
    target, drafter = DRAFTERS[request.param](tiny)
    yield target, drafter
    for context in (drafter.context, target):
        context.close()
    for model in {drafter.context.model, target.model}:
        model.close()


def tokens_of(events) -> list[int]:
    return [e.id for e in events if isinstance(e, Token)]


def test_greedy_drafts_are_checked_by_the_target_and_the_output_is_plain_decodings(beside, prompt):
    target, drafter = beside
    limits = Limits(max_tokens=80)
    plain = tokens_of(generate(target, NoDrafter(), prompt, GREEDY, SPECULATION, limits))
    events = list(generate(target, drafter, prompt, GREEDY, SPECULATION, limits))
    assert tokens_of(events) == plain
    steps = [e for e in events if isinstance(e, Step)]
    assert {s.drafter for s in steps if s.drafted} == {drafter.kind}
    summary = record(events).summary()
    assert 0 < summary.accepted < summary.drafted  # kept and taken back, in every cache
    assert any(s.accepted == s.drafted == 3 for s in steps)  # a whole draft kept: the next starts past it


@pytest.mark.parametrize("setting", ["temperature 0.7", "llama.cpp defaults"])
def test_sampled_drafts_follow_the_target_distribution(beside, prompt, setting):
    target, drafter = beside
    sampling = lossless.SETTINGS[setting]
    counts = lossless.sample_counts(target, drafter, prompt, sampling)
    assert lossless.chi_square_p_value(counts, lossless.exact_distribution(target, prompt, sampling)) > lossless.ALPHA


def test_a_verifier_that_accepts_every_draft_fails_the_check(beside, prompt, monkeypatch):
    monkeypatch.setattr(lossless.speculative, "accept", lambda token, p, q, rng: True)
    target, drafter = beside
    sampling = lossless.SETTINGS["temperature 0.7"]
    counts = lossless.sample_counts(target, drafter, prompt, sampling)
    assert lossless.chi_square_p_value(counts, lossless.exact_distribution(target, prompt, sampling)) < lossless.ALPHA


def test_auto_weighs_each_drafter_by_its_costs_and_the_output_stays_the_targets(beside, prompt):
    from localspec.engine.drafters import NgramDrafter
    from localspec.engine.costs import Costs, DraftCosts
    from localspec.engine.policy import AutoDrafter

    target, drafter = beside

    def auto(verify_seconds: dict[int, float]) -> AutoDrafter:
        level = verify_seconds[1]
        costs = Costs(level, {n: s / level for n, s in verify_seconds.items()},
                      {drafter.kind: DraftCosts(0.001 / level, 0.0002 / level)})
        return AutoDrafter(NgramDrafter(2, 4), [drafter], costs)

    limits = Limits(max_tokens=40)
    plain = tokens_of(generate(target, NoDrafter(), prompt, GREEDY, SPECULATION, limits))
    # verification as costly as the tokens it could save: plain steps only
    events = list(generate(target, auto({1: 0.05, 9: 0.45}), prompt, GREEDY, Speculation(p_min=0.0), limits))
    assert tokens_of(events) == plain and not record(events).summary().drafted
    # nearly free verification: the drafter drafts, its acceptance learned under its own name
    events = list(generate(target, auto({1: 0.05, 9: 0.051}), prompt, GREEDY, Speculation(p_min=0.0), limits))
    assert tokens_of(events) == plain
    assert record(events).summary().drafters[drafter.kind].accepted > 0


# a drafter's file given as the draft: (target, the file, the mode it drafts in, what the session says of it)
FILES = {
    "mtp sidecar": ("mtp_trunk", "mtp_sidecar", DrafterKind.MTP, "its MTP layers (mtp-trunk.gguf)"),
    "eagle3": ("markov_target", "eagle3", DrafterKind("eagle3"), "EAGLE-3 (eagle3-target.gguf)"),
    "dflash": ("markov_target", "dflash", DrafterKind("dflash"), "DFlash (dflash-target.gguf)"),
    "gemma4 assistant": ("gemma4", "gemma4_assistant", DrafterKind.MTP, "its assistant (mtp-gemma4.gguf)"),
}


@pytest.mark.parametrize("name", list(FILES))
def test_a_drafters_file_given_as_the_draft_drafts_as_its_kind_fixed_and_under_auto(tiny, localspec, name):
    target, draft, mode, described = FILES[name]
    runtime = Runtime(ctx_size=512)
    with Session(tiny[target], None, runtime, Speculation(DrafterKind.PLAIN)) as plain:
        prompt = plain.prompts.tokenize("the cat sat", raw=True)
        expected = record(plain.generate(Request(GREEDY, Limits(40), prompt=prompt))).text
    fixed = Speculation(DrafterKind.DRAFT, draft_max=3, p_min=0.0)  # what --spec fixed makes of a draft file
    with Session(tiny[target], tiny[draft], runtime, fixed) as session:
        assert session.mode == mode and DrafterKind.DRAFT not in session.drafting.costly and described in session.describe()
        drafted = record(session.generate(Request(GREEDY, Limits(40), prompt=prompt)))
        assert drafted.text == expected and drafted.drafters[mode].accepted > 0
        session.use(DrafterKind.AUTO)  # which times the drafter first
        assert record(session.generate(Request(GREEDY, Limits(40), prompt=prompt))).text == expected
    done = localspec("run", tiny[target], "--draft", tiny[draft], "--spec", "fixed", "--p-min", "0", "--temp", "0",
                     "-p", "the cat sat", "--raw", "-n", "40", "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["text"] == expected and summary["placement"]["drafting"] == mode
    assert summary["stats"]["drafters"][mode]["accepted"] > 0
