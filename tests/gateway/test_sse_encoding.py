"""``gateway.sse.encode_event``: one ``data:`` line per event, even for a client that splits lines
with Python's ``str.splitlines`` (httpx's ``iter_lines``), which cuts at U+2028 and U+2029; the
JSON reads back the same."""

from __future__ import annotations

import json

from gateway.formats import ChatFormat
from gateway.schemas import ChunkChoice, ChunkDelta
from gateway.sse import encode_event


def test_line_separators_are_escaped_and_read_back_the_same() -> None:
    text = "a\u2028b\u2029c é 🌍"
    chunk = ChatFormat(model="m")._chunk([ChunkChoice(index=0, delta=ChunkDelta(content=text))])  # noqa: SLF001
    for event in (chunk, {"error": {"message": text}}):
        line = encode_event(event).decode()
        assert line.endswith("\n\n") and len(line[:-2].splitlines()) == 1
        value = json.loads(line[len("data: "):])
        assert (value["choices"][0]["delta"]["content"] if "choices" in value else value["error"]["message"]) == text
    plain = encode_event({"x": "é"})
    assert plain == 'data: {"x":"é"}\n\n'.encode()  # (other characters stay as they are)
