"""``gateway.embedder.Embedder.embed`` works in parts of ``batch_size`` texts, longest first (like
lengths pad least), each row back in its place; a closed embedder stops before its next part (the
process's exit waits for its thread)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest


@pytest.fixture(scope="module")
def embedder():
    from gateway.embedder import Embedder

    e = Embedder(batch_size=2)
    yield e
    e.close()


def test_parts_keep_each_row_in_place(embedder) -> None:  # noqa: ANN001
    texts = ["a", "a much longer sentence about volcanoes and their eruptions", "mid length text", "x y",
             "the quick brown fox jumps"]
    alone = np.stack([embedder.embed([t])[0] for t in texts])
    np.testing.assert_allclose(embedder.embed(texts), alone, atol=1e-5)


def test_a_closed_embedder_stops_before_its_next_part() -> None:
    from gateway.embedder import Embedder

    e = Embedder(batch_size=2)
    e.close()
    with pytest.raises(RuntimeError, match="closed"):
        e.embed(["one", "two", "three"])


def test_counting_parts_keep_the_order_and_stop_at_the_first_text_too_long(embedder, monkeypatch) -> None:  # noqa: ANN001
    """Found by QA: a 5 MB batch refused for its first input was tokenized whole (2.6 s)."""
    from gateway import embedder as module

    monkeypatch.setattr(module, "COUNT_PART_CHARS", 40)
    texts = ["one two three", "word " * 300, "four five", "six"] + ["seven eight nine ten"] * 50
    whole = embedder.count_tokens(texts)
    assert whole[1] == 302
    assert asyncio.run(embedder.acount_tokens(texts)) == whole  # in parts, each in its place
    early = asyncio.run(embedder.acount_tokens(texts, stop_over=256))
    assert early[:2] == whole[:2] and len(early) < 6  # the part holding input 1, not the 54 texts
    assert asyncio.run(embedder.acount_tokens(texts[2:], stop_over=256)) == whole[2:]


def test_a_text_too_long_logs_no_tokenizer_warning(embedder) -> None:  # noqa: ANN001
    """transformers warns "Token indices sequence length is longer than the specified maximum"; the
    service refuses such an input with a 400, so the warning would only fill the log. Only that
    warning is off: transformers' logger keeps its level."""
    import logging

    class Records(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.messages: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.messages.append(record.getMessage())

    logger = logging.getLogger("transformers")  # (it does not propagate to the root: caplog misses it)
    records, level = Records(), logger.level
    logger.addHandler(records)
    embedder.model.tokenizer.deprecation_warnings.clear()  # it warns once per tokenizer
    try:
        assert embedder.count_tokens(["w " * 400]) == [402]
        assert asyncio.run(embedder.acount_tokens(["w " * 400], stop_over=256)) == [402]
    finally:
        logger.removeHandler(records)
    assert not [m for m in records.messages if "sequence length" in m]
    assert logger.level == level


def test_one_huge_text_is_refused_by_its_head(embedder, monkeypatch) -> None:  # noqa: ANN001
    """Found by review: a single 5 MB input was tokenized whole (3.4 s on the embedder's thread,
    which the cache shares). Its head, cut at a space, already holds more than the limit: the
    count is a lower bound (``AtLeast``) and the whole text is never tokenized."""
    from gateway import embedder as module

    monkeypatch.setattr(module, "COUNT_PART_CHARS", 40)
    seen: list[list[str]] = []
    count = embedder.count_tokens

    def spy(texts):  # noqa: ANN001, ANN202
        seen.append(list(texts))
        return count(texts)

    monkeypatch.setattr(embedder, "count_tokens", spy)
    huge = "word " * 300
    (n,) = asyncio.run(embedder.acount_tokens([huge], stop_over=5))
    assert isinstance(n, module.AtLeast) and 5 < n < 302
    assert all(len(t) <= 40 for part in seen for t in part)  # only the head was tokenized
    seen.clear()  # a head within the limit, or no space to cut at: the whole text, exactly
    assert asyncio.run(embedder.acount_tokens([huge], stop_over=256)) == [302]
    assert asyncio.run(embedder.acount_tokens(["x" * 50], stop_over=1)) == count(["x" * 50])
    assert not isinstance(asyncio.run(embedder.acount_tokens([huge], stop_over=256))[0], module.AtLeast)


def test_tenants_take_turns_a_part_each(embedder, monkeypatch) -> None:  # noqa: ANN001
    """Without the cache the embeddings of one tenant arriving together are merged into one batch,
    which runs in parts in its tenant's turns: another tenant's text waits for the part running and
    at most one more (it waited for the whole merged batch)."""
    seen: list[str] = []
    original = embedder.embed

    def spy(texts):  # noqa: ANN001, ANN202
        seen.append(texts[0].split()[0])
        return original(texts)

    monkeypatch.setattr(embedder, "embed", spy)

    async def main() -> tuple[list[np.ndarray], np.ndarray]:
        heavy = [asyncio.ensure_future(embedder.aembed([f"heavy{j} text number {i}" for i in range(6)], share=1))
                 for j in range(3)]
        await asyncio.sleep(0)
        light = asyncio.ensure_future(embedder.aembed(["light text"], share=2))
        return await asyncio.gather(*heavy), await light

    heavy, light = asyncio.run(main())
    assert seen.count("light") == 1 and seen.index("light") <= 2
    assert len(seen) == 9 + 1  # the three calls merged into one batch of 18 texts, in parts of 2 (batch_size)
    np.testing.assert_allclose(light[0], original(["light text"])[0], atol=1e-5)
    np.testing.assert_allclose(heavy[2][5], original(["heavy2 text number 5"])[0], atol=1e-5)


def test_a_loop_that_ended_with_a_call_queued_leaves_its_tenant_served(embedder) -> None:  # noqa: ANN001
    """Found by review: a call made and left as its event loop ended (a test's, a stopped server's)
    kept its tenant's batching task marked as running, and the tenant's later calls waited forever."""

    async def leave() -> None:
        asyncio.ensure_future(embedder.aembed(["left behind"], share="gone"))

    asyncio.run(leave())

    async def later() -> np.ndarray:
        return await asyncio.wait_for(embedder.aembed(["served after all"], share="gone"), 60)

    assert asyncio.run(later()).shape == (1, embedder.dimensions)
