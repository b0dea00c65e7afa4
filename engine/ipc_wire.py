"""The engine socket's wire (``engine.ipc``): frames of a 4-byte big-endian length and a pickled list
of messages (tuples), at most one frame per event-loop turn each way; requests' parameters and
outputs as tuples of their fields; unpickling admits builtins and the engine's figures
(``EngineStats``) only; the engine's errors encoded as tuples and decoded into the same classes."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import logging
import operator
import pickle
import struct
from typing import Any

from engine.outputs import (
    CompletionDelta,
    EngineClassFullError,
    EngineDeadError,
    EngineError,
    EngineOverloadedError,
    EngineStats,
    EngineStoppingError,
    PromptTooLongError,
)
from engine.sampling_params import SamplingParams

log = logging.getLogger("engine.ipc")

HEADER = struct.Struct(">I")
MAX_FRAME = 256 * 1024 * 1024  # a longer length is a broken or hostile peer: the connection is dropped

# The wire carries builtins (tuples, lists, str, int, float, None) and the engine's figures; a
# request's sampling parameters and its outputs go as tuples of their fields (unpickling a slots
# dataclass runs Python code per object: 4-6x the cost of its tuple, on every step's outputs).
_ALLOWED = {("engine.outputs", "EngineStats"): EngineStats}
_PARAMS = tuple(f.name for f in dataclasses.fields(SamplingParams) if f.init)  # (not the grammar)
params_fields = operator.attrgetter(*_PARAMS)


def deltas_fields(deltas: list[CompletionDelta]) -> list[tuple]:
    return [(d.index, d.text, d.token_ids, d.finish_reason, d.num_tokens, d.logprobs) for d in deltas]


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        cls = _ALLOWED.get((module, name))
        if cls is None:
            raise pickle.UnpicklingError(f"engine ipc: {module}.{name} is not allowed on the wire")
        return cls


def loads(data: bytes) -> Any:
    return _Unpickler(io.BytesIO(data)).load()


def frame(messages: list) -> bytes:
    body = pickle.dumps(messages, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(body)) + body


class Framed(asyncio.Protocol):
    """Frames in, frames out; outgoing messages of one event-loop turn go in one frame."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._outbox: list = []
        self._flush_scheduled = False
        self._loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, message: tuple) -> None:
        self._outbox.append(message)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        box, self._outbox = self._outbox, []
        if box and self.transport is not None and not self.transport.is_closing():
            self.transport.write(frame(box))

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos = 0
        while len(buf) - pos >= 4:
            (size,) = HEADER.unpack_from(buf, pos)
            if size > MAX_FRAME:
                log.error("engine ipc: a frame of %d bytes; dropping the connection", size)
                self.transport.close()
                return
            if len(buf) - pos - 4 < size:
                break
            try:
                messages = loads(bytes(buf[pos + 4:pos + 4 + size]))
            except Exception:  # noqa: BLE001 - a broken peer: drop it, never the process
                log.exception("engine ipc: an unreadable frame; dropping the connection")
                self.transport.close()
                return
            pos += 4 + size
            for message in messages:
                self.received(message)
        if pos:
            del buf[:pos]

    def received(self, message: tuple) -> None:
        raise NotImplementedError


# ---- errors on the wire -----------------------------------------------------------------------

def encode_error(exc: BaseException) -> tuple:
    if isinstance(exc, PromptTooLongError):
        return ("too_long", exc.prompt_tokens, exc.max_model_len)
    if isinstance(exc, EngineClassFullError):
        return ("class_full", str(exc))
    if isinstance(exc, EngineOverloadedError):
        return ("overloaded", str(exc))
    if isinstance(exc, EngineDeadError):
        return ("dead", str(exc))
    if isinstance(exc, EngineStoppingError):
        return ("stopping", str(exc))
    if isinstance(exc, ValueError):
        return ("value", str(exc))
    return ("engine", f"{type(exc).__name__}: {exc}")


def decode_error(code: tuple) -> BaseException:
    kind = code[0]
    if kind == "too_long":
        return PromptTooLongError(code[1], code[2])
    if kind == "class_full":
        return EngineClassFullError(code[1])
    if kind == "overloaded":
        return EngineOverloadedError(code[1])
    if kind == "dead":
        return EngineDeadError(code[1])
    if kind == "stopping":
        return EngineStoppingError(code[1])
    if kind == "value":
        return ValueError(code[1])
    return EngineError(code[1])
