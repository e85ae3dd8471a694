"""Drafters that draft beside a generation's own drafter (`then`), where they know better: the
predicted text, and the text a grammar admits alone."""

from collections.abc import Generator

from ...config import DrafterKind
from ...events import Step
from ..model import Model
from ..grammar import Grammar
from ..tree import Alternative, DraftTree
from ..turns import Turn, decoded_alone
from .base import Draft, Drafter, Learner, proposal
from .free import MIN_OFFER


PREDICTION_MIN_MATCH = 4  # output tokens that must match the prediction before it drafts again after a departure
EDIT_MATCH, EDIT_REACH = 2, 16  # fewer suffice within this many tokens past where the output left it
EDIT_SPAN = 8  # the longest edit (tokens replaced, tokens instead) learned and made in the rest of a prediction


class PredictionDrafter:
    """The text the user expects (OpenAI's Predicted Outputs: typically the file being edited) drafts
    wherever the output follows it; elsewhere the generation's own drafter (`then`) drafts.

    It follows the output through the prediction token by token. Where the output departs from it (an
    edit), it waits until the output's last tokens are found in the prediction again, preferring the
    first place after where it left (edits keep the file's order). A draft offers as many tokens as the
    output has followed the prediction without a break (at least MIN_OFFER): a long draft right after a
    departure would mostly be rejected, and a rejected long draft costs a big verification batch.
    Its drafts are deterministic (q one-hot), so under sampling each token is kept with p(x): lossless.
    """

    kind = DrafterKind.PREDICTION

    def __init__(self, prediction: list[int], then: Drafter, then_limit: int, forks: int = 0):
        """forks: where an edit seen once (it may be a one-off) could come again within a draft, verify both
        sides as a draft tree, up to this many such forks a draft (0: none)."""
        self.then, self.then_limit, self.forks = then, then_limit, forks
        self.learner = then if isinstance(then, Learner) else None  # (a Protocol's isinstance costs 10 us: once)
        self._expect(list(prediction))
        self.edits: dict[tuple[int, ...], tuple[int, ...]] = {}  # each short edit seen once: what replaced what

    @property
    def branches(self) -> int:
        """The most branches its drafts' trees have (its own drafts'; `then`'s its own)."""
        return max(self.forks + 1, getattr(self.then, "branches", 1))

    def _expect(self, prediction: list[int]) -> None:
        self.prediction = prediction
        self.index: dict[tuple[int, ...], list[int]] = {}  # each n-gram of the prediction -> the positions after it
        n = PREDICTION_MIN_MATCH
        for end in range(n, len(prediction)):
            self.index.setdefault(tuple(prediction[end - n : end]), []).append(end)

    def begin(self, prompt, sampling, rng) -> None:
        self.then.begin(prompt, sampling, rng)
        self.at: int | None = 0  # where in the prediction the next output token is expected; None: departed
        self.followed = 0  # output tokens that have followed the prediction since the last departure
        self.left = 0  # where in the prediction the output last departed
        self.departed = 0  # where in history it did
        self.compared = len(prompt)  # history positions already held against the prediction

    def propose(self, history, k) -> Draft:
        return decoded_alone(self.proposing(history, k))

    def proposing(self, history: list[int], k: int) -> Generator[Turn, None, Draft]:
        self._follow(history)
        if self.at is not None and self.at < len(self.prediction):
            offer = min(k, max(self.followed, MIN_OFFER))
            tokens = self.prediction[self.at : self.at + offer]
            others = self._edited(offer) if self.forks else ()
            return Draft(tokens, source=self.kind, run=self.followed, alternatives=others,
                         tree=DraftTree.forked(tokens, others) if others else None)
        return (yield from proposal(self.then, history, min(k, self.then_limit)))

    def _edited(self, offer: int) -> tuple[Alternative, ...]:
        """Both sides of a fork: where an edit seen once begins in the next `offer` tokens of the prediction,
        the text with the edit made there, from the first token where the two differ."""
        found: dict[int, Alternative] = {}  # one a fork: the first edit found there
        for start in range(offer):
            at = self.at + start
            for replaced, by in self.edits.items():
                if tuple(self.prediction[at : at + len(replaced)]) != replaced:
                    continue
                same = next((i for i, (a, b) in enumerate(zip(replaced, by)) if a != b), min(len(replaced), len(by)))
                edited = [*by[same:], *self.prediction[at + len(replaced) :]][: offer - start - same]
                if edited and start + same < offer and edited[0] != self.prediction[at + same]:
                    found.setdefault(start + same, Alternative(start + same, 2, tuple(edited)))
        return tuple(sorted(found.values(), key=lambda other: other.fork)[: self.forks])

    def observe(self, step: Step) -> None:
        # the generation's own drafter learns from its own steps only: a prediction's steps say nothing of it
        if step.drafter != self.kind and self.learner is not None:
            self.learner.observe(step)

    def _follow(self, history: list[int]) -> None:
        for position in range(self.compared, len(history)):
            if self.at is not None and self.at < len(self.prediction) and self.prediction[self.at] == history[position]:
                self.at += 1
                self.followed += 1
            elif self.at is not None:
                self.left, self.departed, self.at, self.followed = self.at, position, None, 0
        self.compared = len(history)
        if self.at is None:
            self._find_again(history)

    def _find_again(self, history: list[int]) -> None:
        # An edit usually replaces a few tokens and goes on with the text after them (a renamed
        # variable): the answer's last two tokens found just past where it left need no more proof.
        tail = history[-EDIT_MATCH:]
        nearby = self.prediction[self.left : self.left + EDIT_REACH + EDIT_MATCH]
        for start in range(len(nearby) - EDIT_MATCH + 1):
            if nearby[start : start + EDIT_MATCH] == tail:
                self.at, self.followed = self.left + start + EDIT_MATCH, EDIT_MATCH
                self._learn(self.prediction[self.left : self.left + start], history[self.departed : -EDIT_MATCH])
                return
        places = self.index.get(tuple(history[-PREDICTION_MIN_MATCH:]))
        if places:
            self.at = next((place for place in places if place >= self.left), places[0])
            self.followed = PREDICTION_MIN_MATCH

    def _learn(self, replaced: list[int], by: list[int]) -> None:
        """The same short edit seen a second time (a renamed variable) is made in the rest of the
        prediction, so drafts carry it; once could be a one-off change of a common token."""
        if not 0 < len(replaced) <= EDIT_SPAN or not 0 < len(by) <= EDIT_SPAN:
            return
        key, value = tuple(replaced), list(by)
        if self.edits.get(key) != tuple(value):
            self.edits[key] = tuple(value)
            return
        rest, edited, i = self.prediction[self.at :], [], 0
        while i < len(rest):
            if tuple(rest[i : i + len(key)]) == key:
                edited += value
                i += len(key)
            else:
                edited.append(rest[i])
                i += 1
        self._expect(self.prediction[: self.at] + edited)


