"""DFlash drafting (a block-diffusion drafter reading the target's hidden states, llama.cpp's draft-dflash):
its block, the compat check, a session and the CLI; its lossless tests are in test_drafters_beside."""

from dataclasses import replace

import pytest

from localspec.store import compat, gguf_meta
from localspec.config import Limits, Sampling, Speculation
from localspec.engine.speculative import generate
from localspec.events import Step

import test_drafters_beside as beside

GREEDY = Sampling(temperature=0)


@pytest.fixture(scope="module")
def dflash(tiny):
    """(target context keeping the layers' inputs the drafter reads, DFlashDrafter)."""
    target, drafter = beside.DRAFTERS["dflash"](tiny)
    yield target, drafter
    for resource in (drafter.context, target, drafter.context.model, target.model):
        resource.close()


def test_the_drafter_reads_its_block_size_and_mask_from_its_file(dflash, tiny):
    _, drafter = dflash
    assert (drafter.block, drafter.mask) == (4, 0)
    assert gguf_meta.read(tiny["dflash"]).target_layers == (0, 1)
    target, drafter = gguf_meta.read(tiny["markov_target"]), gguf_meta.read(tiny["dflash"])
    report = compat.check(target, drafter)
    assert report.compatible and "the inputs of target layers 0, 1" in {rule.detail for rule in report.rules}
    # DSpark (a Markov head) and DFlash2 (a selector) draft otherwise, and are refused; so is a drafter with no mask
    dspark = replace(drafter, tensor_bytes=drafter.tensor_bytes | {"markov_w1.weight": 0})
    dflash2 = replace(drafter, metadata={**drafter.metadata, "dflash.selector_top_k": 8})
    unmasked = replace(drafter, metadata={k: v for k, v in drafter.metadata.items() if "mask_token" not in k})
    for refused, why in ((dspark, "DSpark or DFlash2"), (dflash2, "DSpark or DFlash2"), (unmasked, "no mask token")):
        assert why in compat.check(target, refused).summary()


def test_a_draft_is_never_longer_than_the_block_allows(dflash, prompt):
    target, drafter = dflash
    events = list(generate(target, drafter, prompt, GREEDY, Speculation(draft_max=8, p_min=0.0), Limits(40)))
    assert max(e.drafted for e in events if isinstance(e, Step)) == 3
