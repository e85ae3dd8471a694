"""Gemma 4's assistant drafter (llama.cpp runs it as its MTP drafter: a model of its own, reading the
target's hidden state and KV cache) on a tiny gemma4 target: the output is the target's, greedy and sampled."""

import json

import pytest

from localspec import compat, gguf_meta
from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
from localspec.engine.backend import LAST_HIDDEN, Context, Model
from localspec.engine.drafters import AssistantDrafter, NoDrafter
from localspec.engine.speculative import generate
from localspec.events import Step, Token
from localspec.session import Session
from localspec.stats import record

import test_lossless as lossless

GREEDY = Sampling(temperature=0)
SPECULATION = Speculation(draft_max=3, p_min=0.0)


@pytest.fixture(scope="module")
def assistant(tiny):
    """(target context keeping its last hidden states, AssistantDrafter)."""
    model, assistant_model = Model(tiny["gemma4"]), Model(tiny["gemma4_assistant"])
    target = Context(model, 512, 64, 2, max_outputs=64, keep_hidden=(LAST_HIDDEN,))
    context = Context(assistant_model, 512, 64, 2, max_outputs=64, mtp=True, beside=target)
    yield target, AssistantDrafter(target, context, 0.0)
    context.close()
    target.close()
    model.close()
    assistant_model.close()


def tokens_of(events) -> list[int]:
    return [e.id for e in events if isinstance(e, Token)]


def test_greedy_assistant_drafts_are_checked_by_the_target_and_the_output_is_plain_decodings(assistant, prompt):
    """The autouse fixture checks the target's cache after every step, as LOCALSPEC_DEBUG=1 does."""
    target, drafter = assistant
    limits = Limits(max_tokens=80)
    plain = tokens_of(generate(target, NoDrafter(), prompt, GREEDY, SPECULATION, limits))
    events = list(generate(target, drafter, prompt, GREEDY, SPECULATION, limits))
    assert tokens_of(events) == plain
    steps = [e for e in events if isinstance(e, Step)]
    assert {s.drafter for s in steps if s.drafted} == {DrafterKind.MTP}
    summary = record(events).summary()
    assert 0 < summary.accepted < summary.drafted
    assert any(s.accepted == s.drafted == 3 for s in steps)


@pytest.mark.parametrize("setting", ["temperature 0.7", "llama.cpp defaults"])
def test_sampled_assistant_drafts_follow_the_target_distribution(assistant, prompt, setting):
    target, drafter = assistant
    sampling = lossless.SETTINGS[setting]
    counts = lossless.sample_counts(target, drafter, prompt, sampling)
    assert lossless.chi_square_p_value(counts, lossless.exact_distribution(target, prompt, sampling)) > lossless.ALPHA


def test_a_verifier_that_accepts_every_assistant_draft_fails_the_check(assistant, prompt, monkeypatch):
    monkeypatch.setattr(lossless.speculative, "accept", lambda token, p, q, rng: True)
    target, drafter = assistant
    sampling = lossless.SETTINGS["temperature 0.7"]
    counts = lossless.sample_counts(target, drafter, prompt, sampling)
    assert lossless.chi_square_p_value(counts, lossless.exact_distribution(target, prompt, sampling)) < lossless.ALPHA


def test_the_assistant_given_as_the_draft_drafts_as_the_targets_mtp_block(tiny, localspec, cli):
    runtime = Runtime(ctx_size=512)
    with Session(tiny["gemma4"], None, runtime, Speculation(DrafterKind.PLAIN)) as plain:
        prompt = plain.tokenize("the cat sat", raw=True)
        expected = record(plain.generate(prompt, GREEDY, Limits(40))).text
    fixed = Speculation(DrafterKind.DRAFT, draft_max=3, p_min=0.0)  # what --spec fixed makes of a draft file
    with Session(tiny["gemma4"], tiny["gemma4_assistant"], runtime, fixed) as session:
        assert session.mode == DrafterKind.MTP and "its assistant (mtp-gemma4.gguf)" in session.describe()
        drafted = record(session.generate(prompt, GREEDY, Limits(40)))
        assert drafted.text == expected and drafted.drafters[DrafterKind.MTP].accepted > 0
        session.use(DrafterKind.AUTO)  # which times the assistant's drafting first
        assert record(session.generate(prompt, GREEDY, Limits(40))).text == expected
    done = localspec("run", tiny["gemma4"], "--draft", tiny["gemma4_assistant"], "--p-min", "0", "--temp", "0",
                     "-p", "the cat sat", "--raw", "-n", "40", "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["text"] == expected and summary["stats"]["drafters"]["mtp"]["accepted"] > 0
    code, out, _ = cli("check", tiny["gemma4"], tiny["gemma4_assistant"], "--json")
    assert code == 0 and {rule["name"] for rule in json.loads(out)["rules"]} >= {"target's cache"}
    report = compat.check(gguf_meta.read(tiny["target"]), gguf_meta.read(tiny["gemma4_assistant"]))
    assert "reads a gemma4 target's KV cache, not a 'llama' one's" in report.summary()
