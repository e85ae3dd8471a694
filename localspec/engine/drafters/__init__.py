"""Drafters propose tokens; the target decides. Each has one job and its own state, per sequence.

base: what every drafter is (the Drafter protocols, Draft, the evidence behind a proposal);
free: drafters that cost no forward pass (n-gram lookup, the suffix cache); forward: drafters with a
context of their own (a draft model, MTP blocks, EAGLE-3, DFlash); wrapping: drafters that draft beside
a generation's own (a prediction, a grammar's forced text); spec: each kind's needs, defaults and
making, and the plan a session drafts by.
"""

from .base import (Agreement, CostlyDrafter, Draft, Drafter, Evidence, Learner, NoDrafter, Probe, RunClass, Stepwise,
                   proposal)
from .forward import (DFLASH_BLOCK, GREEDY_DRAFT, AssistantDrafter, DFlashDrafter, Eagle3Drafter, ForwardDrafter,
                      ModelDrafter, MtpDrafter, hidden_rows, next_draft_token)
from .free import MIN_OFFER, RUN_LIMIT, SUFFIX_MIN_MATCH, NgramDrafter, SuffixDrafter
from .wrapping import (EDIT_MATCH, EDIT_REACH, EDIT_SPAN, FORCED_CHARACTERS_PER_TOKEN, MERGES_CHECKED,
                       PREDICTION_MIN_MATCH, ForcedDrafter, PredictionDrafter)

__all__ = [
    "Agreement", "CostlyDrafter", "Draft", "Drafter", "Evidence", "Learner", "NoDrafter", "Probe", "RunClass",
    "Stepwise", "proposal", "DFLASH_BLOCK", "GREEDY_DRAFT", "AssistantDrafter", "DFlashDrafter", "Eagle3Drafter",
    "ForwardDrafter", "ModelDrafter", "MtpDrafter", "hidden_rows", "next_draft_token", "MIN_OFFER", "RUN_LIMIT",
    "SUFFIX_MIN_MATCH", "NgramDrafter", "SuffixDrafter", "EDIT_MATCH", "EDIT_REACH", "EDIT_SPAN",
    "FORCED_CHARACTERS_PER_TOKEN", "MERGES_CHECKED", "PREDICTION_MIN_MATCH", "ForcedDrafter", "PredictionDrafter",
]
