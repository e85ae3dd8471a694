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
from .across import AcrossDrafter
from .base import NoDrafter
from .forward import AssistantDrafter, DFlashDrafter, Eagle3Drafter, ModelDrafter, MtpDrafter
from .free import NgramDrafter, SuffixDrafter
from .wrapping import ForcedDrafter, PredictionDrafter


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
    """One way of drafting. drafter: its class, which names the kind (its word) it drafts as (None for auto,
    which picks among the others each step, and names its kind here); label: how a session names it ({file}:
    its file's name); needed: what a session asked to draft this way without the means is told;
    recognises(target, draft): whether a draft file drafts this way for that target, by their headers (the
    costly drafters that read a file; a drafter that crosses vocabularies, say, is told by both); draft_max: its
    longest draft a step unless --draft-max says otherwise; mode: whether a session may draft this way alone
    (the drafters beside a generation's own are not)."""

    name: str
    weights: Weights
    drafter: type | None
    label: str
    needed: str = ""
    recognises: Callable[[Header, Header], bool] | None = None
    # its file is published beside the target, under this word in the registry's `drafts`, and --draft KIND
    # finds it there
    published: str | None = None
    asked: str = ""  # what --draft KIND drafts with, for --draft's help
    # Measured on a 2-core CPU: always drafting beyond 3 tokens costs more than it wins; the drafters that
    # draft only where they are likely right (auto, and the text a prediction or a grammar gives) draft far
    draft_max: int = 3
    block: bool = False  # a draft of any length is one forward pass over all its positions (DFlash)
    mode: bool = True
    kind: DrafterKind | None = None  # its class's, where it has one (auto has none)

    def __post_init__(self):
        object.__setattr__(self, "kind", DrafterKind(self.kind or self.drafter.kind))

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
    DrafterSpec("plain", Weights.TEXT, NoDrafter, "no drafting", draft_max=0),
    DrafterSpec("ngram", Weights.TEXT, NgramDrafter, "n-gram lookup"),
    # Gemma 4's assistant (ggml-org's `mtp-gemma-4-*` files), which llama.cpp runs as an MTP drafter
    DrafterSpec("assistant", Weights.MTP_FILE, AssistantDrafter, "its assistant ({file})",
                recognises=_architecture("gemma4-assistant"), published="assistant"),
    # an MTP block in a file of its own (Qwen3.6's `mtp-` sidecar) drafts as the target's own layers would
    DrafterSpec("mtp-sidecar", Weights.MTP_FILE, MtpDrafter, "its MTP layers ({file})",
                recognises=lambda target, draft: draft.mtp_sidecar, published="mtp"),
    # the drafters that read the target's hidden states (gpt-oss's `eagle3-`, Qwen3.6's `dflash-` sidecars)
    DrafterSpec("eagle3", Weights.FILE, Eagle3Drafter, "EAGLE-3 ({file})",
                "the eagle3 mode needs an EAGLE-3 drafter (--draft eagle3, or its eagle3-*.gguf file)",
                _architecture("eagle3"), published="eagle3",
                asked="the EAGLE-3 drafter published beside it (gpt-oss's), which reads the target's hidden states"),
    DrafterSpec("dflash", Weights.FILE, DFlashDrafter, "DFlash ({file})",
                "the dflash mode needs a DFlash drafter (--draft dflash, or its dflash-*.gguf file)",
                _architecture("dflash"), published="dflash", block=True,
                asked="the DFlash drafter published beside it (Qwen3.6's), which reads the target's hidden states"),
    DrafterSpec("draft", Weights.FILE, ModelDrafter, "{file}",
                "the draft mode needs a draft model (--draft NAME or FILE)", lambda target, draft: True),
    # a draft model whose vocabulary is not the target's (the pair check tells, plan_drafting's `same_vocabulary`)
    DrafterSpec("across", Weights.FILE, AcrossDrafter, "{file}, through text"),
    DrafterSpec("mtp", Weights.TARGET, MtpDrafter, "its own MTP layers",
                "the mtp mode needs a session opened to draft with the target's MTP layers (--draft mtp)",
                asked="the target's own multi-token-prediction layers (Qwen3.5 and others that have them), or the"
                " mtp- file published beside it (Gemma 4's assistant among them)"),
    # Auto drafts up to 32 (n-gram drafts of copied text pay at long lengths: a 2-core CPU verifies 32
    # tokens in the time of 7 single ones) and stops short by itself wherever acceptance does not carry that far.
    DrafterSpec("auto", Weights.TEXT, None, "auto", draft_max=32, kind=DrafterKind.AUTO),
    # the drafters beside a generation's own: earlier answers (within auto), the user's prediction and a
    # grammar's forced text (beside any mode)
    DrafterSpec("suffix", Weights.TEXT, SuffixDrafter, "earlier answers", draft_max=32, mode=False),
    DrafterSpec("prediction", Weights.TEXT, PredictionDrafter, "the prediction", draft_max=32, mode=False),
    DrafterSpec("forced", Weights.TEXT, ForcedDrafter, "the grammar's forced text", draft_max=32, mode=False),
)
SPEC = {spec.name: spec for spec in SPECS}
# each kind's first spec: what its default length and passes are (the MTP kind's three specs agree on them)
_OF_KIND = {spec.kind: spec for spec in reversed(SPECS)}
# what a session's verification batch must hold: the longest draft any kind makes by default
LONGEST_DEFAULT_DRAFT = max(spec.draft_max for spec in SPECS)
# the modes that draft with a model of their own (a file, or the target's MTP layers)
COSTLY_KINDS = frozenset(spec.kind for spec in SPECS if spec.costly)
# the modes --draft names by their word alone: a drafter published beside the target is looked for
PUBLISHED_KINDS = frozenset(spec.kind for spec in SPECS if spec.published)
# the registry's words for the drafters published beside a model that localspec drafts with
PUBLISHED_DRAFTERS = tuple(spec.published for spec in SPECS if spec.published)
# what --draft WORD drafts with, for its help
DRAFT_WORDS = {spec.kind: spec.asked for spec in SPECS if spec.asked}
# every kind's word, and those a session may draft in alone (its mode): plain, auto and each drafter's
KINDS = tuple(dict.fromkeys(spec.kind for spec in SPECS))
MODES = tuple(kind for kind in KINDS if _OF_KIND[kind].mode)
# the modes that draft with one drafter always (a request's "fixed" speculation names one)
FIXED_MODES = tuple(kind for kind in MODES if kind not in (DrafterKind.PLAIN, DrafterKind.AUTO))


