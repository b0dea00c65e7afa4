"""Iteration-level scheduler: which sequences run in the next forward, and how many tokens each.

Every step has a token budget (``max_num_batched_tokens``) and a cap on running sequences
(``max_num_seqs``). Running sequences go first (decodes, or the next chunk of a long prefill),
in admission order; then waiting ones are admitted (prefills, chunked to the budget left),
round-robin across scheduling classes. Everything chosen runs in one flat varlen batch.

When the pool runs out of blocks, the most recently admitted running sequence is preempted:
its blocks are freed and it waits (ahead of new requests) to be recomputed from its tokens,
so its output is unaffected. A step that preempts admits nothing new.

Admission is fair across classes: a class whose next sequence finds no room this step (a long
prompt while the pool is busy) is passed over for the step and the other classes' sequences
that fit are admitted (one tenant's big request no longer holds every other tenant's short ones
back: a short request waited 16 s behind one). Within a class the order stays first come, first
served. So that a big sequence is not passed over for ever, once it has found no room for
``STARVATION_STEPS`` steps in a row nothing else is admitted until it fits.

Running slots are shared out too. Waiting classes are admitted least-served first (the class with
the fewest running sequences; round-robin among equals), and when every slot is taken while a
class waits with at least two fewer running sequences than another, that other class's newest
sequences yield their slots (``engine.slot_sharing``): preempted like memory victims, but waiting
at the front of their own class's queue.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from engine.kv_cache_manager import KVCacheManager
from engine.request import SeqStatus, Sequence
from engine.slot_sharing import FAIR_YIELDS_PER_STEP, plan_yields, running_per_class

__all__ = ["FAIR_YIELDS_PER_STEP", "STARVATION_STEPS", "Scheduler", "SchedulerOutput", "WaitingQueues"]


@dataclass(slots=True)
class SchedulerOutput:
    """The one record the model runner gets: sequences in batch order and their new tokens."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) copy-on-write
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def is_empty(self) -> bool:
        return not self.seqs


STARVATION_STEPS = 64  # a head passed over this many steps in a row blocks admission until it fits
_PREEMPTED = object()  # the preempted sequences' queue, tried before every class


class WaitingQueues:
    """FIFO per scheduling class, served round-robin; preempted sequences come before all."""

    def __init__(self) -> None:
        self.preempted: deque[Sequence] = deque()
        self.classes: OrderedDict[str | None, deque[Sequence]] = OrderedDict()

    def __len__(self) -> int:
        return len(self.preempted) + sum(len(q) for q in self.classes.values())

    def add(self, seq: Sequence) -> None:
        self.classes.setdefault(seq.request.priority_class, deque()).append(seq)

    def counts(self) -> dict[str | None, int]:
        """Waiting requests per class: those never admitted yet. A sequence waiting to be recomputed
        (preempted, or yielded to another class) belongs to a request already taken in (found by
        QA: a tenant whose ``n=4`` request's children yielded was refused as having 2 waiting)."""
        counts: dict[str | None, int] = {}
        for cls, q in self.classes.items():
            fresh = sum(1 for seq in q if not seq.num_preemptions)
            if fresh:
                counts[cls] = fresh
        return counts

    def add_preempted(self, seq: Sequence) -> None:
        self.preempted.appendleft(seq)  # victims come newest first: keep admission order

    def add_yielded(self, seq: Sequence) -> None:
        """A running sequence that gave its slot to another class: first in its own class's queue
        (it came before the class's waiting ones; yielded newest first, so admission order holds)."""
        cls = seq.request.priority_class
        q = self.classes.get(cls)
        if q is None:
            self.classes[cls] = q = deque()
            self.classes.move_to_end(cls, last=False)  # its turn in the round is not lost
        q.appendleft(seq)

    def peek(self, passed: set | None = None, running: dict | None = None) -> Sequence | None:
        """The next sequence to admit, skipping the queues in ``passed`` (``queue_of`` keys): the
        preempted ones first, then the head of the class with the fewest sequences in ``running``
        (running sequences per class), the first in the round among equals."""
        if self.preempted and (not passed or _PREEMPTED not in passed):
            return self.preempted[0]
        best, fewest = None, None
        for cls, q in self.classes.items():
            if q and (not passed or cls not in passed):
                held = running.get(cls, 0) if running else 0
                if fewest is None or held < fewest:
                    best, fewest = q[0], held
                    if not held:
                        break
        return best

    def queue_of(self, seq: Sequence) -> object:
        """The key of the queue ``seq`` (a sequence ``peek`` returned) heads."""
        return _PREEMPTED if self.preempted and self.preempted[0] is seq else seq.request.priority_class

    def pop(self, seq: Sequence) -> None:
        """Remove ``seq`` (the one ``peek`` returned); its class moves to the back of the round."""
        if self.preempted and self.preempted[0] is seq:
            self.preempted.popleft()
            return
        cls = seq.request.priority_class
        self.classes[cls].popleft()
        if self.classes[cls]:
            self.classes.move_to_end(cls)
        else:
            del self.classes[cls]

    def remove(self, seq: Sequence) -> None:
        if seq in self.preempted:
            self.preempted.remove(seq)
            return
        q = self.classes.get(seq.request.priority_class)
        if q is not None and seq in q:
            q.remove(seq)
            if not q:
                del self.classes[seq.request.priority_class]


