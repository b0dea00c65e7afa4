"""Request and reservation ids (``gateway.ids``): unique, uuid4-shaped, never repeated by a fork."""

from __future__ import annotations

import os
import random
import re

from gateway.ids import new_hex_id


def test_ids_are_unique_and_uuid_shaped():
    ids = [new_hex_id() for _ in range(100_000)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids[:1000])


def test_seeding_the_global_random_does_not_repeat_ids():
    random.seed(1234)
    first = new_hex_id()
    random.seed(1234)
    assert new_hex_id() != first


def test_a_forked_worker_draws_other_ids():
    """uvicorn workers fork from one parent: each must draw its own sequence."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next ids, leave at once
        try:
            os.write(write, " ".join(new_hex_id() for _ in range(5)).encode())
        finally:
            os._exit(0)
    os.close(write)
    child = os.read(read, 4096).decode().split()
    os.close(read)
    os.waitpid(pid, 0)
    parent = [new_hex_id() for _ in range(5)]
    assert len(child) == 5 and not set(child) & set(parent)


def _untemper(y: int) -> int:
    y ^= y >> 18
    y ^= (y << 15) & 0xEFC60000
    x = y
    for _ in range(5):
        x = y ^ ((x << 7) & 0x9D2C5680)
    y = x
    x = y
    for _ in range(3):
        x = y ^ (x >> 11)
    return x & 0xFFFFFFFF


def test_the_next_id_cannot_be_rebuilt_from_earlier_ones():
    """Found by a security QA: ids came from one Mersenne Twister per process, whose state 156
    anonymous requests' ids gave away (624 32-bit outputs), and with it other tenants' next request
    and completion ids. Rebuilt that way now, the guess misses."""
    words = []
    for _ in range(156):
        value = int(new_hex_id(), 16)
        words += [(value >> (32 * k)) & 0xFFFFFFFF for k in range(4)]  # getrandbits(128): low word first
    clone = random.Random()
    clone.setstate((3, tuple(_untemper(w) for w in words) + (624,), None))
    assert f"{clone.getrandbits(128):032x}" != new_hex_id()


def test_threads_draw_other_ids():
    import threading

    out: list[list[str]] = [[], []]

    def draw(i: int) -> None:
        out[i] = [new_hex_id() for _ in range(5000)]

    threads = [threading.Thread(target=draw, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(out[0]) | set(out[1])) == 10_000
