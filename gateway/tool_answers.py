"""A chat answer decoded as tool calls (``gateway.tool_calls``), shown as OpenAI shows them: whole,
``message.tool_calls`` with ``content: null``; streamed, each call's id and name first (with what
of its arguments came in the same delta), then its arguments in pieces as they are written.
``CallScanner`` reads the calls out of the answer's text as it comes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from pydantic import BaseModel

from gateway.formats import ChatFormat
from gateway.ids import new_hex_id
from gateway.schemas import ChatChoice, ChatCompletion, ChatResponseMessage, ChunkChoice, ChunkDelta, Usage

_BLANKS = frozenset(" \t\r\n")  # JSON's whitespace


class CallScanner:
    """Reads an answer's calls as its text comes, byte by byte of JSON: for "required",
    ``{"tool_calls": [{"name": "...", "arguments": ...}, ...]}`` (keys in that order: the grammar
    writes them so); for "named", the text is the arguments. ``feed`` returns what is new:
    ``("call", index, name)`` once a call's name is whole, ``("args", index, text)`` as its
    arguments come, without the blanks between their tokens (the grammar lets the model write
    up to 32 in a row: found by QA, ``'{\n \n   \n \n}'``)."""

    __slots__ = ("arguments", "complete", "depth", "_escape", "_in_string", "_key", "_is_key", "_string",
                 "_capture", "names", "_named")

    def __init__(self, named: str | None = None) -> None:
        self.names: list[str] = []
        self.arguments: list[str] = []
        self.complete = False  # the whole JSON was read
        self.depth = 0
        self._named = named
        self._escape = self._in_string = self._is_key = False
        self._string: list[str] | None = None  # a string at a call's level, being read
        self._key: str | None = None  # the last key read at a call's level
        self._capture: int | None = None  # the depth the arguments' value ends at (reading them)

    def feed(self, text: str) -> list[tuple]:
        if self._named is not None:
            return self._feed_named(text)
        events: list[tuple] = []
        for ch in text:
            self._read(ch, events)
        return events

    def _feed_named(self, text: str) -> list[tuple]:
        events: list[tuple] = []
        piece = []
        for ch in text:
            if self._in_string:
                piece.append(ch)
                self._string_char(ch)
            elif ch not in _BLANKS:
                self._in_string = ch == '"'
                piece.append(ch)
        if not piece:
            return events
        if not self.names:
            self.names.append(self._named)
            self.arguments.append("")
            events.append(("call", 0, self._named))
        self.arguments[0] += "".join(piece)
        events.append(("args", 0, "".join(piece)))
        return events

    def _read(self, ch: str, events: list[tuple]) -> None:  # noqa: C901, PLR0912 - one character's cases
        if self._capture is not None:
            self._argument(ch, events)
            return
        if self._in_string:
            if self._string is not None:
                self._string.append(ch)
            if self._string_char(ch):
                self._string_done(events)
            return
        if ch == '"':
            self._in_string = True
            self._string = ['"'] if self.depth == 3 else None
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1
            if self.depth == 0:
                self.complete = True
        elif ch == ":" and self.depth == 3 and self._key == "arguments" and len(self.arguments) < len(self.names):
            self._capture = 3
            self.arguments.append("")
        elif ch == "," and self.depth == 3:
            self._is_key = True
        if ch == "{" and self.depth == 3:
            self._is_key = True
        elif ch == ":" and self.depth == 3:
            self._is_key = False

    def _string_char(self, ch: str) -> bool:
        """A character inside a string; True when it is the closing quote."""
        if self._escape:
            self._escape = False
        elif ch == "\\":
            self._escape = True
        elif ch == '"':
            self._in_string = False
            return True
        return False

    def _string_done(self, events: list[tuple]) -> None:
        if self._string is None:
            return
        try:
            text = json.loads("".join(self._string))
        except ValueError:  # (the grammar writes JSON strings: only text it never held gets here)
            text = "".join(self._string)[1:-1]
        self._string = None
        if self._is_key:
            self._key = text
        elif self._key == "name":
            self.names.append(text)
            events.append(("call", len(self.names) - 1, text))

    def _argument(self, ch: str, events: list[tuple]) -> None:
        """A character of the arguments' value (or the one after it, at the call's level); the
        blanks between its tokens are left out, as OpenAI's arguments have none."""
        if self._in_string:
            self._string_char(ch)
        elif ch in _BLANKS:
            return
        elif ch == '"':
            self._in_string = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}],":
            if self.depth == self._capture:  # the value has ended: this character is the call's
                self._capture = None
                self._read(ch, events)
                return
            if ch != ",":
                self.depth -= 1
        self.arguments[-1] += ch
        index = len(self.arguments) - 1
        if events and events[-1][0] == "args" and events[-1][1] == index:
            events[-1] = ("args", index, events[-1][2] + ch)
        else:
            events.append(("args", index, ch))


