"""A draft model whose vocabulary is not the target's drafts through text (speculative decoding across
vocabularies: Timor et al., "Accelerating LLM Inference with Lossless Speculative Decoding Algorithms for
Heterogeneous Vocabularies", ICML 2025).

Both models read the same text: the draft's cache holds the text of the target's tokens, tokenized by the
draft's own tokenizer, and where the two tokenizers cut that text at different places, the draft's cache
keeps what agrees with the text up to the last boundary of its own both agree on and reads the rest anew.

Greedy (T = 0), a draft goes through text: the draft's tokens are written out and the text tokenized by the
target; the target keeps what is its own argmax, as for any draft, so the output is its own whatever the
draft wrote. Sampling (T > 0), a draft keeps to the token-level intersection (the paper's TLI, vLLM's): the
draft tokens that spell exactly what one target token spells. The draft's distribution, restricted to them
and renormalised, is a q over target tokens that the draft token is truly drawn from, so the usual rejection
rule keeps the target's distribution. (The text route would also be lossless at T > 0, its drafts taken as
one-hot, but a one-hot q is accepted only with p(x), where min(1, p(x)/q(x)) accepts more.)

Special and control tokens never cross: a draft token with no text of its own (a control or end token, a
SentencePiece byte-fallback token) ends the draft, as does a history that ends inside a character (a
byte-level BPE token may write part of one: the draft waits for the rest).
"""

from collections.abc import Generator

import numpy as np

from ...config import DrafterKind
from .. import backend
from ..backend import Context
from ..library import llama
from ..model import Model
from ..sampling import Dist
from ..turns import Turn, decoded_alone, timed
from .base import Draft
from .forward import ForwardDrafter, next_draft_token


def _texts(model: Model) -> tuple[list[bytes], np.ndarray]:
    """What each of a model's tokens is read as (special tokens' own text; nothing for a start token the
    model adds), and which of them write text of their own in generated text: not a control, unknown or
    byte token, nor an end of generation."""
    no_text = (llama.LLAMA_TOKEN_ATTR_CONTROL | llama.LLAMA_TOKEN_ATTR_BYTE | llama.LLAMA_TOKEN_ATTR_UNKNOWN
               | llama.LLAMA_TOKEN_ATTR_UNUSED)
    texts = [model.special_piece(token) for token in range(model.n_vocab)]
    writes = np.array([bool(text) and not llama.llama_vocab_get_attr(model.vocab, token) & no_text
                       and not model.is_eog(token) for token, text in enumerate(texts)], bool)
    if model.add_bos and (bos := llama.llama_vocab_bos(model.vocab)) >= 0:
        texts[bos] = b""
    return texts, writes


def complete(text: bytes | bytearray) -> int:
    """How many bytes of text end at a whole UTF-8 character (a token may write part of one)."""
    for back in range(1, min(4, len(text)) + 1):
        byte = text[-back]
        if byte & 0xC0 != 0x80:  # the last character's first byte
            length = 1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
            return len(text) if back >= length else len(text) - back
    return len(text)


def _starts_character(text: bytes | bytearray, at: int) -> bool:
    return at >= len(text) or text[at] & 0xC0 != 0x80


def _inside_word(text: bytes | bytearray, at: int) -> bool:
    """Whether text is cut inside a word at this byte: a tokenizer's pre-tokenizer would not cut there."""
    return 0 < at < len(text) and all(chr(b).isalnum() or b == 0x5F or b >= 0x80 for b in text[at - 1 : at + 1])


