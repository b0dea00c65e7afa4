from engine.block_pool import BlockPool, hash_block_tokens


def test_allocate_and_free_ref_counts():
    pool = BlockPool(4)
    a, b = pool.allocate(2)
    assert (a.ref_cnt, b.ref_cnt) == (1, 1)
    assert pool.num_free == 2
    pool.touch([a])
    assert a.ref_cnt == 2
    pool.free([a])
    assert a.ref_cnt == 1 and pool.num_free == 2
    pool.free([b, a])
    assert pool.num_free == 4 and pool.num_used == 0


def test_allocate_more_than_free_raises():
    pool = BlockPool(2)
    pool.allocate(2)
    try:
        pool.allocate(1)
    except ValueError:
        pass
    else:
        raise AssertionError("expected ValueError")


def test_hash_chain_depends_on_parent_tokens_and_salt():
    h1 = hash_block_tokens(None, [1, 2, 3], None)
    assert h1 == hash_block_tokens(None, [1, 2, 3], None)
    assert h1 != hash_block_tokens(None, [1, 2, 4], None)
    assert h1 != hash_block_tokens(None, [1, 2, 3], "tenant-a")
    assert hash_block_tokens(None, [1, 2, 3], "a") != hash_block_tokens(None, [1, 2, 3], "b")
    h2 = hash_block_tokens(h1, [4, 5, 6], None)
    other_parent = hash_block_tokens(None, [9, 9, 9], None)
    assert h2 != hash_block_tokens(other_parent, [4, 5, 6], None)


def test_freed_block_keeps_hash_until_reallocated_lru_order():
    pool = BlockPool(3)
    blocks = pool.allocate(3)
    hashes = [hash_block_tokens(None, [i], None) for i in range(3)]
    for b, h in zip(blocks, hashes, strict=True):
        pool.cache_block(b, h)
    pool.free(blocks[::-1])  # tail first: block 2 is least recently freed
    assert all(pool.lookup(h) is b for b, h in zip(blocks, hashes, strict=True))
    (new,) = pool.allocate(1)
    assert new is blocks[2]  # the tail is evicted first
    assert pool.lookup(hashes[2]) is None and new.block_hash is None
    assert pool.lookup(hashes[0]) is blocks[0]
    # reviving a cached free block takes it out of the free queue
    pool.touch([blocks[0]])
    assert blocks[0].ref_cnt == 1 and pool.num_free == 1
    (last,) = pool.allocate(1)
    assert last is blocks[1]


def test_duplicate_content_keeps_first_block():
    pool = BlockPool(2)
    a, b = pool.allocate(2)
    h = hash_block_tokens(None, [7], None)
    pool.cache_block(a, h)
    pool.cache_block(b, h)
    assert pool.lookup(h) is a and b.block_hash is None


def test_caching_disabled_never_hits():
    pool = BlockPool(2, enable_caching=False)
    (a,) = pool.allocate(1)
    h = hash_block_tokens(None, [1], None)
    pool.cache_block(a, h)
    assert pool.lookup(h) is None


def test_double_free_is_an_error():
    pool = BlockPool(1)
    (a,) = pool.allocate(1)
    pool.free([a])
    try:
        pool.free([a])
    except RuntimeError:
        pass
    else:
        raise AssertionError("expected RuntimeError")
