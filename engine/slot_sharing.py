"""Fair running slots: which running sequences give their slot to a less-served class this step.

The scheduler admits waiting classes least-served first, which shares out slots as they free up.
A class can still hold every slot for as long as its sequences run (one tenant's long answers);
then, while another class waits holding at least two fewer, the holder's newest sequences yield:
the scheduler frees them for recompute and queues them first in their own class, and the slot
goes to the class that has less. Decided here, at the start of a step, before anything is
scheduled::

    running per class ──► plan_yields ──► victims (newest first per class) ──► Scheduler frees them

The counts end within one of each other, so nothing swaps back and forth. Nothing yields while a
slot is free (admission gives it to the least-served class anyway), while a memory-preempted
sequence waits (the pool is what is short then: a yielded slot came straight back every step), or
for a class whose next sequence would find no room in the pool even with the yielding sequences'
blocks. Children of an ``n > 1`` request run at once, past ``max_num_seqs`` if need be; the
yields that free one slot are then decided together or not at all (one at a time, each child
yielded in turn and the other class still waited).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

from engine.kv_cache_manager import KVCacheManager
from engine.request import Sequence

if TYPE_CHECKING:
    from engine.scheduler import WaitingQueues

FAIR_YIELDS_PER_STEP = 8  # running sequences that give their slot to a less-served class, per step (past the first slot's)


def running_per_class(running: Seq[Sequence]) -> dict:
    held: dict = {}
    for seq in running:
        cls = seq.request.priority_class
        held[cls] = held.get(cls, 0) + 1
    return held


def plan_yields(running: Seq[Sequence], held: dict, waiting: WaitingQueues, *, kv: KVCacheManager,
                max_num_seqs: int, max_num_batched_tokens: int) -> list[Sequence]:
    """The running sequences to yield this step, at most ``FAIR_YIELDS_PER_STEP``; ``held``:
    ``running_per_class(running)``. Changes nothing."""
    short = len(running) - max_num_seqs + 1  # yields before one slot is free
    if short < 1 or waiting.preempted or not waiting.classes:
        return []
    top = max(held.values())  # no class holds two more than a waiting one: nothing to do (the usual case)
    if not any(held.get(cls, 0) <= top - 2 for cls, q in waiting.classes.items() if q):
        return []
    want = {cls: len(q) for cls, q in waiting.classes.items() if q}  # waiting per class
    share = dict(held)  # the slots as they will be once admission has run
    room = kv.num_free_blocks
    plan: list[Sequence] = []
    picked: set[int] = set()
    while want and len(plan) < FAIR_YIELDS_PER_STEP:
        taker = min(want, key=lambda c: share.get(c, 0))
        head = waiting.classes[taker][0]
        need = -(-min(head.num_tokens, max_num_batched_tokens) // kv.block_size)
        batch: list[Sequence] = []  # the yields that free one slot for ``taker``
        freed = 0
        for _ in range(short):
            giver = max(share, key=share.__getitem__)
            victim = None
            # (the first slot's yields are not capped: children far past the cap need more than the
            # cap to free one, and capped they never did; found by QA, n=12 in 4 slots starved others)
            if share[giver] >= share.get(taker, 0) + 2 and (not plan or len(plan) + len(batch) < FAIR_YIELDS_PER_STEP):
                victim = next((s for s in reversed(running) if s.request.priority_class == giver
                               and id(s) not in picked), None)
            if victim is None:
                break
            batch.append(victim)
            picked.add(id(victim))
            share[giver] -= 1
            freed += kv.num_exclusive_blocks(victim)
        if len(batch) < short or need > room + freed:  # no slot, or one its head could not use
            for victim in batch:
                share[victim.request.priority_class] += 1
                picked.discard(id(victim))
            if len(batch) == short:  # only this class's head does not fit: try the others
                del want[taker]
                continue
            break
        room += freed - need
        plan += batch
        short = 1
        share[taker] = share.get(taker, 0) + 1
        want[taker] -= 1
        if not want[taker]:
            del want[taker]
    return plan