class Vocabularies:
    """A target's and a draft's vocabularies side by side: the draft tokens that spell exactly what one
    target token spells (the intersection), and the text each model's tokens are read as. Reading both
    vocabularies takes 0.5-1 s (Qwen's 152k tokens beside SmolLM2's 49k or Gemma 3's 262k), once per pair."""

    def __init__(self, target: Model, draft: Model):
        self.target, self.draft = target, draft
        self.target_texts, target_writes = _texts(target)
        self.draft_texts, self.crosses = _texts(draft)  # crosses: the draft tokens a draft may go on with
        spelled: dict[bytes, int] = {}
        for token in np.flatnonzero(target_writes).tolist():
            spelled.setdefault(self.target_texts[token], token)
        self.to_target = np.full(draft.n_vocab, -1, np.int64)  # a draft token's target token, -1: none
        self.to_draft: dict[int, int] = {}
        for token in np.flatnonzero(self.crosses).tolist():
            match = spelled.get(self.draft_texts[token])
            if match is not None and match not in self.to_draft:  # one draft token a target token: q stays a distribution
                self.to_target[token] = match
                self.to_draft[match] = token
        self.draft_bos = llama.llama_vocab_bos(draft.vocab) if draft.add_bos else None

    @property
    def shared(self) -> float:
        """The share of the draft's tokens with text of their own that spell one target token each."""
        return len(self.to_draft) / max(1, int(self.crosses.sum()))

    def restricted(self, q: Dist) -> Dist | None:
        """The draft's distribution restricted to the intersection and renormalised, over target tokens;
        None where none of its tokens is in it."""
        mapped = self.to_target[q.ids]
        kept = mapped >= 0
        mass = q.probs[kept].sum()
        return Dist(mapped[kept], q.probs[kept] / mass) if mass > 0 else None


