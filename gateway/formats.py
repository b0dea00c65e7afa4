"""How a generation is shown to the client: chat completions and text completions, whole or as
stream chunks. The pipeline (``gateway.chat_service``) is the same for both; only these differ.

Chat stream, per choice:  {role: assistant, content: ""} → {content: "..."}* → {} + finish_reason
then, with ``stream_options.include_usage``, one chunk with ``choices: []`` and the full usage.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from pydantic import BaseModel

from gateway.ids import new_hex_id
from gateway.schemas import (
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatResponseMessage,
    ChunkChoice,
    ChunkDelta,
    Completion,
    CompletionChoice,
    PromptTokensDetails,
    Usage,
)


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
    id: str = field(default_factory=lambda: "chatcmpl-" + new_hex_id())
    created: int = field(default_factory=lambda: int(time.time()))

    def _chunk(self, choices: list[ChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=choices,
                                   usage=usage)

    def opening(self, n: int) -> list[BaseModel]:
        return [self._chunk([ChunkChoice(index=i, delta=ChunkDelta(role="assistant", content=""))])
                for i in range(n)]

    def text_chunk(self, index: int, text: str) -> BaseModel:
        return self._chunk([ChunkChoice(index=index, delta=ChunkDelta(content=text))])

    def finish_chunk(self, index: int, finish_reason: str) -> BaseModel:
        return self._chunk([ChunkChoice(index=index, delta=ChunkDelta(), finish_reason=finish_reason)])

    def usage_chunk(self, usage: Usage) -> BaseModel:
        return self._chunk([], usage)

    def response(self, texts: list[str], finish_reasons: list[str | None], usage: Usage) -> ChatCompletion:
        return ChatCompletion(
            id=self.id, created=self.created, model=self.model, usage=usage,
            choices=[ChatChoice(index=i, message=ChatResponseMessage(content=t), finish_reason=f)
                     for i, (t, f) in enumerate(zip(texts, finish_reasons, strict=True))],
        )


@dataclass(slots=True)
class CompletionFormat:
    model: str
    include_usage: bool = False
    echo_prefix: str = ""  # echo=True: the prompt text, shown before each choice's text
    id: str = field(default_factory=lambda: "cmpl-" + new_hex_id())
    created: int = field(default_factory=lambda: int(time.time()))

    def _chunk(self, choices: list[CompletionChoice], usage: Usage | None = None) -> Completion:
        return Completion(id=self.id, created=self.created, model=self.model, choices=choices, usage=usage)

    def opening(self, n: int) -> list[BaseModel]:
        if not self.echo_prefix:
            return []
        return [self._chunk([CompletionChoice(index=i, text=self.echo_prefix, finish_reason=None)])
                for i in range(n)]

    def text_chunk(self, index: int, text: str) -> BaseModel:
        return self._chunk([CompletionChoice(index=index, text=text, finish_reason=None)])

    def finish_chunk(self, index: int, finish_reason: str) -> BaseModel:
        return self._chunk([CompletionChoice(index=index, text="", finish_reason=finish_reason)])

    def usage_chunk(self, usage: Usage) -> BaseModel:
        return self._chunk([], usage)

    def response(self, texts: list[str], finish_reasons: list[str | None], usage: Usage) -> Completion:
        return self._chunk([CompletionChoice(index=i, text=self.echo_prefix + t, finish_reason=f)
                            for i, (t, f) in enumerate(zip(texts, finish_reasons, strict=True))], usage)
