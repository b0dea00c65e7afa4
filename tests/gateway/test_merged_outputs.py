"""``gateway.generation.merged_outputs``: several engine streams as one, with fake engine streams:
choices renumbered, sums, a refusal before any output, an error that ends the whole after what
came with it, and every stream stopped when the consumer leaves."""

from __future__ import annotations

import asyncio

import pytest

from engine.outputs import CompletionDelta, EngineOverloadedError, RequestOutput
from gateway.errors import ApiError
from gateway.generation import Generation, merged_outputs


class FakeStream:
    """An engine stream: yields its outputs (one per ``gap`` s), or raises ``error`` at a step."""

    def __init__(self, outputs: list[RequestOutput], *, error: BaseException | None = None, error_at: int = 0,
                 gap: float = 0.0) -> None:
        self.outputs, self.error, self.error_at, self.gap = outputs, error, error_at, gap
        self.stopped = False  # left before its end (the engine request would be aborted)
        self.ended = False

    def __aiter__(self):  # noqa: ANN204
        return self._run()

    async def _run(self):  # noqa: ANN202
        try:
            for i, out in enumerate(self.outputs):
                if self.error is not None and i == self.error_at:
                    raise self.error
                await asyncio.sleep(self.gap)
                yield out
            if self.error is not None and self.error_at >= len(self.outputs):
                raise self.error
            self.ended = True
        finally:
            self.stopped = not self.ended


def out(rid: str, tokens: list[list[int]], prompt: int, *, finished: bool = False, cached: int = 0) -> RequestOutput:
    deltas = [CompletionDelta(index=j, text="x" * len(t), token_ids=t, num_tokens=len(t),
                              finish_reason="length" if finished else None) for j, t in enumerate(tokens)]
    return RequestOutput(rid, deltas, prompt, cached, finished)


def streams_of(*fakes: FakeStream) -> list:
    return [aiter(f) for f in fakes]


async def collect(agen) -> list[RequestOutput]:  # noqa: ANN001
    return [o async for o in agen]


async def test_choices_are_renumbered_and_tokens_summed() -> None:
    a = FakeStream([out("a", [[1], [2]], 5, cached=4), out("a", [[3], [4]], 5, finished=True, cached=4)])
    b = FakeStream([out("b", [[7], [8]], 3), out("b", [[9], [9]], 3, finished=True)], gap=0.01)
    outs = await collect(merged_outputs(streams_of(a, b), 2, "r"))
    assert outs[-1].finished and not any(o.finished for o in outs[:-1])
    by_choice: dict[int, list[int]] = {}
    for o in outs:
        for d in o.deltas:
            by_choice.setdefault(d.index, []).extend(d.token_ids)
    assert by_choice == {0: [1, 3], 1: [2, 4], 2: [7, 9], 3: [8, 9]}
    assert (outs[-1].prompt_tokens, outs[-1].cached_prompt_tokens) == (8, 4)
    assert outs[0].prompt_tokens == 5  # a prompt not yet computed counts nothing (billed if the client left)


async def test_a_refusal_of_any_comes_before_the_first_output_and_stops_the_others() -> None:
    a = FakeStream([out("a", [[1]], 4), out("a", [[2]], 4, finished=True)])
    b = FakeStream([out("b", [[1]], 4)], error=EngineOverloadedError("full"), error_at=0)
    gen = Generation(merged_outputs(streams_of(a, b), 1, "r"), n=2, prompt_tokens=8, started=0.0)
    with pytest.raises(ApiError) as err:
        await gen.start()
    assert err.value.status == 503
    await gen.aclose()
    assert a.stopped and not a.ended


async def test_an_error_after_others_finished_ends_the_whole_after_what_came_with_it() -> None:
    a = FakeStream([out("a", [[1]], 2, finished=True)])
    b = FakeStream([out("b", [[5]], 2), out("b", [[6]], 2)], error=RuntimeError("boom"), error_at=2, gap=0.01)
    seen: list[int] = []
    with pytest.raises(RuntimeError, match="boom"):
        async for o in merged_outputs(streams_of(a, b), 1, "r"):
            seen += [t for d in o.deltas for t in d.token_ids]
    assert sorted(seen) == [1, 5, 6]  # every token that arrived was handed on (and so billed)


async def test_leaving_early_stops_every_stream() -> None:
    slow = [FakeStream([out(s, [[i]], 1) for i in range(100)], gap=0.01) for s in "abc"]
    agen = merged_outputs(streams_of(*slow), 1, "r")
    first = await anext(agen)
    assert first.deltas
    await agen.aclose()
    assert all(f.stopped for f in slow)
    task = asyncio.ensure_future(collect(merged_outputs(streams_of(*[FakeStream([out("d", [[1]], 1)] * 100,
                                                                                  gap=0.01)]), 1, "r")))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_a_usage_row_keeps_length_when_any_choice_was_cut() -> None:
    """One rule for the engine's answers and the cache's replays (found by QA: a replay kept the
    first choice's reason, the engine's path ``length`` if any choice had it)."""
    from gateway.generation import row_finish_reason

    assert row_finish_reason(["stop", "length"]) == "length"
    assert row_finish_reason(["length", "stop"]) == "length"
    assert row_finish_reason(["stop", "stop"]) == "stop"
    assert row_finish_reason([None]) is None and row_finish_reason([]) is None