class AcrossDrafter(ForwardDrafter):
    """A draft model with a vocabulary of its own, run on its own llama.cpp context, drafting through
    text (greedy) or the intersection of the two vocabularies (sampling)."""

    kind = DrafterKind.DRAFT

    def __init__(self, context: Context, p_min: float, vocabularies: Vocabularies):
        super().__init__(context, p_min)
        self.vocabularies = vocabularies
        self._ends: list[int] = []  # where the text of each token in the cache ends, in bytes
        self._held = bytearray()  # the text the cache holds
        self._text, self._texted = bytearray(), 0  # the history's text, and how many of its tokens that is
        self._sure = 0  # how many bytes of the cache's text are known to be the history's
        self._whole = True  # whether the history's text ends at a whole character
        self._answer = 0  # where the generation's own tokens start in the history (after the prompt)

    @classmethod
    def made(cls, target: Context, context: Context, p_min: float) -> "AcrossDrafter":
        return cls(context, p_min, Vocabularies(target.model, context.model))

    def for_sequence(self, target: Context, seq: int) -> "AcrossDrafter":
        return type(self)(self.context.sequence(seq), self.p_min, self.vocabularies)

    def begin(self, prompt, sampling, rng) -> None:
        """Start a generation and read the prompt now, while the target reads it (on a shared context,
        at the first draft)."""
        self.prepare(sampling, rng)
        self._answer = len(prompt)
        if self.context.n_seq == 1:
            decoded_alone(self._ready(prompt))

    def prepare(self, sampling, rng) -> None:
        super().prepare(sampling, rng)
        self._text.clear()
        self._texted = self._sure = 0

    def behind(self, history: list[int]) -> int:
        """Target tokens read since the last draft (about as many draft tokens to read first)."""
        return len(history) - self._texted

    def proposing(self, history: list[int], k: int) -> Generator[Turn, None, Draft]:
        if k == 0:
            return Draft.nothing(self.kind)
        _, caught_up = yield from timed(self._ready(history))
        tokens, dists = [], None
        if self._whole and self.context.tokens:  # (a history of no text at all, as a lone start token, reads none)
            if self.sampling.greedy:
                tokens = yield from self._through_text(k)
            else:
                tokens, dists = yield from self._in_common(k)
        return Draft(tokens, dists, source=self.kind, catch_up_seconds=caught_up)

    def _ready(self, history: list[int]) -> Generator[Turn, None, None]:
        """Read the history's text: keep the cached tokens whose text agrees with it, up to a boundary
        where the rest can be tokenized alone, and read the rest as the draft tokenizes it."""
        for token in history[self._texted :]:
            self._text += self.vocabularies.target_texts[token]
        self._texted = len(history)
        whole = complete(self._text)
        self._whole = whole == len(self._text)
        text = self._text[:whole]
        del self._ends[len(self.context.tokens) :]  # whatever emptied the cache meanwhile (a reset)
        agreed = self._agreed(text)
        keep = self.context.keep_common(self.context.tokens[:agreed], agreed)
        self._keep(keep)
        start = self._ends[-1] if self._ends else 0
        tokens = self._mapped(history[self._answer :], len(text) - start) if keep else None
        if tokens is None:
            tokens = self._tokens_for(bytes(text[start:]), start == 0 and keep == 0)
        yield from self._read(tokens)
        self._sure = len(self._held) if self._held == text[: len(self._held)] else start
        if self.context.recurrent:
            # drafting decodes a token at a time, further back than a recurrent state's snapshots reach
            self.context.checkpoint()
        if backend.CHECK_CACHES:
            self.context.check_holds(self.context.tokens)
            assert self._held == b"".join(self.vocabularies.draft_texts[t] for t in self.context.tokens)

    def _agreed(self, text: bytearray) -> int:
        """How many cached tokens to keep: those whose text agrees with the history's, back to a boundary
        inside no character (and no word, where text follows it), and one less where nothing follows (the
        next draft reads the logits of a token read anew)."""
        same = most = min(len(self._held), len(text))
        if self._held[self._sure : most] != text[self._sure : most]:  # only what was drafted since is compared
            same = self._sure
            while self._held[same] == text[same]:
                same += 1
        agreed = len(self._ends)
        while agreed and self._ends[agreed - 1] > same:
            agreed -= 1
        while agreed and not _starts_character(text, self._ends[agreed - 1]):
            agreed -= 1
        if agreed and _inside_word(text, self._ends[agreed - 1]):
            agreed -= 1  # the draft's tokenizer would write the word's rest with its start
        if agreed and self._ends[agreed - 1] == len(text):
            agreed -= 1
        return agreed

    def _keep(self, n: int) -> None:
        del self._ends[n:]
        del self._held[self._ends[-1] if self._ends else 0 :]
        self._sure = min(self._sure, len(self._held))

    def _mapped(self, answer: list[int], length: int) -> list[int] | None:
        """The draft tokens of the answer's last target tokens, where they spell the last `length` bytes of
        the history's text and each is in the intersection (mostly the target's own token after a draft):
        a tokenizer call saved, which costs more than the rest of a step's host work. None where they do
        not (a prompt is read as the draft's tokenizer writes it, so alike at once or in pieces)."""
        tokens: list[int] = []
        for token in reversed(answer):
            if length <= 0:
                break
            own = self.vocabularies.to_draft.get(token)
            if own is None:
                return None
            tokens.append(own)
            length -= len(self.vocabularies.target_texts[token])
        return tokens[::-1] if length == 0 and tokens else None

    def _tokens_for(self, text: bytes, at_start: bool) -> list[int]:
        """The draft's tokens for text that follows the cache's."""
        draft = self.vocabularies.draft
        words = text.decode("utf-8", errors="replace")
        # where no tokens spell the text exactly, the draft reads what its tokenizer makes of it: the next
        # draft's comparison of texts reads it anew from where they part
        tokens = draft.spell(words, special=True) or draft.tokenize(words, add_special=False, parse_special=True)
        bos = self.vocabularies.draft_bos
        return [bos, *tokens] if at_start and bos is not None else tokens

    def _read(self, tokens: list[int]) -> Generator[Turn, None, None]:
        """Decode tokens after the cache's, the last with its logits, and keep where their texts end."""
        if not tokens:
            return
        yield from self._decoded(tokens, "last")
        for token in tokens:
            self._held += self.vocabularies.draft_texts[token]
            self._ends.append(len(self._held))

    def _through_text(self, k: int) -> Generator[Turn, None, list[int]]:
        """Greedy: up to k draft tokens written out, and the target's tokens for that text (at most k)."""
        text, drafted = bytearray(), 0
        while drafted < k:
            token, _ = self._next()
            if token is None or not self.vocabularies.crosses[token]:
                break
            text += self.vocabularies.draft_texts[token]
            drafted += 1
            if drafted < k:
                yield from self._read([token])
        try:
            words = bytes(text[: complete(text)]).decode("utf-8")
        except UnicodeDecodeError:
            return []
        return self.vocabularies.target.spell(words)[:k] if words else []

    def _in_common(self, k: int) -> Generator[Turn, None, tuple[list[int], list[Dist]]]:
        """Sampling: up to k target tokens drawn from the draft's distribution over the intersection."""
        tokens: list[int] = []
        dists: list[Dist] = []
        while len(tokens) < k:
            q = self.vocabularies.restricted(self._q())
            token = None if q is None else next_draft_token(q, self.p_min, self.sampling, self.rng)
            if token is None:
                break
            tokens.append(token)
            dists.append(q)
            if len(tokens) < k:
                yield from self._read([self.vocabularies.to_draft[token]])
        return tokens, dists
