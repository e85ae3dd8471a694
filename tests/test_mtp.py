"""Self-speculation with the target's own multi-token-prediction (MTP) block, on a tiny Qwen3.5-style GGUF
(a hybrid trunk and one MTP block): the output is the target's, greedy and sampled."""

import json

import pytest

from localspec import gguf_meta
from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
from localspec.engine.backend import LAST_HIDDEN, Context, Model
from localspec.engine.drafters import MtpDrafter, NoDrafter
from localspec.engine.speculative import generate
from localspec.errors import UsageError
from localspec.events import Step, Token
from localspec.session import Session
from localspec.stats import record

import test_lossless as lossless

GREEDY = Sampling(temperature=0)
SPECULATION = Speculation(draft_max=3, p_min=0.0)


@pytest.fixture(scope="module", params=["embedded", "sidecar"])
def mtp(tiny, request):
    """(target context keeping hidden states, MtpDrafter) on the tiny MTP model: its MTP block in the
    target's file, or in a sidecar file beside a target built without it."""
    if request.param == "embedded":
        model = block_model = Model(tiny["mtp"], load_mtp=True)
    else:
        model, block_model = Model(tiny["mtp_trunk"]), Model(tiny["mtp_sidecar"], load_mtp=True)
    target = Context(model, 512, 64, 2, max_outputs=64, keep_hidden=(LAST_HIDDEN,))
    block = Context(block_model, 512, 64, 2, max_outputs=64, mtp=True)
    yield target, MtpDrafter(target, block, 0.0)
    block.close()
    target.close()
    model.close()
    block_model.close()


def tokens_of(events) -> list[int]:
    return [e.id for e in events if isinstance(e, Token)]


def test_the_header_and_llama_cpp_agree_on_the_mtp_layer(tiny):
    assert Model(tiny["mtp"], load_mtp=True).mtp_layers == 1 and gguf_meta.read(tiny["mtp"]).mtp_layers == 1
    assert gguf_meta.read(tiny["target"]).mtp_layers == 0 and gguf_meta.read(tiny["mtp_trunk"]).mtp_layers == 0
    sidecar = gguf_meta.read(tiny["mtp_sidecar"])
    assert sidecar.mtp_sidecar and not gguf_meta.read(tiny["mtp"]).mtp_sidecar
    assert Model(tiny["mtp_sidecar"], load_mtp=True).mtp_layers == 1


