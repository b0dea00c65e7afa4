"""How a generation is shown to the client: chat completions and text completions, whole or as
stream chunks. The pipeline (``gateway.chat_service``) is the same for both; only these differ.

Chat stream, per choice:  {role: assistant, content: ""} → {content: "..."}* → {} + finish_reason
then, with ``stream_options.include_usage``, one chunk with ``choices: []`` and the full usage.

With ``token_names`` (the engine's, when the request asked for logprobs) each text chunk and each
whole choice carries its tokens' logprobs, shaped as OpenAI's: chat ``{"content": [{token,
logprob, bytes, top_logprobs}]}``, text completions ``{tokens, token_logprobs, top_logprobs,
text_offset}``. A token whose bytes are not whole UTF-8 (part of a character) is shown as
``bytes:\\xe2\\x80`` and its ``bytes`` hold the real ones.
"""

from __future__ import annotations

import codecs
import re
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel
from pydantic_core import to_json

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
    PromptLogprobs,
    PromptTokensDetails,
    ScoredChatCompletion,
    ScoredCompletion,
    ScoredCompletionChoice,
    Usage,
)

# one token's logprobs: (token id, its logprob, ((token id, logprob), ...) most likely first); a
# prompt's first token (echo with logprobs) has (token id, None, None): nothing comes before it
Entry = tuple[int, float | None, Sequence[tuple[int, float]] | None]
LOWEST_LOGPROB = -9999.0  # OpenAI's stand-in for "very unlikely" (JSON has no -Infinity)


def token_text(raw: bytes) -> str:
    """The token as text, or ``bytes:\\xe2\\x80`` when it is part of a character."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def _lp(value: float) -> float:
    return value if value >= LOWEST_LOGPROB else LOWEST_LOGPROB  # (NaN compares False: shown as the floor)


class TokenNames:
    """An engine's tokens as logprobs show them, memoised per token id: (text, bytes as a list of
    ints, the bytes). One per engine (``for_engine``): a token is named once per process."""

    _by_engine: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self, token_bytes: Callable[[list[int]], list[bytes]]) -> None:
        self._token_bytes = token_bytes
        self._memo: dict[int, tuple[str, list[int], bytes]] = {}

    @classmethod
    def for_engine(cls, engine: object) -> TokenNames:
        names = cls._by_engine.get(engine)
        if names is None:
            names = cls._by_engine[engine] = cls(engine.token_bytes)  # type: ignore[attr-defined]
        return names

    def of(self, ids: list[int]) -> list[tuple[str, list[int], bytes]]:
        memo = self._memo
        missing = [i for i in dict.fromkeys(ids) if i not in memo]
        if missing:
            for i, raw in zip(missing, self._token_bytes(missing), strict=True):
                memo[i] = (token_text(raw), list(raw), raw)
        return [memo[i] for i in ids]


def _named(entries: list[Entry], names: TokenNames) -> tuple[list, list[list]]:
    """The names of each entry's token and of its top tokens (one lookup)."""
    found = names.of([e[0] for e in entries] + [t for e in entries for t, _ in e[2] or ()])
    chosen, rest = found[:len(entries)], iter(found[len(entries):])
    return chosen, [[next(rest) for _ in e[2] or ()] for e in entries]


def chat_logprobs(entries: list[Entry], names: TokenNames) -> dict:
    """OpenAI's chat ``logprobs`` (``{"content": [...], "refusal": None}``), as plain dicts."""
    chosen, tops = _named(entries, names)
    return {"content": [
        {"token": name[0], "logprob": _lp(lp), "bytes": name[1], "top_logprobs": [
            {"token": t_name[0], "logprob": _lp(t_lp), "bytes": t_name[1]}
            for t_name, (_, t_lp) in zip(top, top_entries, strict=True)]}
        for (_, lp, top_entries), name, top in zip(entries, chosen, tops, strict=True)], "refusal": None}


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


def completion_logprobs(entries: list[Entry], names: TokenNames, offsets: TextOffsets) -> dict:
    """Each position's ``top_logprobs`` maps token texts to logprobs, the chosen token's included
    (as vLLM's); two tokens of one text keep the likelier value, the chosen token its own."""
    chosen, tops = _named(entries, names)
    tokens, at, top_maps = [], [], []
    for (_, lp, top_entries), name, top in zip(entries, chosen, tops, strict=True):
        tokens.append(name[0])
        at.append(offsets.advance(name[2]))
        if lp is None:  # an echoed prompt's first token: null, as OpenAI shows it
            top_maps.append(None)
            continue
        top_map: dict[str, float] = {}
        for t_name, (_, t_lp) in zip(top, top_entries, strict=True):
            top_map.setdefault(t_name[0], _lp(t_lp))  # most likely first: the first of a text wins
        top_map[name[0]] = max(top_map.get(name[0], LOWEST_LOGPROB), _lp(lp))
        top_maps.append(top_map)
    return {"tokens": tokens, "token_logprobs": [None if e[1] is None else _lp(e[1]) for e in entries],
            "top_logprobs": top_maps, "text_offset": at}


