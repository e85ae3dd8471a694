"""Drafting across vocabularies: a draft model whose vocabulary is not the target's drafts through text
(greedy) or the two vocabularies' intersection (sampling), and the output stays the target's own."""

import json
from dataclasses import replace

import numpy as np
import pytest

from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
from localspec.engine import speculative
from localspec.engine.backend import Context
from localspec.engine.drafters import NoDrafter
from localspec.engine.drafters.across import AcrossDrafter, Vocabularies, complete
from localspec.engine.drafters.spec import SPEC, plan_drafting
from localspec.engine.model import Model
from localspec.engine.sampling import Dist
from localspec.events import Step, Token
from localspec.request import Request
from localspec.session import Session
from localspec.stats import record
from localspec.store import compat, gguf_meta

from conftest import TARGET
from test_lossless import chi_square_p_value, exact_distribution, sample_counts, ALPHA
from test_parallel import served
from tinyacross import write_tiny_across
from tinymodels import write_tiny_model

WRITER = replace(TARGET, writes_pieces=True)  # a target whose greedy text is its pieces, not random bytes
PROMPTS = ("the cat sat on the mat", "on the", "abc")
GREEDY = Sampling(temperature=0.0)
SAMPLED = {"temperature 0.7": Sampling(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0),
           "temperature 1, top-k 5": Sampling(temperature=1.0, top_k=5, top_p=1.0, min_p=0.0)}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("across")
    return {
        "target": write_tiny_model(folder / "target.gguf", WRITER),
        "spm": write_tiny_across(folder / "spm.gguf", WRITER, "spm"),
        "bpe": write_tiny_across(folder / "bpe.gguf", WRITER, "bpe"),
        # drafts whose choice everywhere is a token with no text of its own, or outside the intersection
        "byte": write_tiny_across(folder / "byte.gguf", WRITER, "spm", favour="<0x0A>"),
        "control": write_tiny_across(folder / "control.gguf", WRITER, "bpe", favour="<|endoftext|>"),
        "word": write_tiny_across(folder / "word.gguf", WRITER, "spm", favour="jk,"),
    }


@pytest.fixture(scope="module")
def contexts(files):
    opened = {}
    for name, path in files.items():
        model = Model(path)
        opened[name] = Context(model, 256, 64, threads=2, max_outputs=64)
    yield opened
    for context in opened.values():
        context.close()
        context.model.close()


def drafter(contexts, name: str) -> AcrossDrafter:
    return AcrossDrafter.made(contexts["target"], contexts[name], 0.0)


def tokens_of(events) -> list[int]:
    return [e.id for e in events if isinstance(e, Token)]


def generated(contexts, drafter, text: str, sampling: Sampling, k: int = 3, max_tokens: int = 60) -> list:
    target = contexts["target"]
    prompt = target.model.tokenize(text, add_special=True, parse_special=False)
    return list(speculative.generate(target, drafter, prompt, sampling, Speculation(draft_max=k, p_min=0.0),
                                     Limits(max_tokens=max_tokens)))


def test_a_character_cut_short_is_left_for_the_next_token():
    assert complete(b"") == 0 and complete(b"abc") == 3
    euro = "€".encode()
    assert complete(b"a" + euro) == 4 and complete(b"a" + euro[:2]) == 1 and complete(euro[:1]) == 0
    assert complete("é".encode()) == 2 and complete("😀".encode()[:3]) == 0


def test_the_intersection_is_the_draft_tokens_that_spell_one_target_token(contexts):
    target, draft = contexts["target"].model, contexts["spm"].model
    vocabularies = Vocabularies(target, draft)
    a = draft.tokenize("a", add_special=False, parse_special=False)[-1]
    word = draft.spell("jk,")
    assert vocabularies.to_target[a] == target.spell("a")[0] and vocabularies.to_draft[target.spell("a")[0]] == a
    assert len(word) == 1 and vocabularies.to_target[word[0]] == -1 and vocabularies.crosses[word[0]]
    # byte, control and end-of-generation tokens never cross
    byte, end = 3 + 0x0A, 2
    assert not vocabularies.crosses[byte] and not vocabularies.crosses[end] and vocabularies.to_target[byte] == -1
    # the 29 pieces both have (in another order) of the 29 + 8 words the draft writes
    assert vocabularies.shared == pytest.approx(29 / 37)
    q = Dist(np.array([a, word[0]]), np.array([0.25, 0.75]))
    restricted = vocabularies.restricted(q)
    assert restricted.ids.tolist() == [target.spell("a")[0]] and restricted.probs.tolist() == [1.0]
    assert vocabularies.restricted(Dist(np.array([word[0]]), np.array([1.0]))) is None  # an empty intersection


