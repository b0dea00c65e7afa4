import random

from engine.kv_cache_manager import KVCacheManager
from engine.request import Request, RequestId
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler

BS = 4


def make(num_blocks=64, budget=16, max_seqs=8):
    kv = KVCacheManager(num_blocks, BS)
    return kv, Scheduler(kv, max_num_batched_tokens=budget, max_num_seqs=max_seqs)


def add(sched, rid, n_prompt, max_tokens=4, cls=None, base=0):
    req = Request(RequestId(rid), [base + i for i in range(n_prompt)], SamplingParams(max_tokens=max_tokens),
                  priority_class=cls)
    sched.add(req.sequences[0])
    return req.sequences[0]


def step(sched, kv):
    """One scheduler round with a fake model: every sequence that reaches its end samples 1."""
    out = sched.schedule()
    for seq, n in zip(out.seqs, out.num_new_tokens, strict=True):
        seq.num_computed_tokens += n
        if seq.num_computed_tokens == seq.num_tokens:
            seq.token_ids.append(7)
            if seq.num_output_tokens >= seq.params.max_tokens:
                sched.finish(seq)
    return out


def test_token_budget_and_chunked_prefill():
    kv, sched = make(budget=16)
    a = add(sched, "a", 10)
    b = add(sched, "b", 10, base=100)
    out = step(sched, kv)
    assert out.seqs == [a, b] and out.num_new_tokens == [10, 6]
    assert a.num_output_tokens == 1 and b.num_output_tokens == 0  # b's prefill is a chunk
    out = step(sched, kv)
    # running first: a's decode, then the rest of b's prompt, all in one batch
    assert out.seqs == [a, b] and out.num_new_tokens == [1, 4]
    assert b.num_output_tokens == 1


def test_long_prompt_is_chunked_to_the_budget():
    kv, sched = make(budget=16)
    seq = add(sched, "long", 40)
    sizes = []
    while seq.num_output_tokens == 0:
        sizes.append(step(sched, kv).num_batched_tokens)
    assert sizes == [16, 16, 8]


def test_max_num_seqs_caps_running():
    kv, sched = make(budget=64, max_seqs=2)
    for i in range(4):
        add(sched, f"r{i}", 3)
    out = step(sched, kv)
    assert len(out.seqs) == 2 and len(sched.running) == 2 and len(sched.waiting) == 2


def test_preemption_of_newest_and_recovery():
    kv, sched = make(num_blocks=6, budget=64, max_seqs=8)
    seqs = [add(sched, f"r{i}", 7, max_tokens=8, base=100 * i) for i in range(3)]  # 2 blocks each
    step(sched, kv)  # prompts: 7 tokens each
    step(sched, kv)  # first decode fills position 7: still 2 blocks
    assert kv.num_free_blocks == 0
    out = step(sched, kv)  # every seq needs a 3rd block: the newest is preempted
    assert out.preempted == [seqs[2]]
    assert seqs[2].num_computed_tokens == 0 and seqs[2] in sched.waiting.preempted
    steps = 0
    while sched.has_unfinished():
        step(sched, kv)
        steps += 1
        assert steps < 200
    assert all(s.num_output_tokens == 8 for s in seqs)
    assert sched.num_preemptions >= 1
    assert kv.num_free_blocks == 6


def test_random_workload_never_deadlocks_or_drops():
    rng = random.Random(0)
    kv, sched = make(num_blocks=12, budget=12, max_seqs=6)  # 48 slots; every request fits alone
    seqs = [add(sched, f"r{i}", rng.randint(1, 30), max_tokens=rng.randint(1, 16), base=i * 50)
            for i in range(30)]
    for _ in range(2000):
        if not sched.has_unfinished():
            break
        step(sched, kv)
    assert not sched.has_unfinished()
    assert all(s.num_output_tokens == s.params.max_tokens for s in seqs)
    assert kv.num_free_blocks == 12 and sched.num_preemptions > 0


def test_round_robin_across_classes_no_starvation():
    kv, sched = make(budget=4, max_seqs=1)
    for i in range(6):
        add(sched, f"a{i}", 3, max_tokens=1, cls="tenant-a")
    late = add(sched, "b0", 3, max_tokens=1, cls="tenant-b")
    order = []
    while sched.has_unfinished():
        out = step(sched, kv)
        order += [s.request.request_id for s in out.seqs]
    assert order.index(late.request.request_id) <= 1  # not behind all of tenant-a
    assert order[0] == "a0" and sorted(order) == sorted(set(order))


def test_prefix_hit_stats_counted_once_per_request():
    kv, sched = make(budget=64)
    add(sched, "a", 9)
    step(sched, kv)
    add(sched, "b", 9)
    step(sched, kv)
    assert kv.prefix_lookup_tokens == 18 and kv.prefix_hit_tokens == 8


def test_prefix_shared_within_one_step():
    """A prompt admitted right after another with the same prefix shares the blocks the first
    one computes in the same forward (written before any attention reads them)."""
    kv, sched = make(budget=64)
    a = add(sched, "a", 10)
    b = add(sched, "b", 10)
    out = sched.schedule()
    assert out.seqs == [a, b] and out.num_new_tokens == [10, 2]
    assert kv.block_ids(a)[:2] == kv.block_ids(b)[:2]
    assert b.request.cached_prompt_tokens == 8