def test_an_mtp_sidecar_given_as_the_draft_drafts_as_the_targets_own_mtp_layers(tiny, localspec):
    runtime = Runtime(ctx_size=512)
    with Session(tiny["mtp_trunk"], None, runtime, Speculation(DrafterKind.PLAIN)) as plain:
        prompt = plain.tokenize("the cat sat", raw=True)
        expected = record(plain.generate(prompt, GREEDY, Limits(40))).text
    fixed = Speculation(DrafterKind.DRAFT, draft_max=3, p_min=0.0)  # what --spec fixed makes of a draft file
    with Session(tiny["mtp_trunk"], tiny["mtp_sidecar"], runtime, fixed) as session:
        assert session.mode == DrafterKind.MTP and session.model_drafter is None
        assert "mtp-trunk.gguf" in session.describe()
        drafted = record(session.generate(prompt, GREEDY, Limits(40)))
    assert drafted.text == expected and drafted.drafters[DrafterKind.MTP].accepted > 0
    with pytest.raises(UsageError, match="give its MTP sidecar file"):
        Session(tiny["mtp_trunk"], None, runtime, Speculation(DrafterKind.MTP))
    done = localspec("run", tiny["mtp_trunk"], "--draft", tiny["mtp_sidecar"], "--spec", "fixed", "--p-min", "0",
                     "--temp", "0", "-p", "the cat sat", "--raw", "-n", "40", "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["text"] == expected and summary["stats"]["drafters"]["mtp"]["accepted"] > 0


def test_greedy_mtp_drafts_are_checked_by_the_target_and_the_output_is_plain_decodings(mtp, prompt):
    """The autouse fixture checks both caches after every step, as LOCALSPEC_DEBUG=1 does."""
    target, drafter = mtp
    limits = Limits(max_tokens=80)
    plain = tokens_of(generate(target, NoDrafter(), prompt, GREEDY, SPECULATION, limits))
    events = list(generate(target, drafter, prompt, GREEDY, SPECULATION, limits))
    assert tokens_of(events) == plain
    steps = [e for e in events if isinstance(e, Step)]
    assert {s.drafter for s in steps if s.drafted} == {DrafterKind.MTP}
    summary = record(events).summary()
    assert 0 < summary.accepted < summary.drafted  # kept and rolled back, in the hybrid trunk too


@pytest.mark.parametrize("setting", ["temperature 0.7", "llama.cpp defaults"])
def test_sampled_mtp_drafts_follow_the_target_distribution(mtp, prompt, setting):
    target, drafter = mtp
    sampling = lossless.SETTINGS[setting]
    counts = lossless.sample_counts(target, drafter, prompt, sampling)
    assert lossless.chi_square_p_value(counts, lossless.exact_distribution(target, prompt, sampling)) > lossless.ALPHA


def test_a_verifier_that_accepts_every_mtp_draft_fails_the_check(mtp, prompt, monkeypatch):
    monkeypatch.setattr(lossless.speculative, "accept", lambda token, p, q, rng: True)
    target, drafter = mtp
    sampling = lossless.SETTINGS["temperature 0.7"]
    counts = lossless.sample_counts(target, drafter, prompt, sampling)
    assert lossless.chi_square_p_value(counts, lossless.exact_distribution(target, prompt, sampling)) < lossless.ALPHA


def test_a_session_drafts_with_mtp_only_where_the_target_has_it(tiny):
    runtime = Runtime(ctx_size=512, threads=2)
    with Session(tiny["mtp"], None, runtime, Speculation(DrafterKind.MTP, p_min=0.0)) as session:
        assert session.mode == DrafterKind.MTP and "MTP" in session.describe()
        outcome = record(session.generate(session.tokenize("the cat", raw=False), GREEDY, Limits(max_tokens=30)))
        assert outcome.summary().drafters[DrafterKind.MTP].accepted > 0
    with pytest.raises(UsageError, match="no multi-token-prediction"):
        Session(tiny["target"], None, runtime, Speculation(DrafterKind.MTP))


def test_draft_mtp_from_the_command_line(localspec, cli, tiny):
    done = localspec("run", tiny["mtp"], "--draft", "mtp", "--p-min", "0", "--temp", "0", "-p", "the cat sat",
                     "-n", "40", "--json")
    assert done.returncode == 0, done.stderr.decode()
    result = json.loads(done.stdout)
    assert result["stats"]["tokens"] == 40 and result["stats"]["drafters"]["mtp"]["accepted"] > 0
    assert result["placement"]["drafting"] == "mtp"
    code, out, _ = cli("check", tiny["mtp"], "mtp", "--json")
    assert code == 0 and json.loads(out)["mtp_layers"] == 1
    code, _, err = cli("check", tiny["target"], "mtp")
    assert code == 1 and "no multi-token-prediction layers" in err


def test_auto_weighs_mtp_drafts_like_a_draft_models_and_the_output_stays_the_targets(mtp, prompt):
    from localspec.engine.drafters import NgramDrafter
    from localspec.engine.policy import AutoDrafter, Costs, DraftCosts

    target, drafter = mtp

    def auto(verify_seconds: dict[int, float]) -> AutoDrafter:
        level = verify_seconds[1]
        costs = Costs(level, {n: s / level for n, s in verify_seconds.items()},
                      {DrafterKind.MTP: DraftCosts(0.001 / level, 0.0002 / level)})
        return AutoDrafter(NgramDrafter(2, 4), [drafter], costs)

    limits = Limits(max_tokens=40)
    plain = tokens_of(generate(target, NoDrafter(), prompt, GREEDY, SPECULATION, limits))
    # verification as costly as the tokens it could save: plain steps only
    events = list(generate(target, auto({1: 0.05, 9: 0.45}), prompt, GREEDY, Speculation(p_min=0.0), limits))
    assert tokens_of(events) == plain and not record(events).summary().drafted
    # nearly free verification: the MTP block drafts, its acceptance learned under its own name
    events = list(generate(target, auto({1: 0.05, 9: 0.051}), prompt, GREEDY, Speculation(p_min=0.0), limits))
    assert tokens_of(events) == plain
    assert record(events).summary().drafters[DrafterKind.MTP].accepted > 0


def test_auto_may_draft_with_the_targets_mtp_layers_beside_a_draft_model(tiny):
    runtime = Runtime(ctx_size=512, threads=2)
    with Session(tiny["mtp"], None, runtime, Speculation(p_min=0.0)) as session:
        assert session.mode == DrafterKind.AUTO and "MTP" in session.describe()
        assert session._auto_drafter().costly == {DrafterKind.MTP: session.mtp_drafter}
        record(session.generate(session.tokenize("the cat", raw=False), GREEDY, Limits(max_tokens=20)))
    # a llama draft model shares the tiny models' tokenizer: both costly drafters are weighed
    with Session(tiny["mtp"], tiny["partial"], runtime, Speculation(p_min=0.0)) as session:
        assert set(session._auto_drafter().costly) == {DrafterKind.DRAFT, DrafterKind.MTP}
        assert session.describe().endswith("(auto: n-gram lookup, partial.gguf or its own MTP layers)")
        tokens = session.tokenize("the cat", raw=False)
        plain = tokens_of(generate(session.target, NoDrafter(), tokens, GREEDY, SPECULATION, Limits(max_tokens=30)))
        session.reset()
        assert tokens_of(session.generate(tokens, GREEDY, Limits(max_tokens=30))) == plain