@pytest.mark.parametrize("name", ["spm", "bpe"])
def test_greedy_output_is_the_targets_own_through_every_cut(contexts, name):
    across = drafter(contexts, name)
    drafted = accepted = 0
    for text in PROMPTS:
        plain = tokens_of(generated(contexts, NoDrafter(), text, GREEDY))
        for k in (1, 3, 5):
            events = generated(contexts, across, text, GREEDY, k)
            assert tokens_of(events) == plain, (text, k)
            steps = [e for e in events if isinstance(e, Step)]
            drafted += sum(s.drafted for s in steps)
            accepted += sum(s.accepted for s in steps)
    assert 0 < accepted < drafted
    # the draft read words the target spells a character at a time: their texts were cut elsewhere
    draft = contexts[name].model
    assert {draft.piece(t) for t in contexts[name].tokens} & {b"jk", b"jk,", b"ntw", b"zw"}


@pytest.mark.parametrize("name", ["byte", "control"])
def test_a_draft_token_without_text_of_its_own_ends_the_draft_not_the_generation(contexts, name):
    plain = tokens_of(generated(contexts, NoDrafter(), PROMPTS[0], GREEDY))
    events = generated(contexts, drafter(contexts, name), PROMPTS[0], GREEDY)
    assert tokens_of(events) == plain
    assert sum(e.drafted for e in events if isinstance(e, Step)) == 0


def test_an_empty_intersection_ends_a_sampled_draft(contexts):
    top = Sampling(temperature=1.0, top_k=1, top_p=1.0, min_p=0.0, seed=3)  # the draft keeps its word alone
    events = generated(contexts, drafter(contexts, "word"), PROMPTS[0], top)
    assert len(tokens_of(events)) == 60 and sum(e.drafted for e in events if isinstance(e, Step)) == 0


@pytest.mark.parametrize("name", ["spm", "bpe"])
@pytest.mark.parametrize("setting", list(SAMPLED))
def test_sampled_output_follows_the_target_distribution(contexts, name, setting):
    target, sampling = contexts["target"], SAMPLED[setting]
    prompt = target.model.tokenize(PROMPTS[0], add_special=True, parse_special=False)
    counts = sample_counts(target, drafter(contexts, name), prompt, sampling)
    assert chi_square_p_value(counts, exact_distribution(target, prompt, sampling)) > ALPHA


def test_sampled_drafts_are_accepted_and_refused(contexts):
    drafted = accepted = 0
    for seed in range(20):
        events = generated(contexts, drafter(contexts, "spm"), PROMPTS[0], replace(SAMPLED["temperature 0.7"], seed=seed))
        drafted += sum(e.drafted for e in events if isinstance(e, Step))
        accepted += sum(e.accepted for e in events if isinstance(e, Step))
    assert 0 < accepted < drafted


def test_a_verifier_that_skips_the_intersection_step_fails_the_check(contexts, monkeypatch):
    def unrenormalised(self, q):  # the draft's own probabilities of the shared tokens, as if they summed to 1
        mapped = self.to_target[q.ids]
        kept = mapped >= 0
        return Dist(mapped[kept], q.probs[kept]) if kept.any() else None

    monkeypatch.setattr(Vocabularies, "restricted", unrenormalised)
    target, sampling = contexts["target"], SAMPLED["temperature 0.7"]
    prompt = target.model.tokenize(PROMPTS[0], add_special=True, parse_special=False)
    counts = sample_counts(target, drafter(contexts, "spm"), prompt, sampling)
    assert chi_square_p_value(counts, exact_distribution(target, prompt, sampling)) < ALPHA


