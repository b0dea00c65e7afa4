"""Incremental detokenization with stop strings, one ``IncrementalDetokenizer`` per sequence.

Text is decoded over a short window of tokens (a few tokens of context before the new ones,
so leading spaces come out right); while the window ends in an incomplete UTF-8 character
(byte-level or byte-fallback tokens decode it as U+FFFD) nothing is released. Text that could
still be the start of a stop string is held back; a stop string found across any token
boundary ends the sequence and is never emitted.
"""

from __future__ import annotations

_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], stop: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.ids: list[int] = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""  # decoded output text so far (truncated at a stop string once found)
        self.emitted = 0  # characters of ``text`` already released
        self.stopped = False

    def add_token(self, token_id: int, check_stop: bool = True) -> bool:
        """Decode one more output token. Returns True when a stop string has just appeared
        (``text`` is then cut right before it). ``check_stop=False`` (before ``min_tokens``)
        lets stop strings pass."""
        self.ids.append(token_id)
        if self.tokenizer is None or self.stopped:
            return False
        decode = self.tokenizer.decode
        prefix = decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=True)
        full = decode(self.ids[self.prefix_offset :], skip_special_tokens=True)
        start = _new_from(prefix, full)
        if len(full) <= start or full.endswith("\ufffd"):
            return False  # nothing new yet, or half a character
        before = len(self.text)
        self.text += full[start:]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        if self.stop and check_stop:
            # only a stop string that ends in the new text: one that ended before was checked then,
            # or let pass before min_tokens (found by QA: searching back by the longest stop's
            # length found a shorter stop there afterwards, cut the answer where it had been let
            # pass and left the stop string, already released, in the output)
            cut = min((i for s in self.stop if (i := self.text.find(s, max(0, before - len(s) + 1))) != -1),
                      default=-1)
            if cut != -1:
                self.text = self.text[:cut]
                self.stopped = True
                return True
        return False

    def take_delta(self, finished: bool) -> str:
        """Text not yet released: everything when ``finished``, else all but a possible
        stop-string prefix at the end."""
        if finished and not self.stopped and self.tokenizer is not None and self.read_offset < len(self.ids):
            self._flush()
        end = len(self.text)
        if not finished and self.stop:
            end -= self._held_back()
        if end <= self.emitted:
            return ""
        delta = self.text[self.emitted : end]
        self.emitted = end
        return delta

    def _flush(self) -> None:
        """At the end, release whatever the pending tokens decode to (even a lone U+FFFD)."""
        decode = self.tokenizer.decode
        prefix = decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=True)
        full = decode(self.ids[self.prefix_offset :], skip_special_tokens=True)
        start = _new_from(prefix, full)
        if len(full) > start:
            self.text += full[start:]
        elif decode(self.ids[self.read_offset :], skip_special_tokens=True):
            # bytes of a character the prompt began and the answer left unfinished: a U+FFFD for
            # them, as for a character begun in the answer (found by QA: the answer read "")
            self.text += "\ufffd"
        self.prefix_offset = self.read_offset = len(self.ids)

    def _held_back(self) -> int:
        """The longest end of the text not yet released that begins a stop string. Released text
        cannot be held back, so only that end is searched: a few characters a token, whatever the
        stop strings' length (found by QA: 16 stops of 100,000 characters re-scanned the whole answer
        on every token, 0.2-0.46 s a step at 32,000 characters, on the engine's one thread)."""
        text, held = self.text, 0
        unreleased = len(text) - self.emitted
        for s in self.stop:
            for k in range(min(len(s) - 1, unreleased), held, -1):
                if text.endswith(s[:k]):
                    held = k
                    break
        return held


def _new_from(prefix: str, full: str) -> int:
    """Where the new text starts in ``full``: after ``prefix``, less the half character it may end
    with (a prompt of token ids that ends partway through a character, which the output's first
    token completes: found by QA, the character was in neither the prompt's text nor the answer,
    though its bytes were in ``logprobs``). A U+FFFD that stays one in ``full`` is the prompt's own."""
    start = len(prefix)
    while start and prefix[start - 1] == "\ufffd" and full[start - 1 : start] != "\ufffd":
        start -= 1
    return start
