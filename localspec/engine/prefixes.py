"""Long texts' tokens reused where a new text begins as an earlier one did: an agent or a chat sends its whole
conversation at every request, rendered anew, and tokenizing it whole took 39 of a turn's 42 ms at 32,600 tokens.

llama.cpp tokenizes a text with special tokens parsed in two passes: it first splits the text at every occurrence
of a special token's text (each special token in turn, the longest first, left to right), then tokenizes each
piece of plain text between them apart. So where a special token X sits at byte c of two texts that agree up to
it, and X is recognized there in both, the tokens before it are the same in both, and the tokens from it on are
what the text from c on gives alone. X is recognized at every occurrence of its text when no special token's
text overlaps it (contains it, or begins where it ends or ends where it begins) and it does not overlap itself:
such a control token is an anchor, and the k-th occurrence of its text is its k-th token. The tokenizers that
hold no state from one piece to the next are the ones this is used for (BPE, SentencePiece: after a special
token both put a space before the next piece alike; Model.anchors says which)."""

import threading
from dataclasses import dataclass

import numpy as np

KEPT = 8  # texts kept (a server's clients, each going on from its own last request)
MOST_BYTES = 32 << 20  # of their text and tokens together, the oldest dropped first


@dataclass(frozen=True)
class Tokenized:
    data: bytes
    add_special: bool
    tokens: np.ndarray  # int32
    anchors: tuple[tuple[int, int, int], ...]  # (byte offset, token index, text length) of each anchor, in order


def anchors_of(texts: dict[int, bytes], controls: set[int]) -> dict[int, bytes]:
    """The control tokens whose text no special token's text overlaps, nor their own: texts holds every special
    token's (control, user-defined, unknown) by id."""
    joined = b"\x00".join(texts.values())
    prefixes = {text[:k] for text in texts.values() for k in range(1, len(text))}  # proper ones
    suffixes = {text[-k:] for text in texts.values() for k in range(1, len(text))}
    return {token: text for token, text in texts.items()
            if token in controls and text.strip() and b"\x00" not in text and joined.count(text) == 1
            and not any(text[:k] in suffixes or text[-k:] in prefixes for k in range(1, len(text)))}


class Prefixes:
    """The last KEPT long texts a model tokenized with special tokens parsed, and where their anchors are."""

    def __init__(self, anchors: dict[int, bytes], bos: int | None = None):
        """bos: the token tokenizing with add_special puts before the text's own, where the model has one."""
        self.anchors, self.bos = anchors, bos
        self._ids = np.fromiter(anchors, dtype=np.int32, count=len(anchors))
        self._kept: list[Tokenized] = []  # the latest last
        self._lock = threading.Lock()

    def tokens(self, data: bytes, add_special: bool, tokenize) -> list[int]:
        """The text's tokens: an earlier text's up to the last anchor both share, then the rest tokenized alone
        (tokenize(data, add_special, parse_special) is llama.cpp's); the whole text tokenized where none is shared."""
        with self._lock:
            kept = list(self._kept)
        best = None  # (tokens before the cut, where the cut is)
        for earlier in kept:
            if earlier.add_special != add_special or not earlier.anchors:
                continue
            shared = _shared(earlier.data, data)
            cut = _last_anchor(earlier.anchors, shared)
            if cut is not None and (best is None or cut[0] > best[1]):
                best = (earlier.tokens[: cut[1]], cut[0])
        if best is None:
            tokens = np.asarray(tokenize(data, add_special, True), dtype=np.int32)
        else:
            tokens = np.concatenate([best[0], np.asarray(tokenize(data[best[1] :], False, True), dtype=np.int32)])
        self._keep(data, add_special, tokens)
        return tokens.tolist()

    def _keep(self, data: bytes, add_special: bool, tokens: np.ndarray) -> None:
        first = int(add_special and self.bos is not None and len(tokens) > 0 and tokens[0] == self.bos)
        at = np.flatnonzero(np.isin(tokens[first:], self._ids)) + first  # (the BOS added is no text's)
        found, anchors = {}, []
        for index in at.tolist():
            token = int(tokens[index])
            text = self.anchors[token]
            offset = data.find(text, found.get(token, 0))
            if offset < 0:  # (no such text where its token is: read as without anchors)
                anchors = []
                break
            found[token] = offset + len(text)
            anchors.append((offset, index, len(text)))
        anchors.sort()
        # each token's texts matched in order: every occurrence must be one of its tokens
        if any(data.count(self.anchors[token]) != int((tokens[first:] == token).sum()) for token in found):
            anchors = []
        with self._lock:
            kept = [earlier for earlier in self._kept if earlier.data != data or earlier.add_special != add_special]
            kept = [*kept[-(KEPT - 1):], Tokenized(data, add_special, tokens, tuple(anchors))]
            while sum(len(one.data) + one.tokens.nbytes for one in kept) > MOST_BYTES:
                kept.pop(0)
            self._kept = kept


def _shared(a: bytes, b: bytes) -> int:
    """How many leading bytes a and b share (halving, each comparison a memcmp)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        middle = (lo + hi + 1) // 2
        if a[lo:middle] == b[lo:middle]:
            lo = middle
        else:
            hi = middle - 1
    return lo


def _last_anchor(anchors: tuple[tuple[int, int, int], ...], shared: int) -> tuple[int, int] | None:
    """(byte offset, token index) of the last anchor whose text lies within the first `shared` bytes."""
    last = None
    for offset, index, length in anchors:
        if offset + length > shared:
            break
        last = (offset, index)
    return last
