"""Can a draft speculate for a target, and how? llama.cpp's rules plus pre-tokenizer and merges identity.

Where both vocabularies are one (the rules mirror common_speculative_are_compatible in llama.cpp: every id
the draft can produce means the same text to both), a draft's token ids are fed to the target as they are.
A draft model whose vocabulary is another drafts through text instead (engine/drafters/across.py), with
lower acceptance than a same-family draft; the drafters that read the target's cache or hidden states
(MTP blocks, Gemma 4's assistant, EAGLE-3, DFlash) need its vocabulary. Each result says what was compared,
so a failing report tells the user exactly why.
"""

from dataclasses import dataclass

from .gguf_meta import LAST_HIDDEN_ARCHITECTURES, LAYER_INPUT_ARCHITECTURES, GGUFInfo

# the drafters that read the target's cache or hidden states, and so draft in its vocabulary alone
SAME_VOCABULARY_DRAFTERS = ("eagle3", "dflash", "gemma4-assistant")
MAX_VOCAB_SIZE_DIFFERENCE = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
FIRST_COMPARED_TOKEN = 5  # llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID


@dataclass(frozen=True)
class Rule:
    name: str
    passed: bool
    detail: str
    vocabulary: bool = False  # one of the rules of a shared vocabulary, which a draft model may do without


@dataclass(frozen=True)
class CompatReport:
    target: GGUFInfo
    draft: GGUFInfo
    rules: list[Rule]

    @property
    def same_vocabulary(self) -> bool:
        """Whether the draft's token ids mean the same text to the target."""
        return all(rule.passed for rule in self.rules if rule.vocabulary)

    @property
    def across(self) -> bool:
        """Whether the draft drafts through text: a draft model whose vocabulary is not the target's."""
        return not self.same_vocabulary and self.draft.architecture not in SAME_VOCABULARY_DRAFTERS \
            and not self.draft.mtp_sidecar

    @property
    def compatible(self) -> bool:
        return not self.failed

    @property
    def failed(self) -> list[Rule]:
        return [rule for rule in self.rules if not rule.passed and not (rule.vocabulary and self.across)]

    def summary(self) -> str:
        """One line per failed rule, for error messages."""
        return "; ".join(f"{rule.name}: {rule.detail}" for rule in self.failed)


def _same(name: str, target_value, draft_value) -> Rule:
    return Rule(name, target_value == draft_value, f"target {target_value!r}, draft {draft_value!r}", vocabulary=True)


def check(target: GGUFInfo, draft: GGUFInfo) -> CompatReport:
    rules = [
        _same("vocabulary type", target.vocab_type, draft.vocab_type),
        _same("pre-tokenizer", target.pre_tokenizer, draft.pre_tokenizer),
        _same("adds BOS", bool(target.add_bos), bool(draft.add_bos)),
        _same("adds EOS", bool(target.add_eos), bool(draft.add_eos)),
    ]
    if target.add_bos or draft.add_bos:
        rules.append(_same("BOS token id", target.bos_id, draft.bos_id))
    if target.add_eos or draft.add_eos:
        rules.append(_same("EOS token id", target.eos_id, draft.eos_id))
    difference = abs(target.vocab_size - draft.vocab_size)
    rules.append(
        Rule(
            "vocabulary size",
            difference <= MAX_VOCAB_SIZE_DIFFERENCE,
            f"target {target.vocab_size}, draft {draft.vocab_size} tokens"
            f" (at most {MAX_VOCAB_SIZE_DIFFERENCE} apart)",
            vocabulary=True,
        )
    )
    rules.append(_token_texts(target, draft))
    same_merges = target.merges_digest == draft.merges_digest
    rules.append(Rule("merges", same_merges, "identical" if same_merges else "the BPE merge lists differ",
                       vocabulary=True))
    rules.append(_rollback(target, draft))
    if draft.architecture in ("eagle3", "dflash"):
        rules.append(_hidden_states(target, draft))
    if draft.architecture == "gemma4-assistant":
        rules.append(_assistant(target, draft))
    return CompatReport(target, draft, rules)


