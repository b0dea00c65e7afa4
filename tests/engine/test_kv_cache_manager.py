from engine.kv_cache_manager import KVCacheManager
from engine.request import Request, RequestId, Sequence
from engine.sampling_params import SamplingParams

BS = 4


def make_seq(tokens, salt=None, rid="r"):
    return Request(RequestId(rid), list(tokens), SamplingParams(), salt=salt).sequences[0]


def admit(kv, seq):
    """Admit a sequence like the scheduler does and pretend the model ran its prompt."""
    hits = kv.get_computed_blocks(seq)
    assert kv.allocate_slots(seq, seq.num_tokens - len(hits) * BS, hits)
    seq.num_computed_tokens = seq.num_tokens
    kv.cache_full_blocks(seq, seq.num_tokens)
    return hits


def test_allocates_on_demand_and_frees_everything():
    kv = KVCacheManager(8, BS)
    seq = make_seq(range(6))
    admit(kv, seq)
    assert len(kv.tables[seq.seq_id]) == 2
    for tok in range(6, 12):  # decode 6 tokens: 12 tokens -> 3 blocks
        seq.token_ids.append(tok)
        assert kv.allocate_slots(seq, 1)
        seq.num_computed_tokens += 1
    assert len(kv.tables[seq.seq_id]) == 3
    kv.free(seq)
    assert kv.num_free_blocks == 8 and not kv.tables
    kv.free(seq)  # idempotent


def test_allocation_fails_without_side_effects():
    kv = KVCacheManager(2, BS)
    seq = make_seq(range(12))
    assert not kv.allocate_slots(seq, 12)
    assert kv.num_free_blocks == 2 and seq.seq_id not in kv.tables


def test_prefix_hits_share_blocks_and_leave_one_token():
    kv = KVCacheManager(16, BS)
    a = make_seq(range(10), rid="a")
    admit(kv, a)
    b = make_seq(list(range(8)) + [99, 98, 97], rid="b")
    hits = admit(kv, b)
    assert [h.block_id for h in hits] == kv.block_ids(a)[:2]
    assert all(h.ref_cnt == 2 for h in hits)
    # exactly-cached prompt: the last block is recomputed so there are logits to sample from
    c = make_seq(range(8), rid="c")
    assert len(kv.get_computed_blocks(c)) == 1


def test_salt_isolation():
    kv = KVCacheManager(16, BS)
    a = make_seq(range(9), salt="tenant-a", rid="a")
    admit(kv, a)
    assert len(kv.get_computed_blocks(make_seq(range(9), salt="tenant-b", rid="b"))) == 0
    assert len(kv.get_computed_blocks(make_seq(range(9), salt=None, rid="c"))) == 0
    assert len(kv.get_computed_blocks(make_seq(range(9), salt="tenant-a", rid="d"))) == 2


def test_freed_prefix_survives_until_memory_needed():
    kv = KVCacheManager(4, BS)
    a = make_seq(range(9), rid="a")
    admit(kv, a)
    kv.free(a)
    b = make_seq(range(9), rid="b")
    assert len(admit(kv, b)) == 2  # revived from the free queue
    kv.free(b)
    big = make_seq(range(100, 116), rid="big")  # needs all 4 blocks: evicts the cached ones
    admit(kv, big)
    assert len(kv.get_computed_blocks(make_seq(range(9), rid="c"))) == 0


def test_fork_copy_on_write_only_last_partial_block():
    kv = KVCacheManager(16, BS)
    parent = make_seq(range(6))  # blocks: [0..3] full, [4,5] partial
    admit(kv, parent)
    req = parent.request
    child = Sequence(req, 1, list(parent.token_ids), parent.num_prompt_tokens,
                     num_computed_tokens=parent.num_computed_tokens)
    kv.fork(parent, child)
    p_blocks = kv.tables[parent.seq_id]
    assert kv.tables[child.seq_id] == p_blocks and all(b.ref_cnt == 2 for b in p_blocks)
    used = kv.num_used_blocks
    child.token_ids.append(50)
    assert kv.allocate_slots(child, 1)
    copies = kv.take_pending_copies()
    c_blocks = kv.tables[child.seq_id]
    assert copies == [(p_blocks[1].block_id, c_blocks[1].block_id)]
    assert c_blocks[0] is p_blocks[0] and c_blocks[1] is not p_blocks[1]
    assert kv.num_used_blocks == used + 1
    # the parent is now the last owner of its partial block: it writes in place
    parent.token_ids.append(60)
    assert kv.allocate_slots(parent, 1)
    assert kv.take_pending_copies() == []
    kv.free(parent)
    kv.free(child)
    assert kv.num_free_blocks == 16


def test_utilization_and_usage():
    kv = KVCacheManager(10, BS)
    assert kv.utilization() == 1.0 and kv.usage == 0.0
    a = make_seq(range(6), rid="a")  # 2 blocks, 6 of 8 slots
    admit(kv, a)
    b = make_seq(range(50, 54), rid="b")  # 1 block, full
    admit(kv, b)
    assert kv.usage == 3 / 10
    assert kv.utilization() == 10 / 12