FORCED_CHARACTERS_PER_TOKEN = 8  # how far a forced text is looked for, per token that may be drafted
# A forced text's last token is drafted only if no character the grammar admits after it would merge
# into it (`"` before `:`, where the target writes `":`); past this many admitted characters, assume one would.
MERGES_CHECKED = 8


class ForcedDrafter:
    """Jump-forward decoding, kept lossless: where the grammar admits one text alone (a JSON schema's
    key and its closing quote, an enum's only value left), that text, tokenized, is the draft; elsewhere
    the generation's own drafter (`then`) drafts.

    SGLang appends such text without the target; with a BPE vocabulary that is not the target's output,
    which may spell the same text with other tokens (`"sum` + `mary`), so here the target verifies it
    like any other draft: nearly always accepted, and the output stays the target's own. Its drafts are
    deterministic (q one-hot), so under sampling each token is kept with the masked p(x)."""

    kind = DrafterKind.FORCED

    def __init__(self, grammar: Grammar, model: Model, then: Drafter):
        self.grammar, self.model, self.then = grammar, model, then
        self.learner = then if isinstance(then, Learner) else None  # (a Protocol's isinstance costs 10 us: once)

    def begin(self, prompt, sampling, rng) -> None:
        self.then.begin(prompt, sampling, rng)

    def propose(self, history, k) -> Draft:
        return decoded_alone(self.proposing(history, k))

    def proposing(self, history: list[int], k: int) -> Generator[Turn, None, Draft]:
        forced = self._forced(k)
        drafted = yield from proposal(self.then, history, k)
        # The generation's own drafter may see further (a suffix-cache match runs on past a key into the
        # punctuation after it): its draft stands wherever it spells the forced text and goes on.
        spelled = self.model.spell_of
        if forced and not (len(drafted.tokens) > len(forced) and spelled(drafted.tokens).startswith(spelled(forced))):
            return Draft(forced, source=self.kind)
        return drafted

    def _forced(self, k: int) -> list[int]:
        """Up to k tokens of the text the grammar forces from here."""
        if k == 0:
            return []
        text, after = self.grammar.forced_text(self.model.character_tokens, self.model.end_tokens,
                                               FORCED_CHARACTERS_PER_TOKEN * k)
        tokens = self.model.spell(text) if text else []
        if tokens and not self._ends_cleanly(text, tokens, after):
            tokens.pop()
        return tokens[:k]

    def _ends_cleanly(self, text: str, tokens: list[int], after: str) -> bool:
        """Whether the text's last token stays one whatever admitted character follows it."""
        return len(after) <= MERGES_CHECKED and all(self.model.spell(text + c)[: len(tokens)] == tokens for c in after)

    def observe(self, step: Step) -> None:
        # the generation's own drafter learns from its own steps only
        if step.drafter != self.kind and self.learner is not None:
            self.learner.observe(step)