def vllm_prompt_logprobs(ids: list[int], scored: list | None, names: TokenNames, k: int) -> PromptLogprobs:
    """vLLM's ``prompt_logprobs`` of one prompt from the engine's entries ((logprob, top, rank)
    per token, None for the first): per token ``{token id: {"logprob", "rank", "decoded_token"}}``,
    the prompt's own token first (its rank in the model's distribution), then the ``k`` most
    likely (ranks 1 to k); a token among both is listed once."""
    if scored is None:
        return [None] * len(ids)
    wanted = [t for t, e in zip(ids, scored, strict=True) if e is not None]
    wanted += [t for e in scored if e is not None for t, _ in e[1][:k]]
    named = dict(zip(wanted, names.of(wanted), strict=True))
    out: PromptLogprobs = []
    for token, entry in zip(ids, scored, strict=True):
        if entry is None:
            out.append(None)
            continue
        lp, top, rank = entry
        position = {str(token): {"logprob": _lp(lp), "rank": rank, "decoded_token": named[token][0]}}
        for i, (t, t_lp) in enumerate(top[:k]):
            position.setdefault(str(t), {"logprob": _lp(t_lp), "rank": i + 1, "decoded_token": named[t][0]})
        out.append(position)
    return out


def with_prompt_logprobs(answer: ChatCompletion | Completion, lists: list[PromptLogprobs]
                         ) -> ScoredChatCompletion | ScoredCompletion:
    """The answer with vLLM's ``prompt_logprobs``: a chat's at its top (one prompt), a text
    completion's on each choice (choice ``i`` of ``lists[i // (choices / prompts)]``)."""
    if isinstance(answer, ChatCompletion):
        return ScoredChatCompletion(**dict(answer), prompt_logprobs=lists[0])
    per_prompt = len(answer.choices) // len(lists)
    choices = [ScoredCompletionChoice(**dict(c), prompt_logprobs=lists[i // per_prompt])
               for i, c in enumerate(answer.choices)]
    return ScoredCompletion(**{**dict(answer), "choices": choices})


PIECE_ITEMS = 256  # list items encoded by one call in ``encode_in_pieces`` (~0.3 ms with 20 alternatives)


def _json_pieces(value: object) -> Iterator[bytes]:
    """``value`` as pydantic's JSON, long lists in pieces of ``PIECE_ITEMS`` (each a call of its own)."""
    if isinstance(value, dict):
        yield b"{"
        for i, (key, item) in enumerate(value.items()):
            yield (b"," if i else b"") + to_json(key) + b":"
            yield from _json_pieces(item)
        yield b"}"
    elif isinstance(value, list) and len(value) > PIECE_ITEMS:
        yield b"["
        for i in range(0, len(value), PIECE_ITEMS):
            yield (b"," if i else b"") + to_json(value[i:i + PIECE_ITEMS])[1:-1]
        yield b"]"
    else:
        yield to_json(value)


def encode_in_pieces(answer: ChatCompletion | Completion) -> bytes:
    """``answer.model_dump_json()`` for a whole answer whose choices carry many logprobs, made in
    pieces between which another thread gets the GIL: one pydantic call holds it to its end, so a
    35 MB answer built "off the event loop" still stalled it 0.3 s (found by QA). The answer
    without its logprobs is dumped by pydantic; each choice's logprobs, plain dicts and lists, go
    in where its ``"logprobs":null`` is (a key: inside a string its quotes would be escaped)."""
    bare = answer.model_copy(update={"choices": [c.model_copy(update={"logprobs": None}) for c in answer.choices]})
    parts = bare.model_dump_json().encode().split(b'"logprobs":null')
    if len(parts) != len(answer.choices) + 1:  # (cannot be: one such key per choice) the plain way
        return answer.model_dump_json().encode()
    out = [parts[0]]
    for choice, rest in zip(answer.choices, parts[1:], strict=True):
        out.append(b'"logprobs":')
        out.extend(_json_pieces(choice.logprobs))
        out.append(rest)
    return b"".join(out)


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
    token_names: TokenNames | None = None  # set: the request asked for logprobs
    prompt_logprobs: tuple[int, TokenNames] | None = None  # vLLM's prompt_logprobs asked: (k, the names)
    id: str = field(default_factory=lambda: "chatcmpl-" + new_hex_id())
    created: int = field(default_factory=lambda: int(time.time()))

    def _chunk(self, choices: list[ChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=choices,
                                   usage=usage)

    def opening(self, n: int) -> list[BaseModel]:
        return [self._chunk([ChunkChoice(index=i, delta=ChunkDelta(role="assistant", content=""))])
                for i in range(n)]

    def text_chunk(self, index: int, text: str, logprobs: list[Entry] | None = None) -> BaseModel:
        shown = None if logprobs is None or self.token_names is None else chat_logprobs(logprobs, self.token_names)
        return self._chunk([ChunkChoice(index=index, delta=ChunkDelta(content=text), logprobs=shown)])

    def finish_chunk(self, index: int, finish_reason: str) -> BaseModel:
        return self._chunk([ChunkChoice(index=index, delta=ChunkDelta(), finish_reason=finish_reason)])

    def usage_chunk(self, usage: Usage) -> BaseModel:
        return self._chunk([], usage)

    def response(self, texts: list[str], finish_reasons: list[str | None], usage: Usage,
                 logprobs: list[list[Entry]] | None = None) -> ChatCompletion:
        shown: list[dict | None] = [None] * len(texts)
        if logprobs is not None and self.token_names is not None:
            shown = [chat_logprobs(entries, self.token_names) for entries in logprobs]
        return ChatCompletion(
            id=self.id, created=self.created, model=self.model, usage=usage,
            choices=[ChatChoice(index=i, message=ChatResponseMessage(content=t), finish_reason=f, logprobs=lp)
                     for i, (t, f, lp) in enumerate(zip(texts, finish_reasons, shown, strict=True))],
        )


@dataclass(slots=True)
class CompletionFormat:
    model: str
    include_usage: bool = False
    echo: tuple[str, ...] = ()  # echo=True: per choice, its prompt's text, shown before the choice's text
    token_names: TokenNames | None = None  # set: the request asked for logprobs
    # echo with logprobs: the echoed prompt's tokens come first in each choice's logprobs (their
    # text offsets from 0); a stream's echo chunk waits for them (``echo_chunk``), none opens it
    scored: bool = False
    echo_top: int = 0  # scored: the alternatives each echoed token shows (the request's ``logprobs``)
    prompt_logprobs: tuple[int, TokenNames] | None = None  # vLLM's prompt_logprobs asked: (k, the names)
    id: str = field(default_factory=lambda: "cmpl-" + new_hex_id())
    created: int = field(default_factory=lambda: int(time.time()))
    offsets: dict[int, TextOffsets] = field(default_factory=dict)  # a streamed choice's, so far

    def _chunk(self, choices: list[CompletionChoice], usage: Usage | None = None) -> Completion:
        return Completion(id=self.id, created=self.created, model=self.model, choices=choices, usage=usage)

    def opening(self, n: int) -> list[BaseModel]:
        if self.scored:
            return []
        return [self._chunk([CompletionChoice(index=i, text=text, finish_reason=None)])
                for i, text in enumerate(self.echo) if text]

    def echo_chunk(self, index: int, entries: list[Entry]) -> BaseModel:
        """A scored stream's echo of choice ``index``: its prompt's text and the prompt tokens'
        logprobs, once the engine has computed them (before the choice's first text)."""
        offsets = self.offsets[index] = TextOffsets(0)
        shown = completion_logprobs(entries, self.token_names, offsets) if self.token_names is not None else None
        return self._chunk([CompletionChoice(index=index, text=self.echo[index], finish_reason=None, logprobs=shown)])

    def _echoed(self, index: int) -> str:
        return self.echo[index] if self.echo else ""

    def _offset_start(self, index: int) -> int:
        return 0 if self.scored else len(self._echoed(index))  # scored: the prompt's tokens come first

    def text_chunk(self, index: int, text: str, logprobs: list[Entry] | None = None) -> BaseModel:
        shown = None
        if logprobs is not None and self.token_names is not None:
            offsets = self.offsets.get(index)
            if offsets is None:
                offsets = self.offsets[index] = TextOffsets(self._offset_start(index))
            shown = completion_logprobs(logprobs, self.token_names, offsets)
        return self._chunk([CompletionChoice(index=index, text=text, finish_reason=None, logprobs=shown)])

    def finish_chunk(self, index: int, finish_reason: str) -> BaseModel:
        return self._chunk([CompletionChoice(index=index, text="", finish_reason=finish_reason)])

    def usage_chunk(self, usage: Usage) -> BaseModel:
        return self._chunk([], usage)

    def response(self, texts: list[str], finish_reasons: list[str | None], usage: Usage,
                 logprobs: list[list[Entry]] | None = None) -> Completion:
        shown: list[dict | None] = [None] * len(texts)
        if logprobs is not None and self.token_names is not None:
            shown = [completion_logprobs(entries, self.token_names, TextOffsets(self._offset_start(i)))
                     for i, entries in enumerate(logprobs)]
        return self._chunk([CompletionChoice(index=i, text=self._echoed(i) + t, finish_reason=f, logprobs=lp)
                            for i, (t, f, lp) in enumerate(zip(texts, finish_reasons, shown, strict=True))], usage)