class Scheduler:
    def __init__(
        self, kv: KVCacheManager, *, max_num_batched_tokens: int, max_num_seqs: int
    ) -> None:
        self.kv = kv
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.waiting = WaitingQueues()
        self.running: list[Sequence] = []  # admission order: the last is preempted first
        self.num_preemptions = 0
        self.num_yields = 0  # of those, slots given to a less-served class

    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self.waiting.add(seq)

    def add_running(self, seq: Sequence, after: Sequence) -> None:
        """Place a freshly forked child (its blocks already shared) right after its parent."""
        seq.status = SeqStatus.RUNNING
        self.running.insert(self.running.index(after) + 1, seq)

    def has_unfinished(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        # Decodes first, then the prefills in progress (a stable partition: admission order kept in
        # each part; the last, a prefill, is preempted first). The prefills in progress take at most
        # half the step while requests wait (found by QA: another tenant's 8,000-token prompt took
        # the whole 512-token step for every step of its prefill, and a short request waited 41-81 s
        # for its first token, the running decodes crawled).
        self.running.sort(key=_prefilling)
        held = self._share_slots()
        # prefills in progress together: at most half the step while requests wait (found by a
        # re-check: two long prompts at half each took the whole step again)
        prefill_room = max(1, self.max_num_batched_tokens // 2) if len(self.waiting) else budget
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if n > 1:
                n = min(n, prefill_room)
                if n < 1:  # this step's prefill room is used: it goes on next step
                    i += 1
                    continue
                prefill_room -= n
            while not self.kv.allocate_slots(seq, n):
                victim = self.running.pop()
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            else:
                self.kv.cache_full_blocks(seq, seq.num_computed_tokens + n)
                out.seqs.append(seq)
                out.num_new_tokens.append(n)
                budget -= n
                i += 1
                continue
            break

        passed: set = set()  # queues whose head found no room this step
        while not out.preempted and budget > 0:
            full = len(self.running) >= self.max_num_seqs
            if full and not self._alone(held):
                break
            seq = self.waiting.peek(passed, held)
            if seq is None or (full and seq.index == 0):
                break
            # (full: the child of an ``n > 1`` request that yielded its slot comes back past
            # ``max_num_seqs``, as it was forked, once its class is the only one running and waiting;
            # found by a re-check, an ``n=12`` request in 4 slots took 593 steps instead of 200 after
            # one short request of another tenant)
            # (a prompt whose logprobs are asked is computed whole: no logits for cached positions)
            computed = [] if seq.request.scores_prompt else self.kv.get_computed_blocks(seq)
            num_cached = len(computed) * self.kv.block_size
            n = min(seq.num_tokens - num_cached, budget)
            if not self.kv.allocate_slots(seq, n, computed):
                seq.steps_blocked += 1
                if seq.steps_blocked >= STARVATION_STEPS:
                    break  # it has waited long enough: the room that frees up is kept for it
                # pass its queue over for this step; a preempted sequence's class too, so that its
                # own newer requests do not go in ahead of it (first come, first served per class)
                passed.update((self.waiting.queue_of(seq), seq.request.priority_class))
                continue
            seq.steps_blocked = 0
            self.waiting.pop(seq)
            if seq.num_preemptions == 0 and seq.index == 0:
                self.kv.record_prefix_lookup(seq.num_tokens, num_cached)
                seq.request.cached_prompt_tokens = num_cached
            seq.num_computed_tokens = num_cached
            self.kv.cache_full_blocks(seq, num_cached + n)
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            cls = seq.request.priority_class
            held[cls] = held.get(cls, 0) + 1
            out.seqs.append(seq)
            out.num_new_tokens.append(n)
            budget -= n

        out.block_copies = self.kv.take_pending_copies()
        return out

    def _share_slots(self) -> dict:
        """Running sequences per class, after the yields ``slot_sharing.plan_yields`` decides (the
        module's docstring)."""
        held = running_per_class(self.running)
        for victim in plan_yields(self.running, held, self.waiting, kv=self.kv, max_num_seqs=self.max_num_seqs,
                                  max_num_batched_tokens=self.max_num_batched_tokens):
            self.running.remove(victim)
            self._free_for_recompute(victim)
            self.num_yields += 1
            self.waiting.add_yielded(victim)
            held[victim.request.priority_class] -= 1
        return held

    def _alone(self, held: dict) -> bool:
        """Only one class waits (none preempted) and no other class runs."""
        if self.waiting.preempted or len(self.waiting.classes) != 1:
            return False
        (cls,) = self.waiting.classes
        return all(n == 0 or c == cls for c, n in held.items())

    def _free_for_recompute(self, seq: Sequence) -> None:
        self.kv.free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = SeqStatus.WAITING
        self.num_preemptions += 1

    def _preempt(self, seq: Sequence) -> None:
        self._free_for_recompute(seq)
        self.waiting.add_preempted(seq)

    def finish(self, seq: Sequence) -> None:
        """Drop a finished or aborted sequence wherever it is and free its blocks at once."""
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SeqStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = SeqStatus.FINISHED
        self.kv.free(seq)


def _prefilling(seq: Sequence) -> bool:
    """Whether ``seq`` still has more than its next token to compute (a prefill in progress)."""
    return seq.num_tokens - seq.num_computed_tokens > 1
