"""The drafting plan: decided once from what was asked and the two models' headers, before anything loads."""

import re

import pytest

from localspec.store import gguf_meta, registry
from localspec.config import DrafterKind, Runtime, Speculation
from localspec.engine.drafters import AssistantDrafter, DFlashDrafter, Eagle3Drafter, ModelDrafter, MtpDrafter
from localspec.engine.drafters.spec import (COSTLY_KINDS, KINDS, PUBLISHED_DRAFTERS, PUBLISHED_KINDS, SPECS, Weights,
                                            default_draft_max, draft_limit, drafts_a_block, needed, plan_drafting)
from localspec.errors import UsageError
from localspec.session import Session


def plan(tiny, target, draft=None, **asked):
    return plan_drafting(Speculation(**asked), gguf_meta.read(tiny[target]),
                         gguf_meta.read(tiny[draft]) if draft else None)


@pytest.mark.parametrize(("draft", "mode", "drafter", "weights"), [
    ("partial", DrafterKind.DRAFT, ModelDrafter, Weights.FILE),
    ("mtp_sidecar", DrafterKind.MTP, MtpDrafter, Weights.MTP_FILE),
    ("gemma4_assistant", DrafterKind.MTP, AssistantDrafter, Weights.MTP_FILE),
    ("eagle3", DrafterKind("eagle3"), Eagle3Drafter, Weights.FILE),
    ("dflash", DrafterKind("dflash"), DFlashDrafter, Weights.FILE),
])
def test_a_draft_file_drafts_as_its_header_shows_and_fixed_drafting_with_it_is_its_kind(tiny, draft, mode, drafter,
                                                                                       weights):
    fixed = plan(tiny, "target", draft, drafting=DrafterKind.DRAFT)
    assert fixed.mode == mode and [(s.drafter, s.weights) for s in fixed.costly] == [(drafter, weights)]
    assert not fixed.target_mtp
    assert plan(tiny, "target", draft).mode == DrafterKind.AUTO  # auto stays auto, weighing it


def test_the_targets_own_mtp_layers_draft_when_asked_and_under_auto_beside_a_draft_model_only(tiny):
    own = plan(tiny, "mtp", drafting=DrafterKind.MTP)
    assert own.target_mtp and [s.name for s in own.costly] == ["mtp"]
    # auto weighs the draft model and the MTP layers, in that order
    assert [s.name for s in plan(tiny, "mtp", "partial").costly] == ["draft", "mtp"]
    # n-gram lookup and plain decoding load no MTP layers; nor does an MTP sidecar beside them
    assert not plan(tiny, "mtp", drafting=DrafterKind.NGRAM).costly
    assert not plan(tiny, "mtp_trunk", "mtp_sidecar").target_mtp


def test_a_target_without_mtp_layers_is_refused_before_anything_loads(tiny):
    with pytest.raises(UsageError, match="target.gguf has no multi-token-prediction"):
        plan(tiny, "target", drafting=DrafterKind.MTP)
    assert plan(tiny, "target").costly == ()  # auto without them: the free drafters only


def test_every_costly_kind_says_what_a_session_without_it_lacks(tiny):
    assert COSTLY_KINDS == {DrafterKind.DRAFT, DrafterKind.MTP, DrafterKind("eagle3"), DrafterKind("dflash")}
    assert PUBLISHED_KINDS == {DrafterKind.MTP, DrafterKind("eagle3"), DrafterKind("dflash")}  # --draft mtp|eagle3|dflash
    for kind in COSTLY_KINDS:
        assert f"the {kind} mode needs" in needed(kind)
    assert len({spec.name for spec in SPECS}) == len(SPECS)
    with Session(tiny["target"], None, Runtime(ctx_size=256, threads=2), Speculation(DrafterKind.NGRAM)) as session:
        for kind in COSTLY_KINDS:
            with pytest.raises(UsageError, match=re.escape(needed(kind))):
                session.use(kind)


def test_each_kinds_length_and_word_come_from_its_spec(tiny):
    named = {word for name, word in vars(DrafterKind).items() if name.isupper()}  # the words code names
    assert named <= set(KINDS) == {spec.kind for spec in SPECS}  # a word without a spec has no default length
    assert all(spec.kind == spec.drafter.kind for spec in SPECS if spec.drafter)  # each class names its own
    assert default_draft_max(DrafterKind.NGRAM) == 3 and default_draft_max(DrafterKind.AUTO) == 32
    assert draft_limit(Speculation(draft_max=7), DrafterKind.NGRAM) == 7 and draft_limit(Speculation(DrafterKind.PLAIN)) == 0
    assert drafts_a_block(DrafterKind("dflash")) and not drafts_a_block(DrafterKind.DRAFT)
    assert set(PUBLISHED_DRAFTERS) <= set(registry.DRAFTER_KINDS)  # the registry's words for published files
    with pytest.raises(UsageError, match=r"draft-min must be between 0 and draft-max \(3\), got 5"):
        plan(tiny, "target", drafting=DrafterKind.NGRAM, draft_min=5)
    assert plan(tiny, "target", draft_min=5).mode == DrafterKind.AUTO  # within auto's 32
    with pytest.raises(UsageError, match=r"'ngarm' is not a way to draft: one of plain, ngram, mtp, eagle3, dflash,"
                                         r" draft, auto$"):
        plan(tiny, "target", drafting="ngarm")  # (the word is the table's to check, before anything loads)
