"""Each way of drafting, one entry (what it drafts with, which draft files it reads, the class that
drafts, what a session that lacks it says), and the plan a session drafts by: decided once, from what was
asked and the two models' headers, before anything loads."""

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Protocol

from ...config import DrafterKind, Speculation
from ...errors import UsageError
from .base import NoDrafter
from .forward import AssistantDrafter, DFlashDrafter, Eagle3Drafter, ModelDrafter, MtpDrafter
from .free import NgramDrafter


class Header(Protocol):
    """What a plan reads of a model file's GGUF header (the store's GGUFInfo)."""

    path: Path
    architecture: str
    mtp_layers: int
    mtp_sidecar: bool


class Weights(Enum):
    """What a drafter drafts with, and so what a session loads for it."""

    TEXT = "the text so far"  # nothing: a free drafter
    TARGET = "the target's own MTP layers"  # loaded with the target
    FILE = "a model file of its own"  # the draft file, loaded as a model
    MTP_FILE = "an MTP block in a file of its own"  # the draft file, loaded with its MTP layers


@dataclass(frozen=True)
class DrafterSpec:
    """One way of drafting. label: how a session names it ({file}: its file's name); needed: what a session
    asked to draft this way without the means is told; recognises(target, draft): whether a draft file drafts
    this way for that target, by their headers (the costly drafters that read a file; a drafter that crosses
    vocabularies, say, is told by both)."""

    name: str
    kind: DrafterKind
    weights: Weights
    drafter: type
    label: str
    needed: str = ""
    recognises: Callable[[Header, Header], bool] | None = None
    published: bool = False  # its file is published beside the target, and --draft KIND finds it there

    @property
    def costly(self) -> bool:
        """Whether it drafts with a model of its own, on a context of its own."""
        return self.weights is not Weights.TEXT

    def describe(self, file: str) -> str:
        return self.label.format(file=file)


def _architecture(name: str) -> Callable[[Header, Header], bool]:
    return lambda target, draft: draft.architecture == name


# In the order a draft file is recognised (a file that is none of the others is a draft model), which is
# also the order auto weighs the costly drafters in.
SPECS = (
    DrafterSpec("plain", DrafterKind.PLAIN, Weights.TEXT, NoDrafter, "no drafting"),
    DrafterSpec("ngram", DrafterKind.NGRAM, Weights.TEXT, NgramDrafter, "n-gram lookup"),
    # Gemma 4's assistant (ggml-org's `mtp-gemma-4-*` files), which llama.cpp runs as an MTP drafter
    DrafterSpec("assistant", DrafterKind.MTP, Weights.MTP_FILE, AssistantDrafter, "its assistant ({file})",
                recognises=_architecture("gemma4-assistant"), published=True),
    # an MTP block in a file of its own (Qwen3.6's `mtp-` sidecar) drafts as the target's own layers would
    DrafterSpec("mtp-sidecar", DrafterKind.MTP, Weights.MTP_FILE, MtpDrafter, "its MTP layers ({file})",
                recognises=lambda target, draft: draft.mtp_sidecar, published=True),
    # the drafters that read the target's hidden states (gpt-oss's `eagle3-`, Qwen3.6's `dflash-` sidecars)
    DrafterSpec("eagle3", DrafterKind.EAGLE3, Weights.FILE, Eagle3Drafter, "EAGLE-3 ({file})",
                "the eagle3 mode needs an EAGLE-3 drafter (--draft eagle3, or its eagle3-*.gguf file)",
                _architecture("eagle3"), published=True),
    DrafterSpec("dflash", DrafterKind.DFLASH, Weights.FILE, DFlashDrafter, "DFlash ({file})",
                "the dflash mode needs a DFlash drafter (--draft dflash, or its dflash-*.gguf file)",
                _architecture("dflash"), published=True),
    DrafterSpec("draft", DrafterKind.DRAFT, Weights.FILE, ModelDrafter, "{file}",
                "the draft mode needs a draft model (--draft NAME or FILE)", lambda target, draft: True),
    DrafterSpec("mtp", DrafterKind.MTP, Weights.TARGET, MtpDrafter, "its own MTP layers",
                "the mtp mode needs a session opened to draft with the target's MTP layers (--draft mtp)"),
)
SPEC = {spec.name: spec for spec in SPECS}
# the modes that draft with a model of their own (a file, or the target's MTP layers)
COSTLY_KINDS = frozenset(spec.kind for spec in SPECS if spec.costly)
# the modes --draft names by their word alone: a drafter published beside the target is looked for
PUBLISHED_KINDS = frozenset(spec.kind for spec in SPECS if spec.published)


def needed(kind: DrafterKind) -> str:
    """What a session without a drafter of this kind says when asked to draft with one."""
    return next((spec.needed for spec in SPECS if spec.kind == kind and spec.needed),
                f"{kind} is not a mode to draft in")


@dataclass(frozen=True)
class DraftPlan:
    """How a session drafts. mode: the kind it starts generating with; costly: the drafters with a model of
    their own it makes, in auto's order; note: what it does other than asked, and why."""

    mode: DrafterKind
    costly: tuple[DrafterSpec, ...] = ()
    note: str | None = None

    @property
    def target_mtp(self) -> bool:
        """Whether the target is loaded with its MTP layers, to draft with them."""
        return any(spec.weights is Weights.TARGET for spec in self.costly)

    def decoding_plainly(self, target: str, speculation: Speculation) -> "DraftPlan":
        """The plan where the target turns out, once its context is made, to keep a recurrent state it
        cannot take rejected tokens back out of: plain decoding, or a refusal where drafting was asked for
        by name."""
        if self.mode == DrafterKind.PLAIN:
            return self
        reason = (f"{target} keeps a recurrent state that llama.cpp cannot take rejected draft tokens back out of"
                  " (it keeps snapshots of it only for some architectures)")
        if speculation.required:
            raise UsageError(f"{reason}; it can only decode plainly (--no-draft)")
        return DraftPlan(DrafterKind.PLAIN, note=f"{reason}: decoding plainly")


def plan_drafting(speculation: Speculation, target: Header, draft: Header | None = None) -> DraftPlan:
    """The plan for drafting as speculation asks, with a target and draft file of these headers.

    A draft file drafts as what its header shows (a draft model, an MTP block, Gemma 4's assistant, an
    EAGLE-3 or DFlash drafter), and fixed drafting with it is that kind's mode. The target's own MTP
    layers draft when asked for, and under auto beside a draft model (the target keeps the hidden states
    of one kind of drafter)."""
    mode = speculation.drafting
    by_file = None if draft is None else next(spec for spec in SPECS if spec.recognises and spec.recognises(target, draft))
    if by_file is not None and mode == DrafterKind.DRAFT:
        mode = by_file.kind
    costly = [by_file] if by_file is not None else []
    if mode in (DrafterKind.MTP, DrafterKind.AUTO) and (by_file is None or by_file.kind == DrafterKind.DRAFT):
        if target.mtp_layers:
            costly.append(SPEC["mtp"])
        elif mode == DrafterKind.MTP:
            raise UsageError(f"{target.path.name} has no multi-token-prediction (MTP) layers to draft with; give its"
                             " MTP sidecar file (mtp-*.gguf) as --draft, or use --draft ngram or a draft model")
    return DraftPlan(mode, tuple(sorted(costly, key=SPECS.index)))
