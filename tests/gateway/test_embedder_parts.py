"""``gateway.embedder.Embedder.embed`` works in parts of ``batch_size`` texts, longest first (like
lengths pad least), each row back in its place; a closed embedder stops before its next part (the
process's exit waits for its thread)."""

from __future__ import annotations

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
