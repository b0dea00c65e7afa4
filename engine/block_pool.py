"""The pool of fixed-size KV blocks: reference counts, chain hashes and an LRU free queue.

A block holds the K/V of ``block_size`` consecutive tokens of one or more sequences (shared
blocks have ``ref_cnt > 1``). A *full* block may carry a chain hash::

    hash(block i) = H(hash(block i-1) | token ids of block i | salt)

so equal hashes mean equal prefixes (same salt). Freed blocks keep their hash and sit in an
LRU free queue; a later request can revive them (a prefix-cache hit) until the memory is
reallocated, at which point the hash is evicted.

    free queue:  [least recently freed ... most recently freed]
                  ^ allocate() takes from here (evicting its hash)
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import NewType

BlockHash = NewType("BlockHash", bytes)


def hash_block_tokens(parent: BlockHash | None, token_ids: list[int], salt: str | None) -> BlockHash:
    """Chain hash of one full block. A keyed cryptographic digest (not Python's ``hash``) so that
    one tenant cannot craft a collision with another tenant's prefix."""
    h = hashlib.blake2b(digest_size=16)
    h.update(parent or b"\x00")
    h.update(array("q", token_ids).tobytes())
    if salt is not None:
        h.update(b"\x01" + salt.encode())
    return BlockHash(h.digest())


@dataclass(slots=True)
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None


class BlockPool:
    """Owns every block of the KV pool.

    Invariants: a block is in the free queue iff ``ref_cnt == 0``; ``cached`` maps a hash to the
    one block holding it (free or in use).
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, KVBlock] = OrderedDict((b.block_id, b) for b in self.blocks)
        self.cached: dict[BlockHash, KVBlock] = {}

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_queue)

    def allocate(self, n: int) -> list[KVBlock]:
        """Take ``n`` blocks from the LRU end of the free queue (ref count 1, hash evicted).
        Raises ``ValueError`` when fewer than ``n`` are free (callers check ``num_free`` first)."""
        if n > len(self.free_queue):
            raise ValueError(f"cannot allocate {n} blocks, {len(self.free_queue)} free")
        out = []
        for _ in range(n):
            _, block = self.free_queue.popitem(last=False)
            if block.block_hash is not None:
                if self.cached.get(block.block_hash) is block:
                    del self.cached[block.block_hash]
                block.block_hash = None
            block.ref_cnt = 1
            out.append(block)
        return out

    def lookup(self, block_hash: BlockHash) -> KVBlock | None:
        """The block holding this hash, free or in use, or None."""
        return self.cached.get(block_hash) if self.enable_caching else None

    def touch(self, blocks: list[KVBlock]) -> None:
        """Take one more reference on each block (reviving it from the free queue if needed)."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self.free_queue[block.block_id]
            block.ref_cnt += 1

    def free(self, blocks: list[KVBlock]) -> None:
        """Drop one reference on each block. Pass a sequence's blocks in reverse order so its tail
        is evicted before its head (the head is likelier to be a shared prefix)."""
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue[block.block_id] = block
            elif block.ref_cnt < 0:
                raise RuntimeError(f"block {block.block_id} freed twice")

    def cache_block(self, block: KVBlock, block_hash: BlockHash) -> None:
        """Register a just-filled block under its hash. If another block already holds the same
        content, this one stays unhashed (both remain valid; the first one keeps serving hits)."""
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self.cached:
            return
        block.block_hash = block_hash
        self.cached[block_hash] = block

    def reset_prefix_cache(self) -> None:
        """Forget every hash (blocks in use keep their contents)."""
        for block in self.cached.values():
            block.block_hash = None
        self.cached.clear()
