"""EAGLE-3 drafting (a drafter reading the target's hidden states, llama.cpp's draft-eagle3) on a tiny
llama target and a tiny eagle3 drafter: the output is the target's, greedy and sampled."""

import json
from dataclasses import replace

import pytest

from localspec import compat, gguf_meta
from localspec.gguf_meta import RawArray
from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
from localspec.engine.backend import Context, Model
from localspec.engine.drafters import Eagle3Drafter, NoDrafter
from localspec.engine.speculative import generate
from localspec.errors import UsageError
from localspec.events import Step, Token
from localspec.session import Session
from localspec.stats import record

import test_lossless as lossless
from tinybert import write_tiny_bert

GREEDY = Sampling(temperature=0)
SPECULATION = Speculation(draft_max=3, p_min=0.0)


@pytest.fixture(scope="module")
def eagle3(tiny):
    """(target context keeping the layers' inputs the drafter reads, Eagle3Drafter)."""
    model, drafter_model = Model(tiny["markov_target"]), Model(tiny["eagle3"])
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
    report = compat.check(gguf_meta.read(tiny["markov_target"]), gguf_meta.read(tiny["eagle3"]))
    assert report.compatible, report.summary()
    # qwen35 hands out its layers' inputs too; a drafter trained on another width, or reading past the
    # target's layers, is refused
    assert compat.check(gguf_meta.read(tiny["mtp_trunk"]), gguf_meta.read(tiny["eagle3"])).compatible
    drafter = gguf_meta.read(tiny["eagle3"])
    wider = replace(drafter, metadata={**drafter.metadata, "eagle3.target_hidden_size": 128})
    target = gguf_meta.read(tiny["markov_target"])
    assert "trained on hidden states 128 wide, the target's are 64" in compat.check(target, wider).summary()
    deeper = replace(drafter, metadata={**drafter.metadata, "eagle3.target_layers": RawArray(5, 3, 0, 0, (0, 1, 2))})
    assert "reads layer 2, the target has 2 layers" in compat.check(target, deeper).summary()


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


def test_an_eagle3_file_given_as_the_draft_drafts_with_eagle3_fixed_or_under_auto(tiny):
    runtime = Runtime(ctx_size=512)
    with Session(tiny["markov_target"], None, runtime, Speculation(DrafterKind.PLAIN)) as plain:
        prompt = plain.tokenize("the cat sat", raw=True)
        expected = record(plain.generate(prompt, GREEDY, Limits(40))).text
        with pytest.raises(UsageError, match="the eagle3 mode needs an EAGLE-3 drafter"):
            plain.use(DrafterKind.EAGLE3)
    fixed = Speculation(DrafterKind.DRAFT, draft_max=3, p_min=0.0)  # what --spec fixed makes of a draft file
    with Session(tiny["markov_target"], tiny["eagle3"], runtime, fixed) as session:
        assert session.mode == DrafterKind.EAGLE3 and session.model_drafter is None
        assert "EAGLE-3 (eagle3-target.gguf)" in session.describe()
        drafted = record(session.generate(prompt, GREEDY, Limits(40)))
        assert drafted.text == expected and drafted.drafters[DrafterKind.EAGLE3].accepted > 0
        session.use(DrafterKind.AUTO)
        assert "EAGLE-3" in session.describe()
        assert record(session.generate(prompt, GREEDY, Limits(40))).text == expected


def test_eagle3_from_the_command_line_and_a_target_it_cannot_read_refused_before_loading(localspec, cli, tiny,
                                                                                           tmp_path):
    done = localspec("run", tiny["markov_target"], "--draft", tiny["eagle3"], "--spec", "fixed", "--p-min", "0",
                     "--temp", "0", "-p", "the cat sat", "--raw", "-n", "40", "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["stats"]["drafters"]["eagle3"]["accepted"] > 0 and summary["placement"]["drafting"] == "eagle3"
    code, out, _ = cli("check", tiny["markov_target"], tiny["eagle3"], "--json")
    rules = {rule["name"]: rule for rule in json.loads(out)["rules"]}
    assert code == 0 and rules["hidden states"]["detail"] == "the inputs of target layers 0, 1, 1"
    # llama.cpp's bert graph hands out no layer inputs: asking for them would abort the process
    refused = localspec("run", write_tiny_bert(tmp_path / "embed.gguf"), "--draft", tiny["eagle3"], "-p", "hi")
    assert refused.returncode != 0 and "does not hand out the layer inputs EAGLE-3 reads" in refused.stderr.decode()
    assert b"Traceback" not in refused.stderr
