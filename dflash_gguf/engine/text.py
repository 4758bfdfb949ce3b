"""Tokens → text for streaming: complete UTF-8 only, and stop strings that may span tokens."""

from __future__ import annotations

import codecs
from typing import Callable, Sequence


class TextStream:
    """Feed token pieces, get printable text; holds back text that could still become a stop string.

    `feed` returns the new text safe to show; `stopped` turns True once a stop string appears
    (the stop string and anything after it are never returned); `finish` flushes the rest.
    """

    def __init__(self, token_bytes: Callable[[int], bytes], stop: Sequence[str] = ()):
        self._piece = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._stop = [s for s in stop if s]
        self._pending = ""          # decoded text not yet returned
        self.text = ""              # everything returned so far
        self.stopped = False
        self.stop_word = ""         # the stop string that ended the text

    def feed(self, tokens: Sequence[int]) -> str:
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(b"".join(self._piece(t) for t in tokens))
        return self._release(final=False)

    def finish(self) -> str:
        if not self.stopped:
            self._pending += self._decoder.decode(b"", final=True)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        if self.stopped:
            return ""
        found = [(i, s) for s in self._stop if (i := self._pending.find(s)) >= 0]
        if found:
            cut, self.stop_word = min(found)
            out, self._pending, self.stopped = self._pending[:cut], "", True
        elif final or not self._stop:
            out, self._pending = self._pending, ""
        else:  # keep the longest tail that is a prefix of some stop string
            hold = max((k for s in self._stop for k in range(1, min(len(s), len(self._pending)) + 1)
                        if self._pending.endswith(s[:k])), default=0)
            out, self._pending = self._pending[:len(self._pending) - hold], self._pending[len(self._pending) - hold:]
        self.text += out
        return out
