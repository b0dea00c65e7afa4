"""A changed embedding model on the same Redis (``PAGEGATE_EMBEDDING_MODEL``): each model's vectors
live in a semantic namespace of their own, and an entry whose vector another model made, or a
vector of the wrong size however written, is left out of the index instead of failing every
lookup of its tenant (found by QA: one such entry turned a tenant's semantic tier off for good)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
from cache_testlib import answer, chat

from cache.embedder import Embedder, resolve_model_path
from gateway.cache_glue import cache_lookup

FRANCE = "What is the capital of France?"
FRANCE_AGAIN = "What's the capital city of France?"
ITALY = "What is the capital of Italy?"
ITALY_AGAIN = "What's the capital city of Italy?"


class WiderModel:
    """Another embedding model, as the cache sees one: other vectors (the real ones twice over,
    768 wide), its own space. The model underneath is the real one."""

    space = "w768"

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner

    @property
    def dim(self) -> int:
        return 2 * self.inner.dim

    async def embed(self, text: str) -> np.ndarray:
        v = await self.inner.embed(text)
        return (np.concatenate([v, v]) / np.sqrt(2)).astype(np.float32)

    async def embed_many(self, texts: list[str]) -> np.ndarray:
        return np.stack([await self.embed(t) for t in texts])

    def __getattr__(self, name: str):  # ready, fits, sees, vocab, close: the real model's
        return getattr(self.inner, name)


def test_the_bundled_model_keeps_the_namespace_entries_were_stored_in():
    assert Embedder().space == ""
    assert Embedder(resolve_model_path("all-MiniLM-L6-v2")).space == ""


def test_a_models_space_follows_its_files_not_its_path(tmp_path):
    """A re-check QA: the first version hashed the directory's path, so one model in two places (two
    hosts, two containers) split its entries, and a model changed in place kept its space."""
    bundled = Path(resolve_model_path("all-MiniLM-L6-v2"))
    copy = tmp_path / "minilm-elsewhere"
    shutil.copytree(bundled, copy, symlinks=False,
                    ignore=lambda _d, names: [n for n in names if n.endswith(".safetensors")])
    (copy / "model.safetensors").symlink_to(bundled / "model.safetensors")  # (90 MB: not copied)
    assert Embedder(str(copy)).space == ""  # the same files elsewhere: the bundled model's space
    pooling = copy / "1_Pooling" / "config.json"
    config = json.loads(pooling.read_text())
    pooling.write_text(json.dumps({**config, "pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True}))
    changed = Embedder(str(copy))
    try:
        assert changed.space != "" and len(changed.space) == 8  # the same path, changed in place: its own
    finally:
        changed.close()


async def test_two_models_on_one_redis_keep_their_vectors_apart(make_cache, policy, embedder):
    old = make_cache()
    await old.store("acme", chat(FRANCE), answer("Paris"), policy)
    assert (await old.lookup("acme", chat(FRANCE_AGAIN), policy)).outcome == "semantic-hit"

    new = make_cache(embedder=WiderModel(embedder))  # the gateway restarted on another model
    got = await new.lookup("acme", chat(FRANCE_AGAIN), policy)
    assert (got.outcome, got.reason) == ("miss", "below-threshold")  # not a bypass: the tier works
    assert (await new.lookup("acme", chat(FRANCE), policy)).outcome == "hit"  # exact: any model's
    await new.store("acme", chat(ITALY), answer("Rome"), policy)
    got = await new.lookup("acme", chat(ITALY_AGAIN), policy)
    assert got.outcome == "semantic-hit" and got.response["choices"][0]["message"]["content"] == "Rome"
    assert new._local.foreign_vectors == 1  # France's 384-wide vector, left out of the load

    # the old model's process reads the new one's store from the change log and leaves it out
    assert (await old.lookup("acme", chat(ITALY_AGAIN), policy)).outcome == "miss"
    assert (await old.lookup("acme", chat(FRANCE_AGAIN), policy)).outcome == "semantic-hit"
    assert old._local.foreign_vectors == 1


async def test_a_vector_of_the_wrong_size_is_left_out_of_a_load(make_cache, policy, redis_client):
    first = make_cache()
    await first.store("acme", chat(FRANCE), answer("Paris"), policy)
    await first.store("acme", chat(ITALY), answer("Rome"), policy)
    keys = first.store_.keys("acme")
    [entry] = [k async for k in redis_client.scan_iter(match=keys.base + "e:*")
               if (await redis_client.hget(k, "text")) == ITALY.encode()]
    await redis_client.hset(entry, "vec", b"abcde")  # not a whole number of floats

    await first.store("acme", chat("How deep is Lake Baikal?"), answer("1,642 m"), policy)
    [textless] = [k async for k in redis_client.scan_iter(match=keys.base + "e:*")
                  if (await redis_client.hget(k, "text")) == b"How deep is Lake Baikal?"]
    await redis_client.hdel(textless, "text")  # nothing for the verifier to read (a re-check QA)

    later = make_cache()  # a process that loads the tenant now
    assert (await later.lookup("acme", chat(FRANCE_AGAIN), policy)).outcome == "semantic-hit"
    assert (await later.lookup("acme", chat(ITALY), policy)).outcome == "hit"
    await later.store("acme", chat("How tall is the Eiffel Tower?"), answer("330 m"), policy)
    assert (await later.lookup("acme", chat("What is the height of the Eiffel Tower?"),
                               policy)).outcome == "semantic-hit"
    assert later._local.foreign_vectors == 1
    got = await later.lookup("acme", chat("What is the depth of Lake Baikal?"), policy)
    assert got.outcome == "miss"  # not a bypass: the entry is left out
    await later.store("acme", chat("What is the depth of Lake Baikal?"), answer("1,642 m"), policy)
    assert (await later.lookup("acme", chat("What is the depth of Lake Baikal?"), policy)).outcome == "hit"


class Broken:
    async def lookup(self, namespace, body, policy):
        raise ValueError("an index that cannot load")


async def test_a_lookup_that_fails_every_time_logs_once_per_ten_seconds(policy, caplog):
    with caplog.at_level(logging.ERROR, logger="pagegate.cache"):
        for _ in range(5):
            got = await cache_lookup(Broken(), "acme", chat(FRANCE), policy)
            assert (got.outcome, got.reason) == ("bypass", "cache-error")
    lines = [r for r in caplog.records if "cache lookup failed" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is not None