def test_the_pair_check_explains_a_draft_of_another_vocabulary_and_the_plan_drafts_through_text(files):
    target, draft = gguf_meta.read(files["target"]), gguf_meta.read(files["spm"])
    report = compat.check(target, draft)
    assert report.compatible and report.across and not report.same_vocabulary
    assert "token texts" in [rule.name for rule in report.rules if not rule.passed]
    plan = plan_drafting(Speculation(drafting=DrafterKind.DRAFT), target, draft, report.same_vocabulary)
    assert plan.mode == DrafterKind.DRAFT and plan.costly == (SPEC["across"],)
    same = gguf_meta.read(files["target"])
    assert plan_drafting(Speculation(drafting=DrafterKind.DRAFT), target, same).costly == (SPEC["draft"],)


def test_check_and_run_take_a_draft_of_another_vocabulary(localspec, files):
    checked = localspec("check", files["target"], files["bpe"])
    assert checked.returncode == 0, checked.stderr
    assert b"drafts through text (cross-vocabulary)" in checked.stdout and b"differs" in checked.stdout
    report = json.loads(localspec("check", files["target"], files["spm"], "--json").stdout)
    assert report["compatible"] and report["vocabulary"] == "through text"
    assert report["single_token_share"] == pytest.approx(29 / 37, abs=1e-4)
    args = ("run", files["target"], "-p", "the cat sat", "--raw", "--temp", "0", "-n", "40", "--json")
    plain = json.loads(localspec(*args, "--no-draft").stdout)
    run = localspec(*args, "--draft", files["spm"], "--spec", "fixed")
    drafted = json.loads(run.stdout)
    assert drafted["text"] == plain["text"] and drafted["stats"]["accepted"] > 0
    assert b"drafts through text" in run.stderr


def test_a_draft_of_another_vocabulary_drafts_for_every_sequence_of_a_session(files):
    prompts = ["the cat sat", "on the", "abc"]
    requests = [Request(GREEDY, Limits(24), prompt=p) for p in prompts]
    fixed = Speculation(drafting=DrafterKind.DRAFT, required=True, p_min=0.0)
    with Session(files["target"], None, Runtime(ctx_size=512), Speculation(drafting=DrafterKind.PLAIN)) as plain:
        expected = [plain.complete(p, raw=True, sampling=GREEDY, limits=Limits(24)).text for p in prompts]
    with Session(files["target"], files["bpe"], Runtime(ctx_size=512), fixed) as single:
        alone = [record(single.generate(Request(GREEDY, Limits(24), prompt=single.prompts.tokenize(p, raw=True))))
                 for p in prompts]
        assert any("drafts through text" in note for note in single.notes)
    with Session(files["target"], files["bpe"], Runtime(ctx_size=512, parallel=3), fixed) as session:
        jobs = served(session, requests)
    assert [job.recorder.text for job in jobs] == expected
    # each sequence drafted on its own part of the draft's context, as it did alone
    assert [(job.recorder.drafted, job.recorder.accepted) for job in jobs] == [(a.drafted, a.accepted) for a in alone]
    assert all(job.recorder.accepted > 0 for job in jobs)


def test_auto_weighs_a_draft_of_another_vocabulary_and_keeps_the_output_the_targets(files):
    with Session(files["target"], None, Runtime(ctx_size=512), Speculation(drafting=DrafterKind.PLAIN)) as plain:
        expected = [plain.complete(p, raw=True, sampling=GREEDY, limits=Limits(48)).text for p in PROMPTS]
    with Session(files["target"], files["spm"], Runtime(ctx_size=512), Speculation()) as session:
        assert session.drafting.describe().startswith("auto: n-gram lookup or spm.gguf, through text")
        texts = [session.complete(p, raw=True, sampling=GREEDY, limits=Limits(48)).text for p in PROMPTS]
    assert texts == expected


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED["temperature 0.7"]], ids=["greedy", "sampled"])
def test_a_history_of_no_text_drafts_nothing_and_generates(contexts, sampling):
    # (seeded: unseeded, a sampled end-of-generation token ended it short now and then)
    sampling = replace(sampling, seed=7)
    target = contexts["target"]
    start = target.model.tokenize("", add_special=True, parse_special=False)  # the start token alone: no text
    assert start and not target.model.spell_of(start)
    events = list(speculative.generate(target, drafter(contexts, "bpe"), start, sampling,
                                       Speculation(draft_max=3, p_min=0.0), Limits(max_tokens=12)))
    plain = list(speculative.generate(target, NoDrafter(), start, sampling, Speculation(), Limits(max_tokens=12)))
    assert len(tokens_of(events)) == 12
    if sampling.greedy:
        assert tokens_of(events) == tokens_of(plain)
