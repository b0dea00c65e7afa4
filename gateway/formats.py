"""How a generation is shown to the client: chat completions and text completions, whole or as
stream chunks. The pipeline (``gateway.chat_service``) is the same for both; only these differ.

Chat stream, per choice:  {role: assistant, content: ""} → {content: "..."}* → {} + finish_reason
then, with ``stream_options.include_usage``, one chunk with ``choices: []`` and the full usage.

With ``token_bytes`` (the engine's, when the request asked for logprobs) each text chunk and each
whole choice carries its tokens' logprobs, shaped as OpenAI's: chat ``{"content": [{token,
logprob, bytes, top_logprobs}]}``, text completions ``{tokens, token_logprobs, top_logprobs,
text_offset}``. A token whose bytes are not whole UTF-8 (part of a character) is shown as
``bytes:\\xe2\\x80`` and its ``bytes`` hold the real ones.
"""

from __future__ import annotations

import codecs
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel

from gateway.ids import new_hex_id
from gateway.schemas import (
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatResponseMessage,
    ChoiceLogprobs,
    ChunkChoice,
    ChunkDelta,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    PromptTokensDetails,
    TokenLogprob,
    TopLogprob,
    Usage,
)

# one generated token's logprobs: (token id, its logprob, ((token id, logprob), ...) most likely first)
Entry = tuple[int, float, Sequence[tuple[int, float]]]
TokenBytes = Callable[[list[int]], list[bytes]]
LOWEST_LOGPROB = -9999.0  # OpenAI's stand-in for "very unlikely" (JSON has no -Infinity)


def token_text(raw: bytes) -> str:
    """The token as text, or ``bytes:\\xe2\\x80`` when it is part of a character."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def _lp(value: float) -> float:
    return value if value >= LOWEST_LOGPROB else LOWEST_LOGPROB


def _texts(entries: list[Entry], token_bytes: TokenBytes) -> tuple[list[bytes], list[list[bytes]]]:
    """The bytes of each entry's token and of its top tokens (one tokenizer call)."""
    ids = [e[0] for e in entries] + [t for e in entries for t, _ in e[2]]
    raw = token_bytes(ids)
    chosen, rest = raw[:len(entries)], iter(raw[len(entries):])
    return chosen, [[next(rest) for _ in e[2]] for e in entries]


def chat_logprobs(entries: list[Entry], token_bytes: TokenBytes) -> ChoiceLogprobs:
    chosen, tops = _texts(entries, token_bytes)
    return ChoiceLogprobs(content=[
        TokenLogprob(token=token_text(raw), logprob=_lp(lp), bytes=list(raw), top_logprobs=[
            TopLogprob(token=token_text(t_raw), logprob=_lp(t_lp), bytes=list(t_raw))
            for t_raw, (_, t_lp) in zip(top, top_entries, strict=True)])
        for (_, lp, top_entries), raw, top in zip(entries, chosen, tops, strict=True)])


class TextOffsets:
    """A choice's ``text_offset`` so far: characters of text before each token, counting a
    character split over tokens once its last byte has come."""

    __slots__ = ("decoder", "offset")

    def __init__(self, start: int) -> None:
        self.offset = start
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def advance(self, raw: bytes) -> int:
        """The offset of a token of these bytes; the next token's follows it."""
        at = self.offset
        self.offset += len(self.decoder.decode(raw))
        return at


def completion_logprobs(entries: list[Entry], token_bytes: TokenBytes, offsets: TextOffsets) -> CompletionLogprobs:
    """Each position's ``top_logprobs`` holds the chosen token too (as vLLM's)."""
    chosen, tops = _texts(entries, token_bytes)
    tokens, at, top_maps = [], [], []
    for (_, lp, top_entries), raw, top in zip(entries, chosen, tops, strict=True):
        text = token_text(raw)
        tokens.append(text)
        at.append(offsets.advance(raw))
        top_map = {token_text(t_raw): _lp(t_lp) for t_raw, (_, t_lp) in zip(top, top_entries, strict=True)}
        top_map.setdefault(text, _lp(lp))
        top_maps.append(top_map)
    return CompletionLogprobs(tokens=tokens, token_logprobs=[_lp(e[1]) for e in entries], top_logprobs=top_maps,
                              text_offset=at)


def make_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Usage:
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                 total_tokens=prompt_tokens + completion_tokens,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens))


_NATURAL_PIECE = re.compile(r"\s*\S+\s*|\s+")


