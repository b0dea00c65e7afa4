"""Asking every gateway process that shares this Redis to do its bookkeeping now, and waiting for
their answers: settle the requests that have ended (their settlements wait ``settle_delay_ms`` in
the aftercare) and, when asked, write the usage rows still in their journals to the database.

One process's view needs the others' work done in two places:

- a period counter rebuilt from the database (Redis flushed or restarted, a new period): the rows
  of requests the other processes settled while the counter was missing, still in their journals
  (written every ``usage_flush_interval_s``), were not in the sum, and the tenant could spend them
  again (found by QA: 11-16% over a budget with ``--workers 2`` and a FLUSHDB under load);
- a refusal while reservations are open: the requests another process has ended may hold them
  for its ``settle_delay_ms`` (found by QA: a client whose previous request ended on the other
  worker was told that requests in flight held its budget, on every other request).

``PUBLISH`` answers how many subscribers received the message: the asker waits for that many
answers, less its own, each an ``RPUSH`` on a list named by the message's token, for at most
``timeout_s``. The channel is named by the prefix and the Redis database number (Pub/Sub ignores
the database: found by QA, a deployment on another database of the same server received every
request and answered where the asker never looked, so each one waited its whole timeout). A process that cannot answer in time is not waited for past it (the counter is then
as right as before this existed). Processes that never subscribed (the admin CLI) are not asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis

from gateway.ids import new_hex_id
from gateway.log_throttle import LogThrottle
from gateway.pubsub import listen_forever

log = logging.getLogger("pagegate.peers")
_TROUBLE = LogThrottle()
_ACK_TTL_S = 30
PEERS_REMEMBERED_S = 600.0  # how long a peer that stopped listening is waited for (it may be re-subscribing)


class PeerFlush:
    """``await ask(usage=...)`` asks the other processes to run ``local(usage)`` and returns how
    many answered; ``start()`` subscribes this process so that it answers theirs."""

    def __init__(self, redis: Redis, prefix: str, local: Callable[[bool], Awaitable[None]],
                 on_rebuilt: Callable[[int, str], Awaitable[None]] | None = None) -> None:
        self._redis = redis
        # a counter another process has just rebuilt (tenant id, counter key): this process charges
        # its open reservations of it again (``QuotaLedger.adopt_rebuilt``) before it answers
        self.on_rebuilt = on_rebuilt
        db = redis.connection_pool.connection_kwargs.get("db", 0)
        self._channel = f"{prefix}peers:flush:db{db}"
        self._ack_prefix = f"{prefix}peers:ack:"
        self._local = local
        self._id = new_hex_id()
        self._listener: asyncio.Task | None = None
        self._subscribed = False
        self._answering: set[asyncio.Task] = set()
        self._peers_seen = (0, 0.0)  # (the most other processes an ask reached lately, when)

    async def start(self, timeout_s: float = 5.0) -> None:
        ready = asyncio.Event()
        self._listener = asyncio.ensure_future(self._listen(ready))
        with contextlib.suppress(TimeoutError):  # Redis slow to answer: the listener keeps trying
            await asyncio.wait_for(ready.wait(), timeout_s)

    async def close(self) -> None:
        tasks = [t for t in (self._listener, *self._answering) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._listener = None

    async def ask(self, *, usage: bool, timeout_s: float, rebuilt: tuple[int, str] | None = None) -> int:
        """How many other processes did it within ``timeout_s`` (0 when there are none). Fewer
        listening than an ask reached in the last ``PEERS_REMEMBERED_S``: they may be subscribing
        again (Redis restarted, the moment a rebuild needs their rows most: found by QA, a rebuilt
        counter missed another gateway's unwritten rows), so an ask for usage rows waits for them,
        within ``timeout_s``, before it is sent. ``rebuilt`` (tenant id, counter key): instead, ask
        them to charge their open reservations to that counter, just rebuilt (found by QA: they did
        it only at their next reservation of the tenant, and until then the rebuilt counter missed
        what they held: a two-gateway run spent 2,370 tokens of a 1,500 budget after a FLUSHDB)."""
        token = new_hex_id()
        ack_key = self._ack_prefix + token
        deadline = time.monotonic() + timeout_s
        try:
            seen, when = self._peers_seen
            if usage and seen and time.monotonic() - when < PEERS_REMEMBERED_S:
                while time.monotonic() < deadline:
                    (_, listening), = await self._redis.pubsub_numsub(self._channel)
                    if int(listening) - (1 if self._subscribed else 0) >= seen:
                        break
                    await asyncio.sleep(0.1)
            receivers = int(await self._redis.publish(
                self._channel, json.dumps({"from": self._id, "token": token, "usage": usage,
                                           "until": time.time() + timeout_s,
                                           **({"rebuilt": list(rebuilt)} if rebuilt else {})})))
            expected = receivers - (1 if self._subscribed else 0)
            if expected >= self._peers_seen[0] or time.monotonic() - self._peers_seen[1] >= PEERS_REMEMBERED_S:
                self._peers_seen = (max(expected, 0), time.monotonic())
            if expected <= 0:  # alone: nothing to wait for, and no list to remove
                return 0
            answered = 0
            while answered < expected:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                # (short waits: the connection's socket timeout must outlast each one)
                if await self._redis.blpop([ack_key], timeout=max(0.01, min(left, 0.5))) is not None:
                    answered += 1
            return answered
        except Exception as exc:  # noqa: BLE001 - best effort: the caller goes on with what it has
            _TROUBLE.log(log, logging.WARNING, "asking the other gateway processes to settle failed: %s: %s",
                         type(exc).__name__, exc)
            return 0
        finally:
            with contextlib.suppress(Exception):
                await self._redis.delete(ack_key)

    async def _listen(self, ready: asyncio.Event) -> None:
        def subscribed() -> None:
            self._subscribed = True
            ready.set()

        def lost(exc: Exception) -> None:
            self._subscribed = False
            _TROUBLE.log(log, logging.WARNING, "the peer flush listener lost Redis; retrying: %s: %s",
                         type(exc).__name__, exc)

        try:
            await listen_forever(self._redis, self._channel, self._answer, on_subscribed=subscribed, on_lost=lost)
        finally:
            self._subscribed = False

    def _answer(self, data: bytes | str) -> None:
        try:
            msg = json.loads(data)
            if msg.get("from") == self._id:
                return
            token, usage, until = str(msg["token"]), bool(msg.get("usage")), float(msg.get("until") or 0)
            rebuilt = msg.get("rebuilt")
            rebuilt = None if rebuilt is None else (int(rebuilt[0]), str(rebuilt[1]))
        except (ValueError, KeyError, TypeError, AttributeError, IndexError):
            return
        task = asyncio.ensure_future(self._do(token, usage, until, rebuilt))  # a slow database must not hold others
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)

    async def _do(self, token: str, usage: bool, until: float, rebuilt: tuple[int, str] | None = None) -> None:
        try:
            if rebuilt is None:
                await self._local(usage)
            elif self.on_rebuilt is not None:
                await self.on_rebuilt(*rebuilt)
        except Exception:  # noqa: BLE001 - answered all the same: the asker must not wait in vain
            log.exception("settling for another gateway process failed")
        if until and time.time() > until:  # the asker has stopped waiting: no answer left behind
            return
        key = self._ack_prefix + token
        with contextlib.suppress(Exception):
            async with self._redis.pipeline(transaction=False) as pipe:  # (cut short: its connection given back)
                pipe.rpush(key, self._id)
                pipe.expire(key, _ACK_TTL_S)
                await pipe.execute()