def check_mode(word: str) -> DrafterKind:
    """The word as a kind a session may draft in alone; UsageError saying why where it is none."""
    if word not in _OF_KIND:
        raise UsageError(f"{word!r} is not a way to draft: one of {', '.join(MODES)}")
    if not _OF_KIND[word].mode:
        raise UsageError(f"{word} is not a way to draft on its own: a prediction drafts beside any of"
                         f" {', '.join(MODES)} (give the predicted text with the request), the suffix cache within"
                         " auto, a grammar's forced text beside any mode that drafts")
    return DrafterKind(word)


def default_draft_max(kind: DrafterKind) -> int:
    return _OF_KIND[kind].draft_max


def drafts_a_block(kind: DrafterKind) -> bool:
    """Whether a draft of any length is one forward pass over all its positions, rather than a pass a token."""
    return _OF_KIND[kind].block


def draft_limit(speculation: Speculation, kind: DrafterKind | None = None) -> int:
    """Most tokens drafted a step when generating with `kind` (default: speculation's mode): the one place
    draft_max is decided."""
    kind = kind or speculation.drafting
    if kind == DrafterKind.PLAIN:
        return 0
    return default_draft_max(kind) if speculation.draft_max is None else speculation.draft_max


def longest_draft(speculation: Speculation) -> int:
    """The longest draft any kind may make, draft_max or a default (chat's /draft N may ask for any of them
    later): what a session's verification batch must hold."""
    return max(speculation.draft_max or 0, LONGEST_DEFAULT_DRAFT)


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


def plan_drafting(speculation: Speculation, target: Header, draft: Header | None = None,
                  same_vocabulary: bool = True) -> DraftPlan:
    """The plan for drafting as speculation asks, with a target and draft file of these headers.

    A draft file drafts as what its header shows (a draft model, an MTP block, Gemma 4's assistant, an
    EAGLE-3 or DFlash drafter), and fixed drafting with it is that kind's mode; a draft model whose
    vocabulary is not the target's (same_vocabulary, by the pair check) drafts through text. The target's own MTP
    layers draft when asked for, and under auto beside a draft model (the target keeps the hidden states
    of one kind of drafter)."""
    mode = check_mode(speculation.drafting)
    if speculation.draft_min > draft_limit(speculation):
        raise UsageError(f"draft-min must be between 0 and draft-max ({draft_limit(speculation)}),"
                         f" got {speculation.draft_min}")
    by_file = None if draft is None else next(spec for spec in SPECS if spec.recognises and spec.recognises(target, draft))
    if by_file is SPEC["draft"] and not same_vocabulary:
        by_file = SPEC["across"]
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