def _call_deltas(events: list[tuple], ids: list[str]) -> list[dict]:
    """One delta's ``tool_calls``: a call's id and name with its arguments so far, then more of its
    arguments; one entry per call (found by review: a name and its first arguments were two
    entries of one index, which a client reading ``tool_calls[0]`` lost)."""
    out: list[dict] = []
    for kind, index, value in events:
        if kind == "call":
            out.append({"index": index, "id": ids[index], "type": "function",
                        "function": {"name": value, "arguments": ""}})
        elif out and out[-1]["index"] == index:
            out[-1]["function"]["arguments"] += value
        else:
            out.append({"index": index, "function": {"arguments": value}})
    return out


def _new_call_id() -> str:
    return "call_" + new_hex_id()[:24]


class ToolCallMessage(ChatResponseMessage):
    tool_calls: list[dict] | None = None


class ToolCallChoice(ChatChoice):
    message: ToolCallMessage


class ToolCallCompletion(ChatCompletion):
    choices: list[ToolCallChoice]


@dataclass(slots=True)
class _Choice:
    """One streamed choice: its calls' scanner and ids; under "auto", its text until it is told
    (``text`` None once it is calls, ``told`` once its first non-blank character came)."""

    scanner: CallScanner
    ids: list[str] = field(default_factory=list)
    text: str | None = ""
    told: bool = False


def _is_calls(text: str) -> bool:
    return text.lstrip(" \t\r\n")[:1] == "{"  # (the engine's rule: engine.json_decoding)


@dataclass(slots=True)
class ToolCallFormat(ChatFormat):
    """A chat answer shown as tool calls. ``choice``: "required", "named" or "auto" (the plan's;
    under "auto" an answer that does not begin with "{" is the model's text, shown as content);
    ``named``: the function a named choice calls."""

    choice: str = "required"
    named: str | None = None
    streamed: dict[int, _Choice] = field(default_factory=dict)

    def _choice(self, index: int) -> _Choice:
        found = self.streamed.get(index)
        if found is None:
            found = self.streamed[index] = _Choice(CallScanner(self.named), told=self.choice != "auto")
            if found.told:
                found.text = None
        return found

    def opening(self, n: int) -> list[BaseModel]:
        return [self._chunk([ChunkChoice(index=i, delta=ChunkDelta(role="assistant"))]) for i in range(n)]

    def text_chunk(self, index: int, text: str, logprobs: list | None = None) -> BaseModel | None:
        state = self._choice(index)
        if not state.told:  # (auto: blanks are held until the answer says text or calls)
            state.text += text
            if not state.text.strip(" \t\r\n"):
                return None
            state.told = True
            text, state.text = state.text, (None if _is_calls(state.text) else "")
        if state.text is not None:
            return self._chunk([ChunkChoice(index=index, delta=ChunkDelta(content=text))])
        events = state.scanner.feed(text)
        if not events:
            return None
        while len(state.ids) < len(state.scanner.names):
            state.ids.append(_new_call_id())
        return self._chunk([ChunkChoice(index=index, delta=ChunkDelta(tool_calls=_call_deltas(events, state.ids)))])

    def finish_chunk(self, index: int, finish_reason: str) -> BaseModel:
        state = self._choice(index)
        calls = state.scanner if state.text is None else None
        held = None if state.told else state.text  # (an answer of blanks alone, or none: still its text)
        return self._chunk([ChunkChoice(index=index, delta=ChunkDelta(content=held),
                                        finish_reason=self._reason(calls, finish_reason))])

    def _reason(self, calls: CallScanner | None, finish_reason: str | None) -> str | None:
        if finish_reason == "stop" and calls is not None and self.choice != "named" and calls.complete:
            return "tool_calls"  # (as OpenAI answers a call; a forced one's is "stop")
        return finish_reason

    def response(self, texts: list[str], finish_reasons: list[str | None], usage: Usage,
                 logprobs: list | None = None) -> ChatCompletion:
        choices = []
        for i, (text, reason) in enumerate(zip(texts, finish_reasons, strict=True)):
            if self.choice == "auto" and not _is_calls(text):  # the model answered in text
                choices.append(ToolCallChoice(index=i, message=ToolCallMessage(content=text), finish_reason=reason))
                continue
            scanner = CallScanner(self.named)
            scanner.feed(text)
            calls = [{"id": _new_call_id(), "type": "function", "function": {"name": name, "arguments": args}}
                     for name, args in zip(scanner.names, scanner.arguments + [""] * len(scanner.names), strict=False)]
            choices.append(ToolCallChoice(index=i, message=ToolCallMessage(content=None, tool_calls=calls or None),
                                          finish_reason=self._reason(scanner, reason)))
        return ToolCallCompletion(id=self.id, created=self.created, model=self.model, usage=usage, choices=choices)