def _rollback(target: GGUFInfo, draft: GGUFInfo) -> Rule:
    """A rejected draft is taken back out of both models' caches; a recurrent state allows that only
    where llama.cpp keeps snapshots of it (gguf_meta.ROLLBACK_ARCHITECTURES)."""
    stuck = [f"{role} {info.architecture!r}" for role, info in (("target", target), ("draft", draft))
             if not info.rolls_back]
    if stuck:
        return Rule("state rollback", False, f"{' and '.join(stuck)} keep a recurrent state llama.cpp cannot take"
                    " rejected draft tokens back out of")
    recurrent = [role for role, info in (("target", target), ("draft", draft)) if info.recurrent]
    return Rule("state rollback", True, f"recurrent state snapshots ({', '.join(recurrent)})" if recurrent
                else "KV caches only")


def _token_texts(target: GGUFInfo, draft: GGUFInfo) -> Rule:
    name = "token texts"
    if target.token_digest == draft.token_digest:
        return Rule(name, True, "identical vocabularies", vocabulary=True)
    target_tokens, draft_tokens = target.tokens(), draft.tokens()
    for token in range(FIRST_COMPARED_TOKEN, min(len(target_tokens), len(draft_tokens))):
        if target_tokens[token] != draft_tokens[token]:
            return Rule(
                name, False,
                f"first difference at token {token}: target {_show(target_tokens[token])},"
                f" draft {_show(draft_tokens[token])}", vocabulary=True,
            )
    return Rule(name, True, f"ids {FIRST_COMPARED_TOKEN}..{min(len(target_tokens), len(draft_tokens)) - 1} agree",
                vocabulary=True)


def _show(token: bytes) -> str:
    return repr(token.decode("utf-8", errors="replace"))


def _assistant(target: GGUFInfo, draft: GGUFInfo) -> Rule:
    """Gemma 4's assistant reads a Gemma 4 target's KV cache and last hidden state, of the width it was
    trained on."""
    name, width = "target's cache", target.arch("embedding_length")
    if target.architecture != "gemma4":
        return Rule(name, False, f"a Gemma 4 assistant reads a gemma4 target's KV cache, not a {target.architecture!r} one's")
    if draft.arch("embedding_length_out") != width:
        return Rule(name, False, f"the assistant reads hidden states {draft.arch('embedding_length_out')} wide,"
                    f" the target's are {width}")
    return Rule(name, True, "a gemma4 target's, as trained")


def _hidden_states(target: GGUFInfo, draft: GGUFInfo) -> Rule:
    """An EAGLE-3 drafter reads the inputs of three of the target's layers (or its last hidden state), a
    DFlash drafter those of a few, of the width it was trained on; llama.cpp aborts the process where
    the target's graph does not hand them out. A DFlash drafter also needs a mask token."""
    name, layers = "hidden states", draft.target_layers
    n_layer, width = target.arch("block_count"), target.arch("embedding_length")
    eagle3 = draft.architecture == "eagle3"
    trained_on = draft.arch("target_hidden_size") if eagle3 else draft.arch("embedding_length")
    if target.architecture not in LAYER_INPUT_ARCHITECTURES:
        return Rule(name, False, f"llama.cpp's {target.architecture!r} graph does not hand out the layer inputs"
                    f" {'EAGLE-3' if eagle3 else 'DFlash'} reads")
    if not layers or eagle3 and len(layers) != 3:
        return Rule(name, False, f"the drafter names {len(layers)} target layers to read"
                    + (", EAGLE-3 reads 3" if eagle3 else ""))
    if trained_on != width:
        return Rule(name, False, f"the drafter was trained on hidden states {trained_on} wide, the target's are {width}")
    last = n_layer if eagle3 and target.architecture in LAST_HIDDEN_ARCHITECTURES else n_layer - 1
    if not isinstance(n_layer, int) or max(layers) > last:
        return Rule(name, False, f"the drafter reads layer {max(layers)}, the target has {n_layer} layers")
    if not eagle3 and ("markov_w1.weight" in draft.tensor_bytes or draft.arch("selector_top_k", 0) > 0):
        return Rule(name, False, "a DSpark or DFlash2 drafter (llama.cpp's draft-dspark), which localspec does not"
                    " run yet")
    if not eagle3 and draft.get("tokenizer.ggml.mask_token_id") is None:
        return Rule(name, False, "the DFlash drafter names no mask token (tokenizer.ggml.mask_token_id)")
    return Rule(name, True, f"the inputs of target layers {', '.join(map(str, layers))}")
