"""Token bytes to text, holding back what a stop string might still claim."""

import codecs


class TextStream:
    """Feed token pieces in order; get back the text that is safe to show.

    Text is held back while it could be the start of a stop string, and while a
    multi-byte UTF-8 character is incomplete. Once a stop string appears,
    `stopped` is set to it and nothing from it on is ever released.
    """

    def __init__(self, stop: tuple[str, ...] = ()):
        self._stop = stop
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self.text = ""
        self.stopped: str | None = None  # the stop string that ended the text

    def push(self, piece: bytes) -> str:
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(piece)
        hits = [(at, stop) for stop in self._stop if (at := self._pending.find(stop)) >= 0]
        if hits:
            at, self.stopped = min(hits, key=lambda hit: hit[0])
            return self._release(at)
        return self._release(len(self._pending) - self._longest_stop_prefix_at_end())

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
