"""Listening on a Redis Pub/Sub channel for as long as a process runs: what the key-revocation
listener (``gateway.auth``) and the peer flush (``gateway.peer_flush``) share."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from redis.asyncio import Redis

RESUBSCRIBE_AFTER_S = 0.5


async def listen_forever(redis: Redis, channel: str, on_message: Callable[[bytes | str], None], *,
                         on_subscribed: Callable[[], None], on_lost: Callable[[Exception], None]) -> None:
    """Subscribe to ``channel`` and hand each message's data to ``on_message``, until cancelled.
    A lost connection is ``on_lost(exc)`` (messages may have been missed meanwhile), then the
    channel is subscribed again ``RESUBSCRIBE_AFTER_S`` later, and ``on_subscribed()`` each time."""
    while True:
        pubsub = redis.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(channel)
            on_subscribed()
            async for message in pubsub.listen():
                if message and message.get("type") == "message":
                    on_message(message["data"])
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - Redis away: said, and tried again
            on_lost(exc)
            await asyncio.sleep(RESUBSCRIBE_AFTER_S)
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()
