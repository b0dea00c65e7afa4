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