def natural_pieces(text: str) -> Iterator[str]:
    """Split a stored answer into word-sized pieces for an SSE replay (concatenation == text)."""
    for m in _NATURAL_PIECE.finditer(text):
        yield m.group(0)


@dataclass(slots=True)
class ChatFormat:
    model: str
    include_usage: bool = False
    token_bytes: TokenBytes | None = None  # set: the request asked for logprobs
    id: str = field(default_factory=lambda: "chatcmpl-" + new_hex_id())
    created: int = field(default_factory=lambda: int(time.time()))

    def _chunk(self, choices: list[ChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=choices,
                                   usage=usage)

    def opening(self, n: int) -> list[BaseModel]:
        return [self._chunk([ChunkChoice(index=i, delta=ChunkDelta(role="assistant", content=""))])
                for i in range(n)]

    def text_chunk(self, index: int, text: str, logprobs: list[Entry] | None = None) -> BaseModel:
        shown = None if logprobs is None or self.token_bytes is None else chat_logprobs(logprobs, self.token_bytes)
        return self._chunk([ChunkChoice(index=index, delta=ChunkDelta(content=text), logprobs=shown)])

    def finish_chunk(self, index: int, finish_reason: str) -> BaseModel:
        return self._chunk([ChunkChoice(index=index, delta=ChunkDelta(), finish_reason=finish_reason)])

    def usage_chunk(self, usage: Usage) -> BaseModel:
        return self._chunk([], usage)

    def response(self, texts: list[str], finish_reasons: list[str | None], usage: Usage,
                 logprobs: list[list[Entry]] | None = None) -> ChatCompletion:
        shown: list[ChoiceLogprobs | None] = [None] * len(texts)
        if logprobs is not None and self.token_bytes is not None:
            shown = [chat_logprobs(entries, self.token_bytes) for entries in logprobs]
        return ChatCompletion(
            id=self.id, created=self.created, model=self.model, usage=usage,
            choices=[ChatChoice(index=i, message=ChatResponseMessage(content=t), finish_reason=f, logprobs=lp)
                     for i, (t, f, lp) in enumerate(zip(texts, finish_reasons, shown, strict=True))],
        )


@dataclass(slots=True)
class CompletionFormat:
    model: str
    include_usage: bool = False
    echo_prefix: str = ""  # echo=True: the prompt text, shown before each choice's text
    token_bytes: TokenBytes | None = None  # set: the request asked for logprobs
    id: str = field(default_factory=lambda: "cmpl-" + new_hex_id())
    created: int = field(default_factory=lambda: int(time.time()))
    offsets: dict[int, TextOffsets] = field(default_factory=dict)  # a streamed choice's, so far

    def _chunk(self, choices: list[CompletionChoice], usage: Usage | None = None) -> Completion:
        return Completion(id=self.id, created=self.created, model=self.model, choices=choices, usage=usage)

    def opening(self, n: int) -> list[BaseModel]:
        if not self.echo_prefix:
            return []
        return [self._chunk([CompletionChoice(index=i, text=self.echo_prefix, finish_reason=None)])
                for i in range(n)]

    def text_chunk(self, index: int, text: str, logprobs: list[Entry] | None = None) -> BaseModel:
        shown = None
        if logprobs is not None and self.token_bytes is not None:
            offsets = self.offsets.get(index)
            if offsets is None:
                offsets = self.offsets[index] = TextOffsets(len(self.echo_prefix))
            shown = completion_logprobs(logprobs, self.token_bytes, offsets)
        return self._chunk([CompletionChoice(index=index, text=text, finish_reason=None, logprobs=shown)])

    def finish_chunk(self, index: int, finish_reason: str) -> BaseModel:
        return self._chunk([CompletionChoice(index=index, text="", finish_reason=finish_reason)])

    def usage_chunk(self, usage: Usage) -> BaseModel:
        return self._chunk([], usage)

    def response(self, texts: list[str], finish_reasons: list[str | None], usage: Usage,
                 logprobs: list[list[Entry]] | None = None) -> Completion:
        shown: list[CompletionLogprobs | None] = [None] * len(texts)
        if logprobs is not None and self.token_bytes is not None:
            shown = [completion_logprobs(entries, self.token_bytes, TextOffsets(len(self.echo_prefix)))
                     for entries in logprobs]
        return self._chunk([CompletionChoice(index=i, text=self.echo_prefix + t, finish_reason=f, logprobs=lp)
                            for i, (t, f, lp) in enumerate(zip(texts, finish_reasons, shown, strict=True))], usage)
