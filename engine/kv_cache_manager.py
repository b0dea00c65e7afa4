"""Per-sequence block tables on top of the ``BlockPool``: on-demand allocation, prefix-cache
lookup, copy-on-write forks and frees.

    seq.token_ids   t0 .. t15 | t16 .. t31 | t32 t33 _ _ ...
    block table     [   7     ,     3      ,     12        ]     (block_size 16)
    slot of t33 = 12 * 16 + 1

Only full blocks are hashed and shared through the prefix cache; a partially filled block is
shared only between a parent and its forked children, and is copied by the first of them that
writes into it (the copy is queued in ``pending_copies`` for the model runner).
"""

from __future__ import annotations

from engine.block_pool import BlockHash, BlockPool, KVBlock, hash_block_tokens
from engine.request import SeqId, Sequence


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, enable_caching)
        self.enable_caching = enable_caching
        self.tables: dict[SeqId, list[KVBlock]] = {}
        self.seqs: dict[SeqId, Sequence] = {}
        self._num_hashed: dict[SeqId, int] = {}  # leading blocks of the seq already registered
        self.pending_copies: list[tuple[int, int]] = []  # (src block, dst block) to copy before the forward
        self.prefix_lookup_tokens = 0
        self.prefix_hit_tokens = 0

    # ---- lookup -------------------------------------------------------------------------
    def _block_hashes(self, seq: Sequence, num_blocks: int) -> list[BlockHash]:
        """The chain hashes of the sequence's first ``num_blocks`` full blocks (memoized on it)."""
        hashes, bs, ids = seq.block_hashes, self.block_size, seq.token_ids
        salt = seq.request.salt
        while len(hashes) < num_blocks:
            i = len(hashes)
            hashes.append(hash_block_tokens(hashes[-1] if hashes else None, ids[i * bs : (i + 1) * bs], salt))
        return hashes

    def get_computed_blocks(self, seq: Sequence) -> list[KVBlock]:
        """Leading full blocks of a waiting sequence already in the cache. At least one token is
        always left to compute (its logits are needed)."""
        if not self.enable_caching:
            return []
        max_blocks = (seq.num_tokens - 1) // self.block_size
        hits: list[KVBlock] = []
        for h in self._block_hashes(seq, max_blocks):
            block = self.pool.lookup(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def record_prefix_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Count one admitted prompt's lookup in the prefix-hit statistics."""
        self.prefix_lookup_tokens += num_tokens
        self.prefix_hit_tokens += num_hit_tokens

    # ---- allocation ---------------------------------------------------------------------
    def allocate_slots(
        self, seq: Sequence, num_new_tokens: int, computed_blocks: list[KVBlock] | None = None
    ) -> bool:
        """Make the block table cover ``computed + num_new_tokens`` tokens, where ``computed`` is
        ``seq.num_computed_tokens`` plus the prefix-cache hits given (``computed_blocks``, for a
        sequence being admitted). Returns False, changing nothing, when the pool is short."""
        computed_blocks = computed_blocks or []
        table = self.tables.get(seq.seq_id)
        if table is None:
            table = []
        bs = self.block_size
        num_computed = seq.num_computed_tokens + len(computed_blocks) * bs
        have = len(table) + len(computed_blocks)
        need_new = max(0, -(-(num_computed + num_new_tokens) // bs) - have)
        cow = bool(table) and num_computed % bs != 0 and table[-1].ref_cnt > 1 and num_new_tokens > 0
        revive = sum(1 for b in computed_blocks if b.ref_cnt == 0)
        if need_new + int(cow) + revive > self.pool.num_free:
            return False
        if seq.seq_id not in self.tables:
            self.tables[seq.seq_id] = table
            self.seqs[seq.seq_id] = seq
            self._num_hashed[seq.seq_id] = 0
        if computed_blocks:
            self.pool.touch(computed_blocks)
            table.extend(computed_blocks)
            self._num_hashed[seq.seq_id] = len(table)
        if cow:
            (copy,) = self.pool.allocate(1)
            self.pending_copies.append((table[-1].block_id, copy.block_id))
            self.pool.free([table[-1]])
            table[-1] = copy
        if need_new:
            table.extend(self.pool.allocate(need_new))
        return True

    def cache_full_blocks(self, seq: Sequence, num_tokens: int) -> None:
        """Register the sequence's full blocks among its first ``num_tokens`` tokens in the prefix
        cache. Called at scheduling time for the tokens of the coming forward: within one forward
        every layer writes all new K/V before any attention reads, so a sequence admitted later
        in the same step may already share these blocks."""
        if not self.enable_caching:
            return
        num_full = num_tokens // self.block_size
        start = self._num_hashed.get(seq.seq_id, 0)
        if num_full <= start:
            return
        table = self.tables[seq.seq_id]
        hashes = self._block_hashes(seq, num_full)
        for i in range(start, num_full):
            self.pool.cache_block(table[i], hashes[i])
        self._num_hashed[seq.seq_id] = num_full

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Give ``child`` the parent's blocks by reference (copy-on-write on the last one)."""
        table = self.tables[parent.seq_id]
        self.pool.touch(table)
        self.tables[child.seq_id] = list(table)
        self.seqs[child.seq_id] = child
        self._num_hashed[child.seq_id] = self._num_hashed[parent.seq_id]
        child.block_hashes = list(parent.block_hashes)

    def free(self, seq: Sequence) -> None:
        """Release every block of the sequence now (tail first). Idempotent."""
        table = self.tables.pop(seq.seq_id, None)
        self.seqs.pop(seq.seq_id, None)
        self._num_hashed.pop(seq.seq_id, None)
        if table:
            self.pool.free(table[::-1])

    def take_pending_copies(self) -> list[tuple[int, int]]:
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def num_exclusive_blocks(self, seq: Sequence) -> int:
        """Blocks that freeing ``seq`` would return to the pool (those no other sequence holds)."""
        return sum(1 for block in self.tables.get(seq.seq_id, ()) if block.ref_cnt == 1)

    def block_ids(self, seq: Sequence) -> list[int]:
        return [b.block_id for b in self.tables.get(seq.seq_id, ())]

    # ---- measurements -------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_used

    @property
    def usage(self) -> float:
        """Fraction of the pool's blocks owned by live sequences."""
        return self.pool.num_used / self.pool.num_blocks

    def utilization(self) -> float:
        """Tokens held / slots of the allocated blocks (a shared block counts once, as full as
        its fullest owner). 1.0 when nothing is allocated."""
        bs = self.block_size
        fill: dict[int, int] = {}
        for seq_id, table in self.tables.items():
            n = self.seqs[seq_id].num_computed_tokens
            for i, block in enumerate(table):
                f = min(bs, max(0, n - i * bs))
                if f > fill.get(block.block_id, -1):
                    fill[block.block_id] = f
        if not fill:
            return 1.0
        return sum(fill.values()) / (len(fill) * bs)

    @property
    def prefix_hit_rate(self) -> float:
        if self.prefix_lookup_tokens == 0:
            return 0.0
        return self.prefix_hit_tokens / self.prefix_lookup_tokens
