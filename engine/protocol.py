"""The interface the gateway talks to. The in-process ``AsyncEngine`` fills it; a remote
OpenAI-compatible upstream (vLLM, SGLang) can fill it later."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from engine.outputs import EngineStats, RequestOutput
from engine.sampling_params import SamplingParams


class EngineClient(Protocol):
    model_id: str  # the id clients use in "model"
    max_model_len: int

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """Render chat messages with the model's chat template (generation prompt added) to ids."""

    def encode(self, text: str) -> list[int]: ...

    def token_bytes(self, ids: list[int]) -> list[bytes]:
        """What each token stands for on its own (for logprobs; a byte-level token may be part
        of a UTF-8 character)."""

    def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        *,
        request_id: str,
        salt: str | None = None,
        priority_class: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Yield deltas until the request finishes. Raises ``PromptTooLongError`` or
        ``EngineOverloadedError`` before the first yield. Closing the iterator early (e.g. the
        client disconnected) aborts the request and frees its blocks. An engine that offers
        ``announce()`` (``AsyncEngine``: a request on its way, see ``engine.arrivals``) also takes
        its notice here as ``notice=``; the gateway passes one only to such an engine."""

    async def abort(self, request_id: str) -> None: ...

    def interrupt_all(self, exc: BaseException) -> int:
        """End every open request's stream with ``exc`` and stop it in the engine; returns how many
        (``gateway.shutdown``: the server's graceful timeout is running out)."""

    def stats(self) -> EngineStats: ...

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...
