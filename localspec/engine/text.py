"""Token bytes to text, holding back what a stop string might still claim."""

import codecs


class TextStream:
    """Feed token pieces in order; get back the text that is safe to show.

    Text is held back while it could be the start of a stop string, and while a
    multi-byte UTF-8 character is incomplete. Once a stop string appears,
    `stopped` is set to it and nothing from it on is ever released. indent: a line
    after the first whose text starts with less indentation than this ends the text
    before that text (`outdented`), as llama-server's n_indent.
    """

    def __init__(self, stop: tuple[str, ...] = (), indent: int = 0):
        self._stop, self._indent = stop, indent
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self._line: int | None = None  # the indentation of a line whose text has not begun (none before a newline)
        self.text = ""
        self.stopped: str | None = None  # the stop string that ended the text
        self.outdented = False

    def push(self, piece: bytes) -> str:
        if self.stopped or self.outdented:
            return ""
        new = self._decoder.decode(piece)
        if self._indent and (cut := self._outdent(new)) is not None:
            new, self.outdented = new[:cut], True
        self._pending += new
        hits = [(at, stop) for stop in self._stop if (at := self._pending.find(stop)) >= 0]
        if hits:
            at, self.stopped = min(hits, key=lambda hit: hit[0])
            return self._release(at)
        if self.outdented:
            return self._release(len(self._pending))
        return self._release(len(self._pending) - self._longest_stop_prefix_at_end())

    def _outdent(self, new: str) -> int | None:
        """Where in new text a line less indented than asked begins its text, if one does (an empty line
        too, as llama-server ends there)."""
        for at, character in enumerate(new):
            if self._line is not None:
                if character in " \t":
                    self._line += 1
                    continue
                if self._line < self._indent:
                    return at
                self._line = None
            if character == "\n":
                self._line = 0
        return None

    def flush(self) -> str:
        """Release everything held back once generation has ended for another reason. A character
        cut short by the end (max tokens inside a multi-byte character) is dropped, not shown as U+FFFD."""
        if self.stopped:
            return ""
        self._decoder.reset()
        return self._release(len(self._pending))

    def _release(self, upto: int) -> str:
        out, self._pending = self._pending[:upto], self._pending[upto:]
        if self.stopped:
            self._pending = ""
        self.text += out
        return out

    def _longest_stop_prefix_at_end(self) -> int:
        longest = 0
        for stop in self._stop:
            for size in range(min(len(stop) - 1, len(self._pending)), longest, -1):
                if self._pending.endswith(stop[:size]):
                    longest = size
                    break
        return longest


def unshown_tokens(pieces: list[bytes], shown: str) -> int:
    """How many of a generation's last tokens (their pieces in order) lie wholly past the text it shows: a stop
    string's, which no text carries (one that straddles the stop's start is counted shown)."""
    beyond = sum(map(len, pieces)) - len(shown.encode())
    count = 0
    for piece in reversed(pieces):
        if len(piece) > beyond:
            break
        beyond -= len(piece)
        count += 1
    return count
